"""`glasu train --transport http` for real: a uvicorn service and three worker processes on
loopback, a few rounds on Cora."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.cli.local_federation import train_over_http
from models.config import TrainConfig
from models.layout import layout_federation
from models.trainer import train_inprocess

pytestmark = pytest.mark.e2e


def test_http_run_equals_inprocess_run(cora, tmp_path: Path) -> None:
    config = TrainConfig(rounds=4, eval_every=2, hidden=32, encryption="none", dp=False, seed=5)
    over_http = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    in_process = train_inprocess(config, dataset=cora, progress=False)
    assert [h.test_accuracy for h in over_http.history] == pytest.approx(
        [h.test_accuracy for h in in_process.history], abs=1e-9
    )
    assert over_http.test_accuracy == pytest.approx(in_process.test_accuracy, abs=1e-9)
    # bytes are the bodies the workers actually sent and received
    assert over_http.bytes_up > 0 and over_http.bytes_down > over_http.history[0].training_bytes
    assert over_http.config["transport"] == "http" and over_http.privacy is None
    assert not list(tmp_path.glob("*.token")) or all(
        (p.stat().st_mode & 0o077) == 0 for p in tmp_path.glob("*.token")
    )


def test_secure_run_stops_when_the_budget_is_spent(cora, tmp_path: Path) -> None:
    """Encryption and DP on; z given and a target that only a few releases fit: the service
    refuses the release that would exceed it, the workers stop cleanly and the report says so."""
    config = TrainConfig(
        rounds=12, eval_every=1, hidden=32, noise_multiplier=3.0, epsilon=5.0, seed=5
    )
    report = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    assert report.stopped_early == "budget-exhausted"
    privacy = report.privacy
    assert privacy is not None and privacy["enabled"]
    assert privacy["releases"] == 5  # of 24 planned: epsilon 4.71 after 5, 5.22 after 6
    assert privacy["epsilon"] <= privacy["epsilon_target"] == 5.0
    assert report.config["encryption"] == "ckks"
    assert report.history and report.history[-1].epsilon is not None
    assert report.history[-1].epsilon <= 5.0
