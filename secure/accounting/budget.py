"""The release decision and a session's privacy budget: the state apart from the maths.

:func:`decide_release` is the one answer to "may this release go out?": the aggregation service
(through ``secure.privacy.SessionPrivacy.release_allowed``), the in-process trainer (through a
:class:`PrivacyBudget`) and the data owner's worker (``clients.policy.ReleaseGate``, against each
of its policy's caps) all ask it. :class:`PrivacyBudget` is the in-memory, serialisable count of
one session's releases against its caps, like an Opacus accountant: a few numbers fixed, a
count, and :mod:`secure.accounting.analysis` for every epsilon.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, cast

from secure.accounting import analysis
from secure.accounting.analysis import (
    AccountantName,
    check_accountant,
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_releases,
    check_sample_rate,
)

#: Why a release is refused: past the cap on the number of releases, or over the epsilon cap.
Refusal = Literal["max_releases", "epsilon"]


def count_releases(count: int) -> str:
    """A number of releases for people: "1 release", "3 releases"."""
    return f"{count} release{'' if count == 1 else 's'}"


class ReleaseRefused(RuntimeError):
    """One more release would take the session past its epsilon target or its release cap."""


@dataclass(frozen=True)
class ReleaseDecision:
    """Whether the next release may go out. ``epsilon`` is the spend once it is out (inf when
    the accountant cannot evaluate it), ``refusal`` why it may not (None: it may)."""

    epsilon: float
    refusal: Refusal | None = None

    @property
    def allowed(self) -> bool:
        return self.refusal is None


def decide_release(
    *,
    noise_multiplier: float,
    releases: int,
    delta: float,
    accountant: AccountantName = "rdp",
    sample_rate: float = 1.0,
    epsilon_cap: float | None,
    max_releases: int | None = None,
) -> ReleaseDecision:
    """May release number ``releases`` go out, ``releases`` Gaussian releases with multiplier
    ``noise_multiplier`` in all once it is out? Refused past ``max_releases`` releases, or when
    epsilon at ``delta`` would exceed ``epsilon_cap``. An epsilon the accountant cannot evaluate
    (an ``AccountingError``, an overflow) counts as infinite: refused by any cap; invalid
    parameters raise ``ValueError``.

    Releases with different multipliers z_i (the owner's worker, across sessions) are one
    release (``releases=1``) of ``analysis.composed_noise_multiplier(sum 1 / z_i^2)``.
    """
    z = check_noise_multiplier(noise_multiplier)
    count = check_releases(releases, minimum=1)
    d = check_delta(delta)
    acc = cast(AccountantName, check_accountant(accountant))
    q = check_sample_rate(sample_rate)
    cap = None if epsilon_cap is None else check_epsilon(epsilon_cap, "epsilon_cap")
    try:
        epsilon = analysis.epsilon_after(
            noise_multiplier=z, releases=count, delta=d, accountant=acc, sample_rate=q
        )
    # the parameters are valid: a ValueError is the accountant's (AccountingError, or
    # dp-accounting's own on extreme parameters)
    except (ValueError, ArithmeticError):
        epsilon = math.inf
    if max_releases is not None and count > max_releases:
        return ReleaseDecision(epsilon, "max_releases")
    if cap is not None and not epsilon <= cap:
        return ReleaseDecision(epsilon, "epsilon")
    return ReleaseDecision(epsilon)


#: The parameters that fix a budget's epsilon after any number of releases.
_MECHANISM = ("noise_multiplier", "delta", "accountant", "sample_rate")


@dataclass(kw_only=True)
class PrivacyBudget:
    """One session's releases against its caps: (z, delta, accountant, sample rate) fixed, the
    releases counted so far, an optional epsilon target and release cap that
    :meth:`record_release` enforces with :func:`decide_release`.

    Store :meth:`to_dict` durably *after* :meth:`record_release` returns and *before* the
    release is served; a crash in between over-counts, which is the safe direction. Every
    epsilon evaluation is cached.

    When the noise is shared between clients, construct the budget with
    ``secure.dp.effective_noise_multiplier(...)``, not with the per-sum multiplier.
    """

    SCHEMA_VERSION: ClassVar[int] = 1
    _KEYS_REQUIRED: ClassVar[tuple[str, ...]] = (
        "noise_multiplier",
        "delta",
        "accountant",
        "releases",
    )

    noise_multiplier: float
    delta: float
    accountant: AccountantName = "rdp"
    epsilon_target: float | None = None
    sample_rate: float = 1.0
    max_releases: int | None = None
    releases: int = 0  # releases recorded so far
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.noise_multiplier = check_noise_multiplier(self.noise_multiplier)
        self.delta = check_delta(self.delta)
        self.accountant = cast(AccountantName, check_accountant(self.accountant))
        if self.epsilon_target is not None:
            self.epsilon_target = check_epsilon(self.epsilon_target, "epsilon_target")
        self.sample_rate = check_sample_rate(self.sample_rate)
        if self.max_releases is not None:
            self.max_releases = check_releases(self.max_releases, minimum=1)
        self.releases = check_releases(self.releases)

    def _mechanism(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _MECHANISM}

    # -- accounting --------------------------------------------------------------------------
    def epsilon_at(self, releases: int) -> float:
        """Epsilon after ``releases`` releases under this budget's parameters."""
        return analysis.epsilon_after(releases=releases, **self._mechanism())

    @property
    def epsilon(self) -> float:
        """Epsilon spent by the recorded releases (at this budget's delta)."""
        return self.epsilon_at(self.releases)

    def next_release(self) -> ReleaseDecision:
        """Whether one more release may go out (:func:`decide_release`)."""
        return decide_release(
            releases=self.releases + 1,
            epsilon_cap=self.epsilon_target,
            max_releases=self.max_releases,
            **self._mechanism(),
        )

    def would_exceed(self) -> bool:
        """True if one more release would take the session past a cap (never without one)."""
        return not self.next_release().allowed

    def remaining_releases(self) -> int | None:
        """How many more releases fit in the caps (None without a cap)."""
        caps = [] if self.max_releases is None else [self.max_releases]
        if self.epsilon_target is not None:
            caps.append(analysis.max_releases(epsilon=self.epsilon_target, **self._mechanism()))
        return max(0, min(caps) - self.releases) if caps else None

    def record_release(self) -> float:
        """Count one release and return the new epsilon.

        Raises :class:`ReleaseRefused` (and records nothing) if the release would take the
        session past a cap.
        """
        with self._lock:
            decision = self.next_release()
            if decision.refusal == "max_releases":
                raise ReleaseRefused(
                    f"privacy budget exhausted: release {self.releases + 1} would pass the cap"
                    f" of {count_releases(self.max_releases)}"
                )
            if decision.refusal == "epsilon":
                raise ReleaseRefused(
                    f"privacy budget exhausted: release {self.releases + 1} would bring "
                    f"epsilon to {decision.epsilon:.4g} > target {self.epsilon_target:.4g} at "
                    f"delta={self.delta:g} (noise multiplier {self.noise_multiplier:.4g}, "
                    f"{self.accountant} accountant); {count_releases(self.releases)} so far spent "
                    f"epsilon {self.epsilon:.4g}"
                )
            self.releases += 1
            return decision.epsilon

    # -- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible record. ``epsilon`` is informational (None if infinite);
        :meth:`from_dict` recomputes it from the parameters."""
        eps = self.epsilon
        return {
            "schema": self.SCHEMA_VERSION,
            "mechanism": "gaussian",
            **{f.name: getattr(self, f.name) for f in fields(self) if f.init},
            "epsilon": eps if math.isfinite(eps) else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyBudget:
        """Rebuild a budget from :meth:`to_dict` output (or from the bare parameters)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping, got {type(data).__name__}")
        parameters = [f.name for f in fields(cls) if f.init]
        missing = [k for k in cls._KEYS_REQUIRED if k not in data]
        if missing:
            raise ValueError(f"privacy budget record is missing {missing}")
        unknown = sorted(set(data) - {*parameters, "schema", "mechanism", "epsilon"})
        if unknown:
            raise ValueError(f"privacy budget record has unknown keys {unknown}")
        schema = data.get("schema", cls.SCHEMA_VERSION)
        if schema != cls.SCHEMA_VERSION:
            raise ValueError(f"unsupported privacy budget schema {schema!r}")
        if data.get("mechanism", "gaussian") != "gaussian":
            raise ValueError(f"unsupported mechanism {data['mechanism']!r}")
        for key in ("noise_multiplier", "delta", "sample_rate", "epsilon_target"):
            value = data.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise TypeError(f"{key} must be a number, got {type(value).__name__}")
        return cls(**{name: data[name] for name in parameters if name in data})
