"""Encryption and differential-privacy settings of a run, and what they mean for the clients:
the codec, the private release, the noise multiplier and the privacy report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from models.federated import ClientConfig, GlasuClient
from models.partition import ClientPartition
from models.private import PrivateGlasuClient, ReleaseSettings, release_sensitivity
from secure.accounting import PrivacyLedger, calibrate_session_noise_multiplier, epsilon_after
from secure.aggregation import EmbeddingCodec
from secure.dp import GaussianNoise, effective_noise_multiplier, per_client_noise_std

AccountantName = Literal["rdp", "prv"]


@dataclass(frozen=True)
class PrivacyConfig:
    """Node-level DP for every client's features (docs/privacy.md)."""

    epsilon: float | None = 4.0  # target; calibrates z when noise_multiplier is None
    delta: float = 1e-6
    noise_multiplier: float | None = None
    clip: float = 1.0
    accountant: AccountantName = "rdp"
    release_width: int = 16
    occurrence_cap: int = 1
    shared_noise: bool = True  # only with encryption: nobody sees a single share
    noise_seed: int | None = None  # reproducible noise, for experiments only

    def __post_init__(self) -> None:
        if self.epsilon is None and self.noise_multiplier is None:
            raise ValueError("differential privacy needs --epsilon or --noise-multiplier")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")
        if self.release_width < 1 or self.occurrence_cap < 0:
            raise ValueError("release width must be >= 1 and the occurrence cap >= 0")


def ledger_noise_multiplier(
    privacy: PrivacyConfig, *, noise_multiplier: float, clients: int
) -> float:
    """The z the ledger accounts: ``noise_multiplier`` itself, or with shared noise the z that
    one curious peer faces after subtracting its own share (``secure.dp``)."""
    return effective_noise_multiplier(
        noise_multiplier=noise_multiplier, clients=clients, shared=privacy.shared_noise
    )


def choose_noise_multiplier(
    privacy: PrivacyConfig, *, releases: int, clients: int
) -> tuple[float, str]:
    """The session's z (noise std of the sum / Delta) as given, or calibrated so that
    ``releases`` releases spend the epsilon target as the ledger accounts them."""
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier, "given"
    assert privacy.epsilon is not None
    z = calibrate_session_noise_multiplier(
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        releases=releases,
        clients=clients,
        shared=privacy.shared_noise,
        accountant=privacy.accountant,
    )
    return z, "calibrated"


def client_noise_std(
    privacy: PrivacyConfig, *, noise_multiplier: float, sensitivity: float, clients: int
) -> float:
    """Each client's noise std: z * Delta, or z * Delta / sqrt(M) with shared noise (the sum
    then carries (z * Delta)^2; see ``secure.dp.per_client_noise_std`` for the assumptions)."""
    return per_client_noise_std(
        noise_multiplier=noise_multiplier,
        sensitivity=sensitivity,
        clients=clients,
        shared=privacy.shared_noise,
    )


def noise_source(privacy: PrivacyConfig, *, client: int) -> GaussianNoise:
    """Cryptographically seeded unless the user fixed a seed for reproducibility."""
    if privacy.noise_seed is None:
        return GaussianNoise()
    return GaussianNoise(seed=privacy.noise_seed * 1000 + client)


def privacy_report(
    privacy: PrivacyConfig,
    *,
    noise_multiplier: float,
    ledger_z: float,
    source: str,
    sensitivity: float,
    releases: int,
    planned_releases: int,
) -> dict[str, Any]:
    """The same fields as ``GET /v1/sessions/{id}/privacy``."""
    ledger = PrivacyLedger(
        noise_multiplier=ledger_z,
        delta=privacy.delta,
        accountant=privacy.accountant,
        epsilon_target=privacy.epsilon,
        releases=releases,
    )
    return {
        "enabled": True,
        "epsilon": ledger.epsilon,
        "delta": privacy.delta,
        "noise_multiplier": noise_multiplier,
        "noise_multiplier_source": source,
        "ledger_noise_multiplier": ledger_z,
        "sensitivity": sensitivity,
        "clip": privacy.clip,
        "noise_std": noise_multiplier * sensitivity,
        "releases": releases,
        "max_releases": None,
        "accountant": privacy.accountant,
        "epsilon_target": privacy.epsilon,
        "epsilon_planned": epsilon_after(
            noise_multiplier=ledger_z,
            releases=planned_releases,
            delta=privacy.delta,
            accountant=privacy.accountant,
        ),
        "shared_noise": privacy.shared_noise,
        "occurrence_cap": privacy.occurrence_cap,
        "ledger": [],  # in process nothing is stored; the history carries epsilon per evaluation
    }


def release_projection_seed(*, seed: int, client: int) -> int:
    """Public and data-independent: fixed by the session seed and the client index."""
    return int(np.random.SeedSequence([seed, client, 0x5EED]).generate_state(1)[0])


def make_glasu_client(
    part: ClientPartition,
    config: ClientConfig,
    *,
    codec: EmbeddingCodec,
    device: torch.device | str,
    privacy: PrivacyConfig | None,
    noise_multiplier: float,
    seed: int,
) -> GlasuClient:
    """The client a run needs: plain GLASU, or the private arrangement with its release."""
    if privacy is None:
        return GlasuClient(part, config, codec=codec, device=device)
    sensitivity = release_sensitivity(clip=privacy.clip, occurrence_cap=privacy.occurrence_cap)
    release = ReleaseSettings(
        width=privacy.release_width,
        clip=privacy.clip,
        noise_std=client_noise_std(
            privacy,
            noise_multiplier=noise_multiplier,
            sensitivity=sensitivity,
            clients=part.clients,
        ),
        noise=noise_source(privacy, client=part.client),
        projection_seed=release_projection_seed(seed=seed, client=part.client),
    )
    return PrivateGlasuClient(part, config, release=release, codec=codec, device=device)
