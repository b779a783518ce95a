"""The data owner's privacy policy, enforced by its own worker.

Differential privacy protects an organisation's data against the operator and the other parties,
so neither may choose how much of it is spent. Before a worker sends anything it recomputes the
session's privacy from the session's public parameters with the same plan the service uses
(``secure.privacy.SessionPrivacy``) and refuses a session that is not private, whose numbers
differ from its own, or that would take it past its policy. It also refuses a session id that
already released this data, unless it resumes that very session from its own checkpoint, and
always when the session's release mechanism differs from the one it was admitted with
(:func:`admit_session_id`): a session id is never a way to put a new plan, or the same inputs at
another noise level, under old ledger rows. Then, before each release leaves, it writes the
release to the owner's ledger (``clients/owner_ledger.py``) and stops when the next one would
exceed the per-session or the lifetime budget, by the release decision the service makes too
(``secure.accounting.decide_release``). Only a byte-identical upload, the same release digest
under the same mechanism (``secure.release_noise``), passes as already recorded. Epsilon is
computed at the policy's delta with the policy's accountant, whatever the session reports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.owner_ledger import OwnerLedger, ReleaseKind, SessionAbout
from secure.accounting import (
    AccountantName,
    ReleaseDecision,
    composed_epsilon,
    composed_noise_multiplier,
    count_releases,
    decide_release,
    max_releases,
)
from secure.privacy import RELEASE_LAYER, PrivacyPlanError, SessionPrivacy
from secure.release_noise import ReleaseMechanism

#: Relative tolerance when comparing the service's numbers with the worker's own.
AGREEMENT = 1e-6


class PolicyRefusal(RuntimeError):
    """The session asks for what this organisation's privacy policy does not allow."""


class BudgetSpent(PolicyRefusal):
    """One more release would take the spend past the per-session or the lifetime budget."""


@dataclass(frozen=True, kw_only=True)
class PrivacyPolicy:
    """What an organisation allows its worker to spend of its data's privacy."""

    require_dp: bool = True
    max_session_epsilon: float = 4.0
    max_lifetime_epsilon: float = 16.0
    delta: float = 1e-6
    allow_shared_noise: bool = False
    accountant: AccountantName = "rdp"
    # the answering party's owner agrees to send its predictions to its partners when a scoring
    # session shares them (``share_predictions``)
    share_predictions: bool = False

    def __post_init__(self) -> None:
        for name in ("max_session_epsilon", "max_lifetime_epsilon"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")

    def epsilon_of(self, inverse_square_sum: float) -> float:
        return composed_epsilon(
            inverse_square_sum=inverse_square_sum, delta=self.delta, accountant=self.accountant
        )

    def decide_release(self, *, inverse_square_sum: float, epsilon_cap: float) -> ReleaseDecision:
        """Whether releases whose 1 / z_i^2 add up to ``inverse_square_sum``, the next one
        included, stay within ``epsilon_cap`` at this policy's delta and accountant."""
        return decide_release(
            noise_multiplier=composed_noise_multiplier(inverse_square_sum),
            releases=1,
            delta=self.delta,
            accountant=self.accountant,
            epsilon_cap=epsilon_cap,
        )


def _disagrees(ours: float, theirs: Any) -> bool:
    if not isinstance(theirs, int | float):
        return True
    return not math.isclose(ours, float(theirs), rel_tol=AGREEMENT, abs_tol=1e-12)


def admit_session(
    policy: PrivacyPolicy,
    session: Mapping[str, Any],
    *,
    session_id: str,
    encrypted: bool,
    ledger: OwnerLedger | None,
    post_processing: bool = False,
) -> SessionPrivacy | None:
    """The session's privacy plan as this worker computes it, or :class:`PolicyRefusal` saying
    why the worker will not take part. ``session`` is ``GET /v1/sessions/{id}``; ``session_id``
    is the id the owner configured (what its ledger is keyed by). ``post_processing``: the
    worker's own knowledge that the session releases nothing (a scoring of its kept private
    sign model): its plan spends epsilon 0, admitted even at the lifetime cap."""
    config = session["config"]
    if not config.get("privacy"):
        if policy.require_dp:
            raise PolicyRefusal(
                "the session has no differential privacy, and this organisation's policy requires"
                " it (the operator must create the session with privacy; to take part without"
                " any guarantee, the data owner can pass --no-require-dp)"
            )
        return None
    layers = [a["layer"] for a in config["agg_layers"]]
    if layers != [RELEASE_LAYER]:
        raise PolicyRefusal(
            f"the session aggregates at layers {layers}; under differential privacy a worker"
            f" releases only its noisy layer-{RELEASE_LAYER} map (docs/privacy.md)"
        )
    try:
        privacy = SessionPrivacy.restore(
            config["privacy"],
            clients=config["clients"],
            passes_total=session["passes_total"],
            encrypted=encrypted,
            masked=config.get("secure_aggregation") == "masks",
        )
    except (PrivacyPlanError, TypeError) as exc:
        raise PolicyRefusal(f"the session's privacy settings are not usable: {exc}") from exc
    if post_processing:
        privacy = dataclasses.replace(privacy, post_processing=True)
    if privacy.split_noise:
        _check_split_noise(policy, config)
    if privacy.shared_noise and not policy.allow_shared_noise:
        raise PolicyRefusal(
            "the session uses shared noise (each worker adds 1/M of the variance, so the"
            " guarantee holds only against a single curious peer that does not collude with the"
            " service, and only if the service serves nothing but true sums); this"
            " organisation's policy does not allow it (--allow-shared-noise)"
        )
    if privacy.shared_noise and config.get("stragglers") == "continue":
        raise PolicyRefusal(
            "the session combines shared noise with stragglers 'continue': a pass that goes on"
            " without a client sums fewer shares than M, so the sum holds less noise than"
            " accounted; a worker takes part in neither with shared noise"
        )
    if privacy.shared_noise and config.get("nodes") == "union":
        raise PolicyRefusal(
            "the session combines shared noise with an alignment over the union: rows a party"
            " lacks carry no noise from it, so those rows of the sum hold less noise than"
            " accounted; a worker takes part in neither with shared noise"
        )
    reported = session.get("privacy") or {}
    for name, ours in (
        ("sensitivity", privacy.sensitivity),
        ("ledger_noise_multiplier", privacy.ledger_noise_multiplier),
        ("epsilon_planned", privacy.epsilon_planned),
    ):
        if name in reported and _disagrees(ours, reported[name]):
            raise PolicyRefusal(
                f"the service reports {name} = {reported[name]}, this worker computes {ours:.6g}"
                " from the session's public parameters: refusing a session whose accounting"
                " differs from its own"
            )
    releases = releases_within_target(privacy)
    planned = releases / privacy.ledger_noise_multiplier**2
    session_epsilon = policy.epsilon_of(planned)
    if session_epsilon > policy.max_session_epsilon:
        raise PolicyRefusal(
            f"the session would spend epsilon {session_epsilon:.4g} of this data's privacy (delta"
            f" {policy.delta:g}, {count_releases(releases)} with noise multiplier"
            f" {privacy.ledger_noise_multiplier:.4g}); the policy allows"
            f" {policy.max_session_epsilon:g} per session"
        )
    if ledger is not None and not privacy.post_processing:
        # A resumed session's own rows are part of its plan, not on top of it (more rows than
        # planned: recomputed passes with other inputs, each a release of its own).
        spent = ledger.inverse_square_sum()
        this_session = ledger.inverse_square_sum(session_id=session_id)
        lifetime = policy.epsilon_of(spent - this_session + max(this_session, planned))
        if lifetime > policy.max_lifetime_epsilon:
            raise PolicyRefusal(
                f"this session would take the lifetime spend on this data to epsilon"
                f" {lifetime:.4g} (spent so far: {policy.epsilon_of(spent):.4g} in"
                f" {count_releases(ledger.releases())}); the policy allows"
                f" {policy.max_lifetime_epsilon:g}"
                f" (see `glasu budget --local DIR`)"
            )
    return privacy


#: The session setting (``GET /v1/sessions/{id}``'s config) of masked secure aggregation.
MASKS = ("secure_aggregation", "masks")


def _check_split_noise(policy: PrivacyPolicy, config: Mapping[str, Any]) -> None:
    """The refusals of split noise (docs/privacy.md section 11.4); M < 3 and the PRV accountant
    are refused by the plan itself."""
    masked = config.get(MASKS[0]) == MASKS[1]
    if not masked and not policy.allow_shared_noise:
        raise PolicyRefusal(
            "the session splits the noise (each worker adds 1/(M-1) of the variance) without"
            " masked secure aggregation: every worker holds the one key, so a service that hands"
            " a worker another's share as a sum, or any key holder reading an upload, sees a"
            " share with 1/(M-1) of the noise; this organisation's policy does not allow it"
            " (--allow-shared-noise)"
        )
    if config.get("stragglers") == "continue":
        # masked or not: a pass over fewer than M clients (a sum without a straggler, or a
        # masked pass redone without one) carries less noise than sigma^2
        raise PolicyRefusal(
            "the session combines split noise with stragglers 'continue': a pass that goes on"
            " without a client sums fewer shares than M, so the sum holds less noise than"
            " accounted"
        )
    if config.get("nodes") == "union":
        raise PolicyRefusal(
            "the session combines split noise with an alignment over the union: rows a party"
            " lacks carry no noise from it, so those rows of the sum hold less noise than"
            " accounted; a worker takes part in neither with split noise"
        )
    if policy.accountant != "rdp":
        raise PolicyRefusal(
            "the session splits the noise, which is accounted by its Renyi bound (Kairouz et al."
            " 2021), and this organisation's policy accounts with the PRV accountant, which"
            " models continuous Gaussian noise: refusing (a policy with accountant 'rdp' can"
            " take part)"
        )


def admit_session_id(
    ledger: OwnerLedger,
    *,
    session_id: str,
    mechanism: ReleaseMechanism,
    checkpoint: Path | None,
) -> None:
    """Refuse (:class:`PolicyRefusal`) to take part in the configured session ``session_id``
    when it would put other releases under the ledger's rows of that id:

    - the ledger recorded the session with another release mechanism (another z, clip, M, ...):
      refused whatever the worker holds (the same inputs at another noise level would be a
      second release that a row of the first claims, and with the first's noise);
    - the session already released this data and the worker has no checkpoint of it
      (``checkpoint``: the file this worker resumes from, or None): only a worker that resumes
      the session from its own checkpoint (whose fingerprint covers the session's whole
      description) may come back to it; anything else is a new session, under a new id.

    Call it before anything is sent; :meth:`OwnerLedger.note_session` then keeps the mechanism."""
    recorded = ledger.session_mechanism(session_id)
    if recorded is not None and recorded != mechanism.canonical():
        try:
            differences = ReleaseMechanism.from_canonical(recorded).differences(mechanism)
        except (TypeError, ValueError):  # recorded by another version of glasu
            differences = []
        raise PolicyRefusal(
            f"session {session_id} was admitted from this data with another release mechanism"
            f" ({'; '.join(differences) or 'its description differs'}; recorded != now):"
            " the same id with other noise parameters would release this data again under its"
            " old ledger rows; refusing (a new session needs a new id)"
        )
    released = ledger.releases(session_id=session_id)
    if released and checkpoint is None:
        raise PolicyRefusal(
            f"session {session_id} already released this data {released} times (the owner's"
            f" ledger {ledger.path}) and this worker has no checkpoint of it to resume from: a"
            " session id comes back only with the checkpoint of its first run (the same"
            " --checkpoint folder, without --no-checkpoint); to train again, join a new session"
        )


def releases_within_target(privacy: SessionPrivacy) -> int:
    """How many releases the session can make: all planned ones, or fewer when its epsilon
    target stops it first (z given with a smaller target). The worker's own gate enforces the
    same count at its own delta, so it need not trust the service to stop."""
    releases = privacy.planned_releases
    if privacy.epsilon is not None:
        releases = min(
            releases,
            max_releases(
                noise_multiplier=privacy.ledger_noise_multiplier,
                delta=privacy.delta,
                epsilon=privacy.epsilon,
                accountant=privacy.accountant,
                limit=max(releases, 1),
            ),
        )
    return releases


@dataclass
class ReleaseGate:
    """Records each release in the local ledger before it leaves; refuses the one that would go
    past the per-session or the lifetime budget. It is never skipped: a release already in the
    ledger (the same session, pass, layer, release digest and ``mechanism``: a byte-identical
    upload) passes without a second row, any other is a new release."""

    policy: PrivacyPolicy
    privacy: SessionPrivacy
    ledger: OwnerLedger
    session_id: str
    mechanism: ReleaseMechanism  # the release mechanism of this worker's shares
    scoring: bool = False  # a scoring session: its (evaluation) passes are recorded as scoring
    # a release session (the private sign design): its one pass feeds training, recorded so
    one_release: bool = False

    def admit(
        self,
        pass_index: int,
        *,
        layer: int = RELEASE_LAYER,
        release: str,
        pass_kind: str | None = None,
    ) -> bool:
        """Admit the release with digest ``release``; True if it is new (recorded now), False
        if this very release, under this mechanism, was recorded before (sending the identical
        bytes again reveals nothing new).
        ``pass_kind`` ("train" or "eval", the pass info's) is recorded as the release's kind."""
        # one transaction: another worker of this organisation (on another copy of its data, in
        # another session) cannot spend between this budget check and this release's row
        with self.ledger.exclusive():
            return self._admit(pass_index, layer=layer, release=release, pass_kind=pass_kind)

    def _admit(self, pass_index: int, *, layer: int, release: str, pass_kind: str | None) -> bool:
        known = dict(
            session_id=self.session_id,
            pass_index=pass_index,
            layer=layer,
            release_digest=release,
            mechanism=self.mechanism.digest,
        )
        if self.ledger.recorded(**known):
            return False
        z = self.privacy.ledger_noise_multiplier
        step = 1.0 / z**2
        for spent, cap, spend in (
            (
                self.ledger.inverse_square_sum(session_id=self.session_id),
                self.policy.max_session_epsilon,
                "this session's spend",
            ),
            (
                self.ledger.inverse_square_sum(),
                self.policy.max_lifetime_epsilon,
                "the lifetime spend on this data",
            ),
        ):
            decision = self.policy.decide_release(inverse_square_sum=spent + step, epsilon_cap=cap)
            if not decision.allowed:
                raise BudgetSpent(
                    f"release {pass_index} would take {spend} to epsilon"
                    f" {decision.epsilon:.4g}; the policy allows {cap:g}"
                )
        return self.ledger.record(
            noise_multiplier=z,
            kind=self.release_kind(pass_kind),
            adversaries=self.privacy.pass_noise_multipliers() if self.privacy.split_noise else None,
            **known,
        )

    def release_kind(self, pass_kind: str | None) -> ReleaseKind | None:
        if self.scoring:
            return "scoring"
        if self.one_release:
            return "training"
        return {"train": "training", "eval": "evaluation"}.get(pass_kind or "")


def session_about(session: Mapping[str, Any], privacy: SessionPrivacy) -> SessionAbout:
    """What the worker's ledger keeps of a session it admits (``session``: ``GET
    /v1/sessions/{id}``): its labels, and each adversary's noise relative to the ledger's."""
    config = session["config"]
    ledger_z = privacy.ledger_noise_multiplier

    def factor(z: float | None) -> float | None:
        return None if z is None else (ledger_z / z) ** 2

    return SessionAbout(
        label=config.get("label"),
        partners=config.get("partners"),
        operator=config.get("operator"),
        kind=config.get("kind", "training"),
        created_at=session.get("created_at"),
        clients=config["clients"],
        encoding=config.get("encoding"),
        adversaries=[
            {
                "key": a.key,
                "adversary": a.adversary,
                "note": a.note,
                "factor": factor(a.noise_multiplier),
            }
            for a in privacy.adversaries()
        ],
    )
