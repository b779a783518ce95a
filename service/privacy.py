"""A session's release accounting on top of ``secure.accounting``: choosing z, deciding whether
one more release fits the budget, epsilon after n releases.

Every pass is one Gaussian release (sample rate 1). The ledger rows themselves live in the store;
a :class:`secure.accounting.PrivacyLedger` is rebuilt from their count whenever a decision is due.

With ``shared_noise`` every client adds only 1/M of the variance, so a peer that subtracts its
own share faces less noise: the ledger then runs on ``secure.dp.effective_noise_multiplier``,
and a calibrated z is scaled up to compensate.

``secure.accounting`` pulls in Opacus (and with it torch, ~2 s), so it is imported on first use:
a service without privacy sessions never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from secure.dp import effective_noise_multiplier
from service.errors import ProblemError
from service.schemas import PrivacySettings


def _accounting() -> ModuleType:
    try:
        from secure import accounting
    except ImportError as exc:  # a broken install; never bad input
        raise ProblemError(
            503, "privacy-unavailable", f"privacy accounting is not available: {exc}"
        ) from exc
    return accounting


def _invalid(detail: str) -> ProblemError:
    return ProblemError(422, "validation-error", f"privacy: {detail}")


@dataclass(frozen=True, slots=True)
class ReleaseAccounting:
    """The accounting of one session: its privacy settings (with the z in use) and M."""

    settings: PrivacySettings
    clients: int

    @property
    def noise_multiplier(self) -> float:
        """z the clients use for the sum."""
        assert self.settings.noise_multiplier is not None  # filled in at session creation
        return self.settings.noise_multiplier

    @property
    def ledger_noise_multiplier(self) -> float:
        """The multiplier that protects one client's data against a curious peer."""
        return effective_noise_multiplier(
            noise_multiplier=self.noise_multiplier,
            clients=self.clients,
            shared=self.settings.shared_noise,
        )

    def planned_releases(self, passes_total: int) -> int:
        if self.settings.max_releases is None:
            return passes_total
        return min(passes_total, self.settings.max_releases)

    def ledger(self, releases: int) -> Any:
        return _accounting().PrivacyLedger(
            noise_multiplier=self.ledger_noise_multiplier,
            delta=self.settings.delta,
            accountant=self.settings.accountant,
            epsilon_target=self.settings.epsilon,
            releases=releases,
        )

    def release_allowed(self, releases_so_far: int) -> bool:
        """Whether release number ``releases_so_far + 1`` stays within the cap and the target.
        An epsilon the accountant cannot evaluate counts as "no"."""
        if self.settings.max_releases is not None and releases_so_far >= self.settings.max_releases:
            return False
        try:
            return not self.ledger(releases_so_far).would_exceed()
        except (ValueError, ArithmeticError):  # AccountingError, extreme parameters
            return False

    def epsilon_after(self, releases: int) -> float:
        return float(
            _accounting().epsilon_after(
                noise_multiplier=self.ledger_noise_multiplier,
                releases=releases,
                delta=self.settings.delta,
                accountant=self.settings.accountant,
            )
        )


@dataclass(frozen=True, slots=True)
class PrivacyPlan:
    accounting: ReleaseAccounting
    noise_multiplier_source: str  # "given" | "calibrated"
    epsilon_planned: float  # after every planned release


def plan_privacy(
    settings: PrivacySettings, *, clients: int, passes_total: int, encrypted: bool
) -> PrivacyPlan:
    """Fill in z (given, or calibrated so every planned release fits the target), check that at
    least one release fits, and compute the epsilon of the whole session. 422 otherwise."""
    if settings.shared_noise and not encrypted and clients > 1:
        raise _invalid(
            "shared_noise needs encryption 'ckks': in plaintext the service sees each share, and"
            " each share carries only 1/M of the noise variance"
        )
    try:
        if settings.noise_multiplier is not None:
            accounting, source = ReleaseAccounting(settings, clients), "given"
        else:
            accounting, source = _calibrated(settings, clients, passes_total), "calibrated"
        if not accounting.release_allowed(0):
            raise _invalid(
                f"epsilon target {settings.epsilon} is below the epsilon of a single release with"
                f" noise_multiplier {accounting.noise_multiplier:.4g}"
                f" ({accounting.epsilon_after(1):.4g}); raise the target or the noise"
            )
        planned = accounting.epsilon_after(accounting.planned_releases(passes_total))
    # AccountingError is a ValueError; extreme parameters overflow or divide by zero
    except (ValueError, ArithmeticError) as exc:
        raise _invalid(f"the accountant cannot evaluate these parameters: {exc}") from exc
    return PrivacyPlan(accounting, source, planned)


def _calibrated(settings: PrivacySettings, clients: int, passes_total: int) -> ReleaseAccounting:
    assert settings.epsilon is not None  # PrivacySettings requires z or a target
    releases = ReleaseAccounting(settings, clients).planned_releases(passes_total)
    z = _accounting().calibrate_session_noise_multiplier(
        epsilon=settings.epsilon,
        delta=settings.delta,
        releases=releases,
        clients=clients,
        shared=settings.shared_noise,
        accountant=settings.accountant,
    )
    return ReleaseAccounting(settings.model_copy(update={"noise_multiplier": z}), clients)
