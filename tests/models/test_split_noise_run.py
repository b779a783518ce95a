"""An in-process run with split noise (docs/privacy.md section 11): each of the three parties
draws its share of the noise from the discrete Gaussian source through the existing DpRelease,
shares travel under CKKS, and the run summary accounts and names each adversary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from models.config import TrainConfig
from models.keeper import privacy_spent
from models.trainer import train_inprocess
from secure.aggregation import SHARE_GRID
from secure.discrete_gaussian import DiscreteGaussianNoise


@pytest.mark.slow  # about 17 s here: a CKKS context and a Cora evaluation pass
def test_a_run_with_split_noise_draws_each_party_s_share_on_the_grid(
    monkeypatch: pytest.MonkeyPatch, cora
) -> None:
    drawn: list[tuple[float, np.ndarray]] = []
    sample = DiscreteGaussianNoise.sample

    def spy(self: DiscreteGaussianNoise, shape, *, std: float) -> np.ndarray:
        values = sample(self, shape, std=std)
        drawn.append((std, values))
        return values

    monkeypatch.setattr(DiscreteGaussianNoise, "sample", spy)
    config = TrainConfig(
        encryption="ckks", split_noise=True, epsilon=4.0, rounds=1, eval_every=0, hidden=16,
        batch_size=8, eval_fanout=3,
    )  # fmt: skip
    summary = train_inprocess(config, dataset=cora, progress=False)
    privacy = config.session_privacy(clients=3, passes_total=2)
    assert privacy is not None and privacy.split_noise
    std = privacy.release_noise_std(config.release_width)
    # two passes (a training round, the evaluation) x three parties, cryptographic noise
    assert len(drawn) == 6 and all(s == std for s, _ in drawn)
    assert std == pytest.approx(
        privacy.noise_multiplier * privacy.grid_sensitivity(16) / math.sqrt(2), rel=1e-12
    )
    for _, values in drawn:
        assert np.array_equal(values / SHARE_GRID, np.round(values / SHARE_GRID))
    everything = np.concatenate([v.ravel() for _, v in drawn])
    assert np.std(everything) == pytest.approx(std, rel=0.05)
    report = summary.privacy
    assert report is not None and report["split_noise"] is True
    assert report["noise"].startswith("cryptographic")
    assert report["ledger_noise_multiplier"] == pytest.approx(privacy.noise_multiplier)
    keys = [a["key"] for a in report["adversaries"]]
    assert keys == ["service", "peer", "service_peer", "colluding", "group"]
    assert report["split"]["releases"] == report["releases"] == 2
    assert any("colluding peer" in line for line in report["adversary_lines"])
    assert summary.config["split_noise"] is True


def test_a_kept_model_says_against_whom_split_noise_held() -> None:
    config = TrainConfig(encryption="ckks", split_noise=True, epsilon=4.0, rounds=10)
    privacy = config.session_privacy(clients=3, passes_total=10)
    assert privacy is not None
    spent = privacy_spent(
        privacy, epsilon=1.0, delta=1e-6, accountant="rdp", releases=1, source="test"
    )
    assert spent["against"] == "any one peer, alone or with the service (split noise)"
    unsplit = TrainConfig(encryption="ckks", epsilon=4.0, rounds=10)
    assert unsplit.privacy_request() is not None and "split_noise" not in (
        unsplit.privacy_request() or {}
    )
    assert (config.privacy_request() or {})["split_noise"] is True
