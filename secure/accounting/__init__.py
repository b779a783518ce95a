"""Privacy accounting for Gaussian releases (torch-free), in the Opacus layout: the maths apart
from the state.

- :mod:`.analysis`: epsilon after R releases with multiplier z (RDP by dp-accounting, PRV by
  prv-accountant), its inverse :func:`max_releases`, and the composition of releases with
  different multipliers. Pure functions, cached.
- :mod:`.calibration`: the noise multiplier that meets an epsilon target.
- :mod:`.budget`: :func:`decide_release`, the one decision whether a release may go out, and
  :class:`PrivacyBudget`, a session's count of releases against its caps.

The session-level plan built on them is ``secure.privacy.SessionPrivacy``; the service's privacy
ledger (its record of each release) is ``service.store``'s, the data owner's ledger
``clients.owner_ledger``'s. See docs/privacy.md section 4.
"""

from secure.accounting.analysis import (
    ACCOUNTANTS,
    MAX_PRV_GRID_POINTS,
    PRV_EPS_ERROR,
    RDP_ORDERS,
    RDP_ORDERS_SUBSAMPLED,
    AccountantName,
    AccountingError,
    composed_epsilon,
    composed_noise_multiplier,
    epsilon_after,
    gaussian_dp_mu,
    max_releases,
)
from secure.accounting.budget import (
    PrivacyBudget,
    ReleaseDecision,
    ReleaseRefused,
    count_releases,
    decide_release,
)
from secure.accounting.calibration import (
    calibrate_noise_multiplier,
    calibrate_session_noise_multiplier,
)

__all__ = [
    "ACCOUNTANTS",
    "MAX_PRV_GRID_POINTS",
    "PRV_EPS_ERROR",
    "RDP_ORDERS",
    "RDP_ORDERS_SUBSAMPLED",
    "AccountantName",
    "AccountingError",
    "PrivacyBudget",
    "ReleaseDecision",
    "ReleaseRefused",
    "calibrate_noise_multiplier",
    "calibrate_session_noise_multiplier",
    "composed_epsilon",
    "composed_noise_multiplier",
    "count_releases",
    "decide_release",
    "epsilon_after",
    "gaussian_dp_mu",
    "max_releases",
]
