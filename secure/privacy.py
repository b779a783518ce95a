"""One session's differential-privacy plan: pure, torch-free, and the only place that decides.

The in-process trainer, the HTTP worker and the aggregation service all build a
:class:`SessionPrivacy` from the same public parameters and ask it the same questions: the z in
use (given, or calibrated so that every planned release fits the epsilon target), the
sensitivity (derived here from the clip, the occurrence cap and the release's kind and degree
floor, never taken from a caller), the z the ledger composes, each client's noise std, whether
one more release fits, epsilon after n releases, and the privacy report. Every pass of a
session is one Gaussian release at :data:`RELEASE_LAYER` (docs/privacy.md).

With ``shared_noise`` every client adds only 1/M of the variance, so a peer that subtracts its
own share faces less noise: the ledger then composes ``secure.dp.effective_noise_multiplier``,
and a calibrated z is scaled up to compensate.

With ``split_noise`` (under pairwise masks, docs/privacy.md section 11) each of M >= 3 clients
adds a discrete Gaussian of std z Delta_g / sqrt(M - 1) on the share grid (Delta_g: the
sensitivity on the grid, which needs the release's width), so the sum less any one share still
carries (z Delta_g)^2: the ledger composes z itself (one curious peer, the service with one
peer) and a calibrated z needs no factor. Its accounting is Kairouz et al.'s Renyi bound
(``secure.split_noise``), so the PRV accountant is refused, and so is a split whose shares are
so small on the grid that the bound's tau term is not 0 (the ledger's Gaussian composition is
then exact).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from secure.accounting import (
    ACCOUNTANTS,
    AccountantName,
    PrivacyBudget,
    calibrate_session_noise_multiplier,
    epsilon_after,
)
from secure.dp import (
    DEFAULT_DEGREE_FLOOR,
    RELEASE_KINDS,
    ReleaseKind,
    affected_rows,
    degree_normalised_sensitivity,
    effective_noise_multiplier,
    node_sensitivity,
    per_client_noise_std,
)
from secure.split_noise import (
    AdversaryEpsilons,
    SplitNoise,
    SplitNoiseError,
    adversary_epsilons,
    grid_sensitivity,
    split_noise_std,
)
from secure.split_session import (
    check_split_session,
    session_split,
    split_adversary_rows,
    split_report,
)

#: The graph layer whose (noisy) output is a session's only release (models/private.py).
RELEASE_LAYER = 1

NoiseMultiplierSource = Literal["given", "calibrated"]


#: The session's own settings; ``clients``, ``passes_total`` and ``encrypted`` come from the rest
#: of the session.
_SETTINGS = (
    "epsilon",
    "delta",
    "noise_multiplier",
    "noise_multiplier_source",
    "clip",
    "occurrence_cap",
    "accountant",
    "shared_noise",
    "split_noise",
    "max_releases",
    "release",
    "degree_floor",
)


#: What one unit of privacy protects, and what the mechanism does not hide.
PRIVACY_UNIT = "one node's feature row at one client (replace-one)"
NOT_PROTECTED = (
    "the graph's edges (each client samples its own; node sets travel in the clear)",
    "node ids and which nodes each pass samples",
    "labels and the train/validation/test split (the session's public parameters)",
)


@dataclass(frozen=True)
class Adversary:
    adversary: str
    noise_multiplier: float | None  # the z it faces; None: it sees no release
    note: str
    # stable across M (the names say M): "service", "peer", "service_peer" (split noise only),
    # "colluding", "group"
    key: str = ""


class PrivacyPlanError(ValueError):
    """The privacy parameters cannot make a session: the message says which and why."""


def release_sensitivity(
    *,
    clip: float,
    occurrence_cap: int,
    release: ReleaseKind = "clip-after",
    degree_floor: int = DEFAULT_DEGREE_FLOOR,
) -> float:
    """Delta of one client's layer-1 release to one node's features: 2C sqrt(c + 1) clipped
    after the aggregation, 2C sqrt(c + 1) / d_min degree-normalised (docs/privacy.md 3.7)."""
    if release == "degree-normalised":
        return degree_normalised_sensitivity(
            clip=clip, occurrence_cap=occurrence_cap, degree_floor=degree_floor
        )
    return node_sensitivity(clip=clip, occurrence_cap=occurrence_cap, depth=RELEASE_LAYER)


def release_fields(release: ReleaseKind, degree_floor: int) -> dict[str, Any]:
    """The release settings as a request or a manifest writes them: none for the clip-after
    release (everyone's default, so what was written before stays as it was), the kind and
    d_min for a degree-normalised one."""
    if release == "clip-after":
        return {}
    return {"release": release, "degree_floor": degree_floor}


@dataclass(frozen=True, kw_only=True)
class SessionPrivacy:
    """The privacy of one session of ``clients`` clients and ``passes_total`` passes.

    Build it with :meth:`plan` (which fills in a calibrated z); construct it directly only to
    restore one whose z was already chosen (``noise_multiplier`` and its source as stored).
    """

    epsilon: float | None  # the target: caps the ledger (and calibrates z when none was given)
    delta: float
    noise_multiplier: float  # z: the noise std of the sum is z * sensitivity
    noise_multiplier_source: NoiseMultiplierSource
    clip: float
    occurrence_cap: int
    accountant: AccountantName = "rdp"
    shared_noise: bool = False
    split_noise: bool = False  # each of M >= 3 adds z Delta_g / sqrt(M - 1) (under masks)
    max_releases: int | None = None
    release: ReleaseKind = "clip-after"  # how the layer-1 release is formed (dp.ReleaseKind)
    degree_floor: int = DEFAULT_DEGREE_FLOOR  # d_min of the degree-normalised release
    clients: int
    passes_total: int
    encrypted: bool  # whether the service adds ciphertexts (it then sees no single share)
    # whether the shares are pairwise-masked (docs/secure-aggregation.md): only then does the
    # service with one colluding peer read no single share
    masked: bool = False
    # a scoring session of a kept release (the private sign design, docs/privacy.md 3.8): its
    # pass is post-processing of each sender's one release, so it plans none
    post_processing: bool = False

    def __post_init__(self) -> None:
        if self.epsilon is not None and not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise PrivacyPlanError(f"epsilon must be a finite number > 0, got {self.epsilon}")
        if not 0.0 < self.delta < 1.0:
            raise PrivacyPlanError(f"delta must be in (0, 1), got {self.delta}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise PrivacyPlanError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise PrivacyPlanError(f"clip must be a finite number > 0, got {self.clip}")
        if self.occurrence_cap < 0:
            raise PrivacyPlanError(f"occurrence_cap must be >= 0, got {self.occurrence_cap}")
        if self.accountant not in ACCOUNTANTS:
            raise PrivacyPlanError(f"accountant must be 'rdp' or 'prv', got {self.accountant!r}")
        if self.max_releases is not None and self.max_releases < 1:
            raise PrivacyPlanError(f"max_releases must be >= 1, got {self.max_releases}")
        if self.release not in RELEASE_KINDS:
            raise PrivacyPlanError(f"release must be one of {RELEASE_KINDS}, got {self.release!r}")
        if isinstance(self.degree_floor, bool) or not isinstance(self.degree_floor, int):
            raise PrivacyPlanError(f"degree_floor must be an int, got {self.degree_floor!r}")
        if self.degree_floor < 1:
            raise PrivacyPlanError(f"degree_floor must be >= 1, got {self.degree_floor}")
        if self.clients < 1 or self.passes_total < 1:
            raise PrivacyPlanError("a session needs at least one client and one pass")
        if self.split_noise:
            self._check_split()

    def _check_split(self) -> None:
        """Refuse a split the session cannot run or account (docs/privacy.md section 11)."""
        try:
            check_split_session(self)
        except SplitNoiseError as exc:
            raise PrivacyPlanError(str(exc)) from exc

    @classmethod
    def plan(
        cls,
        *,
        epsilon: float | None,
        delta: float,
        noise_multiplier: float | None = None,
        clip: float,
        occurrence_cap: int,
        accountant: AccountantName = "rdp",
        shared_noise: bool = False,
        split_noise: bool = False,
        max_releases: int | None = None,
        release: ReleaseKind = "clip-after",
        degree_floor: int = DEFAULT_DEGREE_FLOOR,
        clients: int,
        passes_total: int,
        encrypted: bool,
        masked: bool = False,
    ) -> SessionPrivacy:
        """Check the parameters, take z as given or calibrate it so that every planned release
        fits ``epsilon``, and check that at least one release fits. :class:`PrivacyPlanError`
        says what is wrong otherwise. With ``split_noise`` the ledger's z is z itself, so it
        is calibrated directly (no sqrt(M / (M - 1)) factor)."""
        if epsilon is None and noise_multiplier is None:
            raise PrivacyPlanError(
                "give noise_multiplier, or epsilon (a target to calibrate it), or both"
            )
        if shared_noise and not encrypted and clients > 1:
            raise PrivacyPlanError(
                "shared_noise needs encryption 'ckks': in plaintext the service sees each share,"
                " and each share carries only 1/M of the noise variance"
            )
        planned = passes_total if max_releases is None else min(passes_total, max_releases)
        source: NoiseMultiplierSource = "given"
        try:
            if noise_multiplier is None:
                assert epsilon is not None
                noise_multiplier = calibrate_session_noise_multiplier(
                    epsilon=epsilon,
                    delta=delta,
                    releases=max(planned, 1),
                    clients=clients,
                    shared=shared_noise,
                    accountant=accountant,
                )
                source = "calibrated"
            privacy = cls(
                epsilon=epsilon,
                delta=delta,
                noise_multiplier=noise_multiplier,
                noise_multiplier_source=source,
                clip=clip,
                occurrence_cap=occurrence_cap,
                accountant=accountant,
                shared_noise=shared_noise,
                split_noise=split_noise,
                max_releases=max_releases,
                release=release,
                degree_floor=degree_floor,
                clients=clients,
                passes_total=passes_total,
                encrypted=encrypted,
                masked=masked,
            )
            if not privacy.release_allowed(0):
                raise PrivacyPlanError(
                    f"epsilon target {epsilon} is below the epsilon of a single release with"
                    f" noise_multiplier {noise_multiplier:.4g} ({privacy.epsilon_after(1):.4g});"
                    " raise the target or the noise"
                )
            if not math.isfinite(privacy.epsilon_planned):
                raise ValueError(f"epsilon after the planned releases is {privacy.epsilon_planned}")
        except PrivacyPlanError:
            raise
        # AccountingError is a ValueError; extreme parameters overflow or divide by zero
        except (ValueError, ArithmeticError) as exc:
            raise PrivacyPlanError(
                f"the accountant cannot evaluate these parameters: {exc}"
            ) from exc
        return privacy

    @classmethod
    def restore(
        cls,
        stored: Mapping[str, Any],
        *,
        clients: int,
        passes_total: int,
        encrypted: bool,
        masked: bool = False,
    ) -> SessionPrivacy:
        """A plan from a stored or received settings mapping whose z is already chosen (the
        fields of :meth:`settings`; unknown keys are an error)."""
        unknown = sorted(set(stored) - set(_SETTINGS))
        if unknown:
            raise PrivacyPlanError(f"unknown privacy settings {unknown}")
        values = dict(stored)
        values.setdefault("noise_multiplier_source", "given")
        return cls(
            **values,
            clients=clients,
            passes_total=passes_total,
            encrypted=encrypted,
            masked=masked,
        )

    def settings(self) -> dict[str, Any]:
        """The session's public privacy parameters, z included (what a worker is given)."""
        return {name: getattr(self, name) for name in _SETTINGS}

    # -- derived quantities ----------------------------------------------------------------

    @property
    def sensitivity(self) -> float:
        return release_sensitivity(
            clip=self.clip,
            occurrence_cap=self.occurrence_cap,
            release=self.release,
            degree_floor=self.degree_floor,
        )

    @property
    def degree_normalised(self) -> bool:
        return self.release == "degree-normalised"

    @property
    def ledger_noise_multiplier(self) -> float:
        """The z the ledger composes: z, or with shared noise the z one curious peer faces after
        subtracting its own share."""
        return effective_noise_multiplier(
            noise_multiplier=self.noise_multiplier, clients=self.clients, shared=self.shared_noise
        )

    @property
    def client_noise_std(self) -> float:
        """Each client's noise std: z * Delta, or z * Delta / sqrt(M) with shared noise. With
        split noise it depends on the release's width: :meth:`release_noise_std`."""
        if self.split_noise:
            raise ValueError("split noise's std depends on the release width: release_noise_std")
        return per_client_noise_std(
            noise_multiplier=self.noise_multiplier,
            sensitivity=self.sensitivity,
            clients=self.clients,
            shared=self.shared_noise,
        )

    def grid_sensitivity(self, width: int) -> float:
        """Delta on the share grid for a release ``width`` columns wide: Delta + g sqrt(k), k =
        (c + 1) * width the coordinates one node can change (split noise rounds the signal to
        the grid before the noise, docs/privacy.md section 11.1)."""
        rows = affected_rows(occurrence_cap=self.occurrence_cap, depth=RELEASE_LAYER)
        return grid_sensitivity(sensitivity=self.sensitivity, coordinates=rows * int(width))

    def release_noise_std(self, width: int) -> float:
        """This client's noise std for a release ``width`` columns wide: z Delta_g / sqrt(M - 1)
        with split noise (:meth:`grid_sensitivity`), else :attr:`client_noise_std`."""
        if not self.split_noise:
            return self.client_noise_std
        return split_noise_std(
            noise_multiplier=self.noise_multiplier,
            sensitivity=self.grid_sensitivity(width),
            clients=self.clients,
        )

    def split(self) -> SplitNoise:
        """The split of this session's noise (``secure.split_session.session_split``)."""
        return session_split(self)

    def split_epsilons(self, releases: int) -> AdversaryEpsilons:
        """Epsilon against each adversary of split noise after ``releases`` releases of all M
        shares (``secure.split_noise.adversary_epsilons``)."""
        return adversary_epsilons(
            self.split(),
            releases=releases,
            delta=self.delta,
            accountant=self.accountant,
            masked=self.masked,
        )

    def pass_noise_multipliers(self) -> dict[str, float | None]:
        """The noise multiplier each adversary (by key, :meth:`adversaries`) faces in one
        release of all M shares (split noise never sums fewer: it refuses stragglers
        "continue")."""
        return {a.key: a.noise_multiplier for a in self.adversaries()}

    @property
    def planned_releases(self) -> int:
        if self.post_processing:
            return 0
        if self.max_releases is None:
            return self.passes_total
        return min(self.passes_total, self.max_releases)

    @property
    def epsilon_planned(self) -> float:
        """Epsilon after every planned release."""
        return self.epsilon_after(self.planned_releases)

    # -- decisions -------------------------------------------------------------------------

    def budget(self, releases: int = 0) -> PrivacyBudget:
        """The session's budget after ``releases`` releases: the ledger's z, the epsilon target
        and the release cap."""
        return PrivacyBudget(
            noise_multiplier=self.ledger_noise_multiplier,
            delta=self.delta,
            accountant=self.accountant,
            epsilon_target=self.epsilon,
            max_releases=self.max_releases,
            releases=releases,
        )

    def release_allowed(self, releases_so_far: int) -> bool:
        """Whether release number ``releases_so_far + 1`` stays within the cap and the target
        (``secure.accounting.decide_release``: an epsilon the accountant cannot evaluate counts
        as "no")."""
        return self.budget(releases_so_far).next_release().allowed

    def epsilon_after(self, releases: int) -> float:
        return self.budget().epsilon_at(releases)

    def report(self, *, releases: int, ledger: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """The privacy report: the fields of ``GET /v1/sessions/{id}/privacy``, for the run
        report, the CLI and the service alike. Each ``ledger`` entry names the ``clients`` whose
        shares the release holds; without a ledger every client is in every release."""
        by_client = []
        for m in range(self.clients):
            own = sum(m in entry["clients"] for entry in ledger) if ledger else releases
            by_client.append({"client": m, "releases": own, "epsilon": self.epsilon_after(own)})
        return {
            "enabled": True,
            "epsilon": self.epsilon_after(releases),
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "noise_multiplier_source": self.noise_multiplier_source,
            "ledger_noise_multiplier": self.ledger_noise_multiplier,
            "sensitivity": self.sensitivity,
            "clip": self.clip,
            "noise_std": self.noise_multiplier * self.sensitivity,
            "releases": releases,
            "max_releases": self.max_releases,
            "accountant": self.accountant,
            "epsilon_target": self.epsilon,
            "epsilon_planned": self.epsilon_planned,
            "shared_noise": self.shared_noise,
            "split_noise": self.split_noise,
            "occurrence_cap": self.occurrence_cap,
            "release": self.release,
            "degree_floor": self.degree_floor if self.degree_normalised else None,
            "privacy_unit": PRIVACY_UNIT,
            "not_protected": list(NOT_PROTECTED),
            "adversaries": [
                {
                    "adversary": a.adversary,
                    "noise_multiplier": a.noise_multiplier,
                    "epsilon": self._epsilon_for(a.noise_multiplier, releases),
                    "epsilon_planned": self._epsilon_for(a.noise_multiplier, self.planned_releases),
                    "note": a.note,
                    "key": a.key,
                }
                for a in self.adversaries()
            ],
            "ledger": list(ledger),
            "by_client": by_client,
        } | split_report(self, releases)

    def _epsilon_for(self, noise_multiplier: float | None, releases: int) -> float | None:
        if noise_multiplier is None:
            return None
        return epsilon_after(
            noise_multiplier=noise_multiplier,
            releases=releases,
            delta=self.delta,
            accountant=self.accountant,
        )

    def adversaries(self) -> list[Adversary]:
        """Against whom the guarantee holds, with the noise multiplier each one faces (None:
        it sees no release at all). The privacy unit is one node's feature row at one client."""
        if self.split_noise:
            return self._split_adversaries()
        z, m, shared = self.noise_multiplier, self.clients, self.shared_noise
        per_share = z / math.sqrt(m) if shared else z  # the noise in one client's own share
        if self.encrypted:  # CKKS or masked BFV shares: the session's encoding says which
            service = Adversary(
                "the service alone", None, "sees only ciphertexts and their sum", "service"
            )
        else:
            service = Adversary(
                "the service alone", per_share, "encryption off: it reads every share", "service"
            )
        found = [service]
        if m > 1:
            found += [
                Adversary(
                    "one curious peer",
                    effective_noise_multiplier(noise_multiplier=z, clients=m, shared=shared),
                    "decrypts the sum and subtracts its own share",
                    "peer",
                ),
                Adversary(
                    "all other peers colluding, with or without the service",
                    per_share,
                    "pool their shares and isolate this client's share",
                    "colluding",
                ),
                Adversary(
                    f"one node's features at all {m} clients, against one curious peer",
                    z * math.sqrt((m - 1) / m) / (m - 1) if shared else z / math.sqrt(m - 1),
                    f"the node's rows at the other {m - 1} clients move the sum together",
                    "group",
                ),
            ]
        return found

    def _split_adversaries(self) -> list[Adversary]:
        rows = split_adversary_rows(self.split(), masked=self.masked)
        return [Adversary(*row) for row in rows]


def check_private_arrangement(agg_layers: Sequence[int]) -> None:
    """Refuse a session whose aggregation layers are not those of the private arrangement.

    Under differential privacy a worker releases exactly one noisy matrix per pass, at
    :data:`RELEASE_LAYER`, and nothing else that depends on its features (docs/privacy.md
    section 9), so that layer must be the session's only aggregation layer: a sum at any other
    layer would be a release the ledger does not count. :class:`PrivacyPlanError` says why.
    """
    layers = [int(layer) for layer in agg_layers]
    if layers != [RELEASE_LAYER]:
        raise PrivacyPlanError(
            f"with differential privacy the only aggregation layer must be layer"
            f" {RELEASE_LAYER}, got aggregation layers {layers}: the private arrangement"
            f" releases one noisy matrix per pass at layer {RELEASE_LAYER} and nothing else that"
            " depends on the features (docs/privacy.md section 9); any other aggregation would"
            " be a release the privacy ledger does not count"
        )
