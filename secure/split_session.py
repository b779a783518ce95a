"""What a session with split noise checks, and whom its noise protects against: pure functions on
the plan, for ``secure.privacy.SessionPrivacy`` (docs/privacy.md section 11).

A session splits its noise only with M >= 3 encrypted shares (the masks, or CKKS under the
owners' ``--allow-shared-noise``), accounted with the RDP accountant (Kairouz et al.'s bound is a
Renyi bound) and only where every party's discrete Gaussian is wide enough on the share grid for
the bound's tau term to be exactly 0: the sum of the shares' noise is then accounted exactly as
one Gaussian of multiplier z_j against j colluding peers, so the ledger's composition of 1 / z^2
(``secure.accounting.composed_epsilon``) stays exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from secure.aggregation import SHARE_GRID
from secure.split_noise import (
    SplitNoise,
    SplitNoiseError,
    adversary_lines,
    check_split_clients,
    split_noise_std,
)
from secure.split_noise import sum_tau as _sum_tau

if TYPE_CHECKING:
    from secure.privacy import SessionPrivacy

#: An adversary of a split-noise session: (name, the z it faces or None, note, key).
AdversaryRow = tuple[str, float | None, str, str]


def check_split_session(privacy: SessionPrivacy) -> None:
    """:class:`SplitNoiseError` saying why the session ``privacy`` cannot split its noise."""
    clients = privacy.clients
    if privacy.shared_noise:
        raise SplitNoiseError(
            "split_noise and shared_noise are two ways of sharing the noise: choose one"
        )
    check_split_clients(clients)
    if not privacy.encrypted:
        raise SplitNoiseError(
            "split_noise needs encryption (masked shares under BFV, or CKKS with the owners'"
            " --allow-shared-noise): in plaintext the service reads each share, and each carries"
            " only 1/(M-1) of the noise variance"
        )
    if privacy.accountant != "rdp":
        raise SplitNoiseError(
            "split discrete Gaussian noise is accounted by its Renyi bound (Kairouz et al. 2021);"
            " the PRV accountant models continuous Gaussian noise: use accountant 'rdp'"
        )
    # the party std on the plain Delta is below the one on the grid, so tau here bounds the
    # real one from above (tau falls as the std grows)
    party = split_noise_std(
        noise_multiplier=privacy.noise_multiplier, sensitivity=privacy.sensitivity, clients=clients
    )
    tau = _sum_tau(party_sigma=party / SHARE_GRID, shares=clients - 1)
    if tau > 0.0:
        raise SplitNoiseError(
            f"split noise of std {party:.3g} per party is only {party / SHARE_GRID:.3g} steps of"
            f" the share grid: the sum of discrete Gaussians is then measurably not one (Kairouz"
            f" et al.'s tau = {tau:.3g}), which the ledger's Gaussian accounting does not cover;"
            " raise the noise"
        )


def split_adversary_rows(noise: SplitNoise, *, masked: bool) -> list[AdversaryRow]:
    """Against whom split noise holds: the masks show the service only the sum, so with one
    peer it faces what that peer faces (z); all M - 1 others isolate the victim's own share.
    Without masks (CKKS, the owners' --allow-shared-noise) the service with one peer decrypts
    the victim's share itself: it faces what M - 1 colluding peers face."""
    m = noise.clients
    peer = noise.noise_multiplier_against(1)
    one_share = noise.noise_multiplier_against(m - 1)
    if masked:
        service = "sees only ciphertexts of masked shares and their sum"
        service_peer = (peer, "the masks show them only the sum, less that peer's share")
    else:
        service = (
            "sees only ciphertexts and their sum; the owners' --allow-shared-noise trusts it to"
            " serve only true sums"
        )
        service_peer = (
            one_share,
            "without masks the peer's key decrypts this client's share, which carries only its"
            " split of the noise",
        )
    return [
        ("the service alone", None, service, "service"),
        ("one curious peer", peer, "decrypts the sum and subtracts its own share", "peer"),
        ("the service with one colluding peer", *service_peer, "service_peer"),
        (
            "all other peers colluding, with or without the service",
            one_share,
            "pool their shares and isolate this client's share",
            "colluding",
        ),
        (
            f"one node's features at all {m} clients, against one curious peer",
            noise.noise_multiplier_against(1, group=True),
            f"the node's rows at the other {m - 1} clients move the sum together",
            "group",
        ),
    ]


def session_split(privacy: SessionPrivacy) -> SplitNoise:
    """The split of the session's noise, for its per-adversary accounting. The dimension is 1:
    :func:`check_split_session` refused any split whose tau is not 0, and with tau = 0 Kairouz
    et al.'s bound does not depend on it."""
    if not privacy.split_noise:
        raise ValueError("the session's noise is not split")
    return SplitNoise(
        noise_multiplier=privacy.noise_multiplier,
        sensitivity=privacy.sensitivity,
        clients=privacy.clients,
        dimension=1,
    )


def split_report(privacy: SessionPrivacy, releases: int) -> dict[str, Any]:
    """The privacy report's split fields: with split noise its accounting against each
    adversary (``AdversaryEpsilons.to_dict``) and the lines a report prints; None and none
    otherwise."""
    if not privacy.split_noise:
        return {"split": None, "adversary_lines": []}
    epsilons = privacy.split_epsilons(releases)
    return {"split": epsilons.to_dict(), "adversary_lines": adversary_lines(epsilons)}
