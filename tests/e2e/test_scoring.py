"""A deployed scoring session (real processes over loopback HTTP): the operator creates it with
`glasu session create --score-with`, each organisation's `glasu worker --model DIR
--predictions FILE` scores; without DP, scoring the evaluation nodes with the kept models gives
exactly the predictions of the training's best evaluation pass, and with DP the scoring's
releases are in the service's and every owner's ledger, and an owner's lifetime cap refuses a
scoring that would go past it."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from e2e_kit import Federation, start_federation

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process
from clients.local.session import worker_arguments
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.artefact import load_model, read_evaluation
from models.config import TrainConfig

pytestmark = pytest.mark.e2e

PLAIN = TrainConfig(
    clients=2, rounds=6, eval_every=2, hidden=16, encryption="none", dp=False, seed=0,
    device="cpu",
)  # fmt: skip
PRIVATE = dataclasses.replace(PLAIN, dp=True, epsilon=4.0)
# precomputed propagation: every worker propagates its own table when it starts, to train and
# to score alike
SIGN = dataclasses.replace(PLAIN, backbone="sign", hops=2, layers=1, agg_layers=1)
LIFETIME_16 = ("--max-lifetime-epsilon", "16")


def train(config: TrainConfig, cora, root: Path, processes: list[ManagedProcess]) -> Federation:
    models = root / "models"
    fed = start_federation(
        config, cora, root, processes, extra=lambda m: ["--model-out", str(models / f"{m}")]
    )
    for worker in fed.workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    return fed


def score(
    fed: Federation,
    config: TrainConfig,
    data_dir: Path,
    processes: list[ManagedProcess],
    *,
    extra: tuple[str, ...] = (),
) -> tuple[str, list[ManagedProcess]]:
    out = fed.root / "scoring"
    assert main(["session", "create", "--server", fed.admin.base_url, "--admin-token-file",
                 str(fed.root / "admin.token"), "--score-with", fed.session_id, "--dataset",
                 "cora", "--data-dir", str(data_dir), "--out",
                 str(out)]) == 0  # fmt: skip
    session = (out / "session.id").read_text()
    workers = []
    for m in range(config.clients):
        args = worker_arguments(
            config, server=fed.admin.base_url, session_id=session, client=m,
            token_file=out / f"client-{m}.token", data=fed.root / "partitions" / f"client-{m}",
            result=out / f"client-{m}.json", secret_context=None, threads=1, passes_total=1,
        )  # fmt: skip
        args += ["--model", str(fed.root / "models" / f"{m}")]
        args += ["--predictions", str(out / f"predictions-{m}.csv"), *extra]
        worker = start_process(f"scorer {m}", glasu_command(*args), out / f"client-{m}.log")
        processes.append(worker)
        workers.append(worker)
    return session, workers


@pytest.mark.slow  # over 15 s on 2 cores: the full run (README) has it
@pytest.mark.parametrize("config", [PLAIN, SIGN], ids=["gcnii", "sign"])
def test_scoring_the_evaluation_nodes_reproduces_the_best_evaluation_pass(
    tmp_path: Path, cora, data_dir: Path, processes: list[ManagedProcess], config: TrainConfig
) -> None:
    fed = train(config, cora, tmp_path, processes)
    _, workers = score(fed, config, data_dir, processes)
    for worker in workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    rounds = set()
    for m in range(config.clients):
        model = load_model(tmp_path / "models" / f"{m}")
        assert model.manifest["model"]["backbone"] == config.backbone
        rounds.add(model.manifest["best"]["round"])
        nodes, expected = read_evaluation(tmp_path / "models" / f"{m}")
        with (tmp_path / "scoring" / f"predictions-{m}.csv").open() as handle:
            rows = list(csv.DictReader(handle))
        assert [int(r["id"]) for r in rows] == nodes.tolist()  # the benchmark's ids: node ids
        got = np.array([[float(r[f"probability_{c}"]) for c in range(7)] for r in rows])
        # as the evaluation pass computed them, to the 4 decimals a predictions file gives
        np.testing.assert_allclose(got, expected, rtol=0, atol=1.01e-4)
        assert [int(r["predicted_class"]) for r in rows] == expected.argmax(1).tolist()
    assert len(rounds) == 1  # without DP every party keeps the same round


@pytest.mark.slow  # over 15 s on 2 cores: the full run (README) has it
def test_private_scoring_is_in_both_ledgers_and_an_owner_s_cap_refuses_it(
    tmp_path: Path, cora, data_dir: Path, processes: list[ManagedProcess]
) -> None:
    fed = train(PRIVATE, cora, tmp_path, processes)
    trained = fed.passes_total
    # the owners allow more over the lifetime than one session (glasu train's workers do not)
    session, workers = score(fed, PRIVATE, data_dir, processes, extra=LIFETIME_16)
    for worker in workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    assert fed.admin.privacy(session)["releases"] == 1  # one pass: one release
    for m in range(PRIVATE.clients):
        with OwnerLedger(tmp_path / "partitions" / f"client-{m}" / LEDGER_FILENAME) as ledger:
            assert ledger.releases(session_id=fed.session_id) == trained
            assert ledger.releases(session_id=session) == 1
            spent = ledger.epsilon(delta=PRIVATE.delta, accountant="rdp")
    # an owner whose lifetime cap is what it has spent: the next scoring is refused (exit 6)
    (tmp_path / "scoring").rename(tmp_path / "scoring-1")
    _, refused = score(
        fed, PRIVATE, data_dir, processes, extra=("--max-lifetime-epsilon", repr(spent))
    )
    for worker in refused:
        assert worker.process.wait(timeout=600) == 6, worker.tail()
        assert "lifetime" in worker.tail()
