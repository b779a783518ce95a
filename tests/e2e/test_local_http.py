"""`glasu train --transport http` for real: a uvicorn service and three worker processes on
loopback, a few rounds on Cora."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients.local.federation import train_over_http
from models.config import TrainConfig
from models.layout import layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV
from models.run_summary import RunSummary
from models.trainer import train_inprocess

pytestmark = pytest.mark.e2e


@pytest.mark.slow  # 12-40 s: a service and three worker processes
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
    assert_token_files_are_private(tmp_path, clients=config.clients)


@pytest.mark.slow  # a service and three worker processes, each propagating its features
def test_a_sign_run_over_http_equals_the_in_process_run(cora, tmp_path: Path) -> None:
    """The workers get --backbone sign --hops 2 and propagate as the in-process clients do."""
    config = TrainConfig(
        backbone="sign", hops=2, layers=2, agg_layers=2, rounds=4, eval_every=2, hidden=32,
        encryption="none", dp=False, seed=5,
    )  # fmt: skip
    over_http = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    in_process = train_inprocess(config, dataset=cora, progress=False)
    assert over_http.config["backbone"] == "sign" and over_http.config["hops"] == 2
    assert [h.test_accuracy for h in over_http.history] == pytest.approx(
        [h.test_accuracy for h in in_process.history], abs=1e-9
    )


def assert_token_files_are_private(work_dir: Path, *, clients: int) -> None:
    """One token file per client plus the admin's, each readable by its owner only."""
    tokens = sorted(work_dir.glob("*.token"))
    expected = ["admin.token", *(f"client-{m}.token" for m in range(clients))]
    assert sorted(p.name for p in tokens) == sorted(expected)
    for path in tokens:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name
        assert path.read_text(), path.name


DP_CONFIG = TrainConfig(
    rounds=3,
    eval_every=1,
    hidden=32,
    encryption="none",
    dp=True,
    epsilon=8.0,
    noise_seed=13,  # test-only: the same noise in both transports
    seed=5,
)


@dataclass(frozen=True)
class DpRuns:
    over_http: RunSummary
    in_process: RunSummary
    work_dir: Path


@pytest.fixture(scope="module")
def dp_runs(cora, tmp_path_factory: pytest.TempPathFactory) -> DpRuns:
    """One tiny DP run (encryption off, fixed noise seed) over each transport."""
    work_dir = tmp_path_factory.mktemp("dp-http")
    with pytest.MonkeyPatch.context() as patch:  # the workers inherit it
        patch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
        over_http = train_over_http(
            DP_CONFIG, layout_federation(DP_CONFIG, cora), cora, progress=False, work_dir=work_dir
        )
        in_process = train_inprocess(DP_CONFIG, dataset=cora, progress=False)
    return DpRuns(over_http, in_process, work_dir)


def history_values(report: RunSummary) -> list[float | None]:
    """Round, accuracies and epsilon of every evaluation, flat (for pytest.approx)."""
    return [
        value
        for h in report.history
        for value in (h.round, h.val_accuracy, h.test_accuracy, h.epsilon)
    ]


@pytest.mark.slow  # 16-36 s: a service and three worker processes, then the in-process run
def test_http_run_equals_inprocess_run_with_dp(dp_runs: DpRuns) -> None:
    """DP on, encryption off, a fixed noise seed: the workers draw the same noise as the
    in-process clients, so both transports train the same models."""
    over_http, in_process = dp_runs.over_http, dp_runs.in_process
    assert over_http.privacy is not None and in_process.privacy is not None
    assert over_http.config["transport"] == "http" and over_http.config["encryption"] == "none"
    assert over_http.privacy["noise_multiplier"] == pytest.approx(
        in_process.privacy["noise_multiplier"], rel=1e-12
    )
    assert over_http.privacy["releases"] == in_process.privacy["releases"] > 0
    assert len(over_http.history) == len(in_process.history) == DP_CONFIG.rounds
    assert history_values(over_http) == pytest.approx(history_values(in_process), abs=1e-9)
    assert over_http.test_accuracy == pytest.approx(in_process.test_accuracy, abs=1e-9)
    assert over_http.val_accuracy == pytest.approx(in_process.val_accuracy, abs=1e-9)
    assert over_http.final_test_accuracy == pytest.approx(in_process.final_test_accuracy, abs=1e-9)
    assert over_http.best_round == in_process.best_round
    # the party-alone reference: in both reports, trained identically
    assert in_process.reference_test_accuracy is not None and in_process.gain is not None
    assert over_http.reference_test_accuracy == pytest.approx(
        in_process.reference_test_accuracy, abs=1e-9
    )
    assert over_http.gain == pytest.approx(in_process.gain, abs=1e-9)
    assert_token_files_are_private(dp_runs.work_dir, clients=DP_CONFIG.clients)


@pytest.mark.slow  # shares dp_runs with the test above
def test_http_and_inprocess_histories_report_the_same_loss(dp_runs: DpRuns) -> None:
    losses_over_http = [h.loss for h in dp_runs.over_http.history]
    # the same quantity (mean training loss of the recent rounds, over clients), summed in
    # another order: in process per round over clients, over HTTP per client over rounds
    in_process = [h.loss for h in dp_runs.in_process.history]
    assert losses_over_http == pytest.approx(in_process, rel=1e-6)


@pytest.mark.slow  # 13-20 s: a service and three worker processes
def test_secure_run_stops_when_the_budget_is_spent(cora, tmp_path: Path) -> None:
    """Encryption and DP on; z given and a target that only a few releases fit: the service
    refuses the release that would exceed it, the workers stop cleanly and the report says so."""
    config = TrainConfig(
        rounds=12,
        eval_every=1,
        hidden=32,
        noise_multiplier=3.0,
        epsilon=5.0,
        shared_noise=True,  # the ledger then composes z sqrt(2/3): the numbers below
        seed=5,
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


@pytest.mark.slow  # 12-40 s: a service and three worker processes
def test_a_label_holder_run_over_http_equals_the_in_process_run(cora, tmp_path: Path) -> None:
    """GLASU B.2 through the service: the passive workers' folders hold no label and no split,
    the broadcast gradient travels as a sum at layer L + 1, and the run is the in-process one."""
    config = TrainConfig(
        rounds=4, eval_every=2, hidden=32, encryption="none", dp=False, seed=5, label_holder=1
    )
    over_http = train_over_http(
        config, layout_federation(config, cora), cora, progress=False, work_dir=tmp_path
    )
    in_process = train_inprocess(config, dataset=cora, progress=False)
    assert [h.test_accuracy for h in over_http.history] == pytest.approx(
        [h.test_accuracy for h in in_process.history], abs=1e-9
    )
    assert over_http.config["label_holder"] == 1
    for m in range(config.clients):
        folder = tmp_path / "partitions" / f"client-{m}"
        held = {p.name for p in folder.iterdir()}
        expected = {"labels.npy", "train.npy", "val.npy", "test.npy"} if m == 1 else set()
        assert held & {"labels.npy", "train.npy", "val.npy", "test.npy"} == expected, m
