"""A deployed scoring session (real processes over loopback HTTP): the operator creates it with
`glasu session create --score-with`, each organisation's `glasu worker --model DIR` scores, and
the answering party (the label holder; without one, party 0) writes the model's answer with
`--predictions FILE`. Without DP, scoring the evaluation nodes with the kept models gives
exactly the answering party's predictions of the training's best evaluation pass; new customers
without any label are scored, and a partner gets the answer only where the session shares it
and the answering party's owner agreed. With DP the scoring's releases are in the service's and
every owner's ledger, an owner's lifetime cap refuses a scoring that would go past it, and a
worker that refuses a session at join stops its partners before any of them released."""

from __future__ import annotations

import csv
import dataclasses
import shutil
from collections.abc import Callable, Collection
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
from secure.aggregation import SHARE_GRID

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
ROUNDED = 1.01e-4  # a predictions file's probabilities have 4 decimals


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
    out_name: str = "scoring",
    partitions: str = "partitions",
    predictions: Collection[int] = (0,),
    session_extra: tuple[str, ...] = (),
    worker_extra: Callable[[int], list[str]] = lambda m: [],
) -> tuple[str, list[ManagedProcess]]:
    """A scoring session of the training's models over the evaluation nodes, its workers on
    ``fed.root / partitions``; the clients in ``predictions`` write them."""
    out = fed.root / out_name
    assert main(["session", "create", "--server", fed.admin.base_url, "--admin-token-file",
                 str(fed.root / "admin.token"), "--score-with", fed.session_id, "--dataset",
                 "cora", "--data-dir", str(data_dir), "--out", str(out),
                 *session_extra]) == 0  # fmt: skip
    session = (out / "session.id").read_text()
    workers = []
    for m in range(config.clients):
        args = worker_arguments(
            config, server=fed.admin.base_url, session_id=session, client=m,
            token_file=out / f"client-{m}.token", data=fed.root / partitions / f"client-{m}",
            result=out / f"client-{m}.json", secret_context=None, threads=1, passes_total=1,
        )  # fmt: skip
        args += ["--model", str(fed.root / "models" / f"{m}"), *extra, *worker_extra(m)]
        if m in predictions:
            args += ["--predictions", str(out / f"predictions-{m}.csv")]
        worker = start_process(f"scorer {m}", glasu_command(*args), out / f"client-{m}.log")
        processes.append(worker)
        workers.append(worker)
    return session, workers


def read_predictions(path: Path) -> tuple[list[str], np.ndarray, list[int]]:
    """Ids, class probabilities and predicted classes of a predictions file."""
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    classes = sum(name.startswith("probability_") for name in rows[0])
    probabilities = np.array([[float(r[f"probability_{c}"]) for c in range(classes)] for r in rows])
    return [r["id"] for r in rows], probabilities, [int(r["predicted_class"]) for r in rows]


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
    assert len(rounds) == 1  # without DP every party keeps the same round
    # one answer per customer: the answering party's (no label holder: party 0's)
    nodes, expected = read_evaluation(tmp_path / "models" / "0")
    ids, got, predicted = read_predictions(tmp_path / "scoring" / "predictions-0.csv")
    assert [int(i) for i in ids] == nodes.tolist()  # the benchmark's ids: node ids
    # as the evaluation pass computed them, to the 4 decimals a predictions file gives
    np.testing.assert_allclose(got, expected, rtol=0, atol=ROUNDED)
    assert predicted == expected.argmax(1).tolist()
    assert not (tmp_path / "scoring" / "predictions-1.csv").exists()


def without_labels(root: Path, clients: int) -> str:
    """A copy of the training's partitions whose nodes have no label at all (new customers):
    the folder's name under ``root``."""
    for m in range(clients):
        folder = root / "current" / f"client-{m}"
        shutil.copytree(root / "partitions" / f"client-{m}", folder)
        labels = np.load(folder / "labels.npy")
        np.save(folder / "labels.npy", np.full_like(labels, -1))
    return "current"


@pytest.mark.slow  # over 15 s on 2 cores: the full run (README) has it
def test_new_customers_without_labels_are_scored_and_a_partner_gets_the_answer_as_agreed(
    tmp_path: Path, cora, data_dir: Path, processes: list[ManagedProcess]
) -> None:
    fed = train(PLAIN, cora, tmp_path, processes)
    current = without_labels(tmp_path, PLAIN.clients)
    # shared with the partner: party 0's owner agrees, the partner writes the same answer
    session, workers = score(
        fed, PLAIN, data_dir, processes, partitions=current, predictions=(0, 1),
        session_extra=("--share-predictions", "label-holder"),
        worker_extra=lambda m: ["--share-predictions"] if m == 0 else [],
    )  # fmt: skip
    for worker in workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    nodes, expected = read_evaluation(tmp_path / "models" / "0")
    answer = read_predictions(tmp_path / "scoring" / "predictions-0.csv")
    shared = read_predictions(tmp_path / "scoring" / "predictions-1.csv")
    assert [int(i) for i in answer[0]] == nodes.tolist() and shared[0] == answer[0]
    np.testing.assert_allclose(answer[1], expected, rtol=0, atol=ROUNDED)
    # through the service on the share grid: to half its step (then rounded), the class exactly
    np.testing.assert_allclose(shared[1], answer[1], rtol=0, atol=SHARE_GRID / 2 + ROUNDED)
    assert shared[2] == answer[2] == expected.argmax(1).tolist()
    # counted in the answering party's ledger before it left (not a noisy release: no epsilon)
    for m, shared_rows in ((0, len(nodes)), (1, 0)):
        with OwnerLedger(tmp_path / current / f"client-{m}" / LEDGER_FILENAME) as ledger:
            assert ledger.predictions_shared(session) == shared_rows
            assert ledger.releases(session_id=session) == 0
    own = read_evaluation(tmp_path / "models" / "1")[1]
    assert shared[2] != own.argmax(1).tolist()  # not the partner's own head


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

    # a worker that refuses at join (party 0's owner did not agree to share its predictions)
    # stops its partner before anything is released: no row in any owner's ledger
    session, workers = score(
        fed, PRIVATE, data_dir, processes, extra=LIFETIME_16, out_name="scoring-shared",
        session_extra=("--share-predictions", "label-holder"),
    )  # fmt: skip
    assert workers[0].process.wait(timeout=600) == 6, workers[0].tail()
    assert "has not agreed" in workers[0].tail()
    assert workers[1].process.wait(timeout=600) == 3, workers[1].tail()
    assert "client 0 refused it" in workers[1].tail()
    assert fed.admin.session(session)["state"] == "closed"
    for m in range(PRIVATE.clients):
        with OwnerLedger(tmp_path / "partitions" / f"client-{m}" / LEDGER_FILENAME) as ledger:
            assert ledger.releases(session_id=session) == 0
