"""docs/data.md's deployed flow with new customers, in real processes on loopback: the
organisations' tables prepared and aligned (`glasu align create`, `glasu align run`), a training
session with the bank as the label holder whose workers keep their models (`--model-out`), then
the current tables with new customers (no label anywhere) prepared and aligned afresh, a scoring
session `--score-with` the training over that alignment, and each organisation's worker with
its model: the bank's writes the model's answer for every shared customer, the new ones
included; a partner's writes nothing."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process
from tests.clients.cli.test_align_cmd import run_alignment, server  # noqa: F401 (a fixture)
from tests.clients.cli.test_owner_ledger_flows import (
    NEW_CUSTOMERS,
    PARTIES,
    prepare,
    write_tables,
)

pytestmark = pytest.mark.e2e

TRAINING = ("--rounds", "2", "--eval-every", "2", "--batch-size", "16", "--hidden", "8",
            "--epsilon", "2", "--no-he")  # fmt: skip


def create_session(service: dict[str, str], out: Path, *args: str) -> str:
    assert main(["session", "create", "--server", service["url"], "--admin-token-file",
                 service["token_file"], *args, "--out", str(out)]) == 0  # fmt: skip
    return (out / "session.id").read_text()


def run_workers(
    service: dict[str, str], session: Path, folders: list[Path], extra: dict[int, list[str]]
) -> list[ManagedProcess]:
    """Each organisation's `glasu worker` of the session written to ``session``."""
    workers = []
    for m, folder in enumerate(folders):
        args = ["worker", "--server", service["url"], "--session",
                (session / "session.id").read_text(), "--client", str(m), "--token-file",
                str(session / f"client-{m}.token"), "--data", str(folder), "--device", "cpu",
                "--quiet", *extra.get(m, [])]  # fmt: skip
        workers.append(
            start_process(f"worker {m}", glasu_command(*args), session / f"client-{m}.log")
        )
    return workers


def finished(workers: list[ManagedProcess]) -> None:
    for worker in workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()


@pytest.mark.slow  # two alignments, a training and a scoring, each with a worker per party
def test_the_deployed_flow_scores_new_customers_without_labels(
    server: dict[str, str],  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    write_tables(tmp_path / "tables")
    prepared = prepare(None, tmp_path / "tables", tmp_path / "prepared")
    aligned = run_alignment(server, tmp_path / "first", prepared)
    training = tmp_path / "session"
    create_session(server, training, "--alignment", aligned, "--label-holder", "0", *TRAINING)
    models = {m: ["--model-out", str(tmp_path / "models" / party)] for m, party in
              enumerate(PARTIES)}  # fmt: skip
    finished(run_workers(server, training, prepared, models))

    write_tables(tmp_path / "tables-now", new_customers=NEW_CUSTOMERS)
    current = prepare(None, tmp_path / "tables-now", tmp_path / "current")
    realigned = run_alignment(server, tmp_path / "again", current)
    scoring = tmp_path / "scoring"
    create_session(server, scoring, "--score-with", (training / "session.id").read_text(),
                   "--alignment", realigned)  # fmt: skip
    with_models = {m: ["--model", str(tmp_path / "models" / party)] for m, party in
                   enumerate(PARTIES)}  # fmt: skip
    answer = tmp_path / "predictions" / "bank.csv"
    with_models[0] += ["--predictions", str(answer)]
    finished(run_workers(server, scoring, current, with_models))
    with answer.open() as handle:
        ids = [row["id"] for row in csv.DictReader(handle)]
    assert {f"new-{i}" for i in range(NEW_CUSTOMERS)} <= set(ids)  # no label, scored
    assert len(ids) == len(set(ids)) == 80 + NEW_CUSTOMERS  # every shared customer, once
    assert sorted(path.name for path in (tmp_path / "predictions").iterdir()) == ["bank.csv"]
