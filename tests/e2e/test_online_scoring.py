"""Online scoring against real processes, with docs/data.md's commands ("Online scoring") as
written but for this run's server, files and ids: `glasu serve`, three `glasu worker --online`
that keep their models loaded, and the answering party's `glasu ask`.
Each request is one scoring session (one release) counted once in each owner's ledger; a
request past an owner's cap is refused at join with nothing released; an id the answering
party's alignment does not hold is refused by name before anything is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e_kit import Federation, start_federation

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process, stop_all
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.config import TrainConfig
from models.layout import eval_nodes
from secure.wire.sessions import request_session_id
from tests.clients.cli.test_data_doc import DOC, invocations

pytestmark = pytest.mark.e2e

PRIVATE = TrainConfig(
    clients=3, rounds=4, eval_every=2, hidden=16, encryption="none", dp=True, epsilon=4.0,
    seed=0, device="cpu",
)  # fmt: skip
LIFETIME_16 = ("--max-lifetime-epsilon", "16")


def documented() -> dict[str, list[str]]:
    """docs/data.md's online commands, by what they do: "create", "worker 0", "worker 1" (the
    telco's worker is "as the insurer's, --client 2"), "ask"."""
    text = DOC.read_text()
    commands = invocations(text[text.index("### Online scoring") :])
    named = {}
    for argv in commands:
        if argv[0] == "worker":
            named[f"worker {argv[argv.index('--client') + 1]}"] = argv
        else:
            named["create" if argv[0] == "session" else argv[0]] = argv
    assert sorted(named) == ["ask", "create", "worker 0", "worker 1"], commands
    return named


def run_here(
    argv: list[str], values: dict[str, list[str]], swapped: dict[str, list[str]] | None = None
) -> list[str]:
    """``argv`` as written, but every flag in ``values`` with this run's value(s) instead
    (no value: the flag left out: no TLS and no CKKS on this loopback run), and every flag in
    ``swapped`` with its value replaced by those arguments."""
    here, index = [], 0
    while index < len(argv):
        flag = argv[index]
        taken = 1
        while index + taken < len(argv) and not argv[index + taken].startswith("--"):
            taken += 1
        if flag in (swapped or {}):
            here += (swapped or {})[flag]
        elif flag in values:
            here += [flag, *values[flag]] if values[flag] else []
        else:
            here += argv[index : index + taken]
        index += taken
    return here


class Online:
    """The documented online flow on this test's federation (Cora's three benchmark parties:
    party m's data, model and token where the page names the bank's, the insurer's)."""

    def __init__(self, fed: Federation, data_dir: Path) -> None:
        self.fed, self.out, self.docs = fed, fed.root / "online", documented()
        self.common = {"--server": [fed.admin.base_url], "--ca-file": [], "--secret-context": []}
        self.data_dir = data_dir

    def create(self) -> str:
        values = {**self.common, "--admin-token-file": [str(self.fed.root / "admin.token")],
                  "--score-with": [self.fed.session_id], "--out": [str(self.out)]}  # fmt: skip
        # benchmark parties: the dataset's evaluation nodes instead of an alignment's nodes
        dataset = ["--dataset", "cora", "--data-dir", str(self.data_dir)]
        assert main(run_here(self.docs["create"], values, {"--alignment": dataset})) == 0
        return (self.out / "session.id").read_text()

    def worker(self, m: int, processes: list[ManagedProcess], *cap: str) -> ManagedProcess:
        written = self.docs["worker 0" if m == 0 else "worker 1"]
        values = {**self.common, "--session": [(self.out / "session.id").read_text()],
                  "--client": [str(m)], "--token-file": [str(self.out / f"client-{m}.token")],
                  "--data": [str(self.fed.root / "partitions" / f"client-{m}")],
                  "--model": [str(self.fed.root / "models" / f"{m}")],
                  "--predictions": [str(self.out / "answers")]}  # fmt: skip
        argv = [*run_here(written, values), "--threads", "1", *LIFETIME_16, *cap]
        log = self.out / f"client-{m}-{len(cap)}.log"
        worker = start_process(f"online {m}", glasu_command(*argv), log)
        processes.append(worker)
        return worker

    def ask(self, ids: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
        capsys.readouterr()  # what earlier commands printed
        values = {**self.common, "--session": [(self.out / "session.id").read_text()],
                  "--token-file": [str(self.out / "client-0.token")],
                  "--data": [str(self.fed.root / "partitions" / "client-0")], "--ids": ids,
                  "--predictions": [str(self.out / "answers")]}  # fmt: skip
        code = main(run_here(self.docs["ask"], values))
        return code, capsys.readouterr()


def releases(fed: Federation, m: int, session_id: str) -> int:
    with OwnerLedger(fed.root / "partitions" / f"client-{m}" / LEDGER_FILENAME) as ledger:
        return ledger.releases(session_id=session_id)


@pytest.mark.slow  # a training and three long-running workers: over 15 s on 2 cores
def test_online_session_answers_requests_each_counted_once_refused_past_a_cap(
    tmp_path: Path,
    cora,
    data_dir: Path,
    processes: list[ManagedProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = tmp_path / "models"
    fed = start_federation(
        PRIVATE, cora, tmp_path, processes, extra=lambda m: ["--model-out", str(models / f"{m}")]
    )
    for worker in fed.workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    online_flow = Online(fed, data_dir)
    online = online_flow.create()
    workers = [online_flow.worker(m, processes) for m in range(3)]
    # two requests (evaluation nodes: the session's), in the asked order, each one release
    # in every owner's ledger
    scored = [str(n) for n in eval_nodes(cora)[-4:]]
    asked = [[scored[1], scored[0]], [scored[2]]]
    for number, ids in enumerate(asked, start=1):
        code, printed = online_flow.ask(ids, capsys)
        assert code == 0, printed.err
        lines = printed.out.splitlines()
        assert [line.split(",")[0].strip('"') for line in lines[1:]] == ids
        request = request_session_id(online, number)
        assert fed.admin.privacy(request)["releases"] == 1
        for m in range(3):
            assert releases(fed, m, request) == 1
    # an id party 0's alignment does not hold: refused by name, nothing asked
    code, printed = online_flow.ask([scored[3], "no-such-customer"], capsys)
    assert code == 1 and "'no-such-customer'" in printed.err
    # party 1's owner lowers its lifetime cap to what it has spent: the next request is refused
    # at join, nothing released by anyone, and the online workers go on
    stop_all([workers[1]])
    with OwnerLedger(tmp_path / "partitions" / "client-1" / LEDGER_FILENAME) as ledger:
        spent = ledger.epsilon(delta=PRIVATE.delta, accountant="rdp")
    workers[1] = online_flow.worker(1, processes, "--max-lifetime-epsilon", repr(spent))
    code, printed = online_flow.ask([scored[3]], capsys)
    assert code == 6 and "lifetime" in printed.err, printed.err
    refused = request_session_id(online, 3)
    for m in range(3):
        assert releases(fed, m, refused) == 0
    assert main(["session", "close", "--server", fed.admin.base_url, "--admin-token-file",
                 str(tmp_path / "admin.token"), "--session", online]) == 0  # fmt: skip
    for worker in workers:
        assert worker.process.wait(timeout=120) == 0, worker.tail()
    # the restarted worker took up the requests from the next one: the answered stay answered
    for number in (1, 2):
        assert fed.admin.session(request_session_id(online, number))["state"] == "finished"
