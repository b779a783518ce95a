"""Online scoring against real processes (docs/data.md, "Online scoring"): `glasu serve`, three
`glasu worker --online` that keep their models loaded, and the answering party's `glasu ask`.
Each request is one scoring session (one release) counted once in each owner's ledger; a
request past an owner's cap is refused at join with nothing released; an id the answering
party's alignment does not hold is refused by name before anything is asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_kit import Federation, start_federation

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process, stop_all
from clients.local.session import worker_arguments
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.config import TrainConfig
from models.layout import eval_nodes
from secure.wire.sessions import request_session_id

pytestmark = pytest.mark.e2e

PRIVATE = TrainConfig(
    clients=3, rounds=4, eval_every=2, hidden=16, encryption="none", dp=True, epsilon=4.0,
    seed=0, device="cpu",
)  # fmt: skip
LIFETIME_16 = ("--max-lifetime-epsilon", "16")


def online_worker(
    fed: Federation, out: Path, m: int, processes: list[ManagedProcess], *cap: str
) -> ManagedProcess:
    """Client ``m``'s `glasu worker --online` (party 0 answers: no label holder)."""
    session = (out / "session.id").read_text()
    args = worker_arguments(
        PRIVATE, server=fed.admin.base_url, session_id=session, client=m,
        token_file=out / f"client-{m}.token", data=fed.root / "partitions" / f"client-{m}",
        result=out / f"client-{m}.json", secret_context=None, threads=1, passes_total=1,
    )  # fmt: skip
    args += ["--online", "--model", str(fed.root / "models" / f"{m}"), *cap]
    if m == 0:
        args += ["--predictions", str(out / "answers")]
    worker = start_process(f"online {m}", glasu_command(*args), out / f"client-{m}-{len(cap)}.log")
    processes.append(worker)
    return worker


def ask(fed: Federation, out: Path, ids: list[str], capsys: pytest.CaptureFixture[str]):
    code = main(["ask", "--server", fed.admin.base_url, "--session",
                 (out / "session.id").read_text(), "--token-file", str(out / "client-0.token"),
                 "--data", str(fed.root / "partitions" / "client-0"), "--ids", *ids,
                 "--predictions", str(out / "answers"), "--wait-seconds", "300"])  # fmt: skip
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
    out = tmp_path / "online"
    assert main(["session", "create", "--server", fed.admin.base_url, "--admin-token-file",
                 str(tmp_path / "admin.token"), "--score-with", fed.session_id, "--dataset",
                 "cora", "--data-dir", str(data_dir), "--online", "--out", str(out)]) == 0  # fmt: skip
    online = (out / "session.id").read_text()
    workers = [online_worker(fed, out, m, processes, *LIFETIME_16) for m in range(3)]
    # two requests (evaluation nodes: the session's), in the asked order, each one release
    # in every owner's ledger
    scored = [str(n) for n in eval_nodes(cora)[-4:]]
    asked = [[scored[1], scored[0]], [scored[2]]]
    for number, ids in enumerate(asked, start=1):
        code, printed = ask(fed, out, ids, capsys)
        assert code == 0, printed.err
        lines = printed.out.splitlines()
        assert [line.split(",")[0].strip('"') for line in lines[1:]] == ids
        request = request_session_id(online, number)
        assert fed.admin.privacy(request)["releases"] == 1
        for m in range(3):
            assert releases(fed, m, request) == 1
    # an id party 0's alignment does not hold: refused by name, nothing asked
    code, printed = ask(fed, out, [scored[3], "no-such-customer"], capsys)
    assert code == 1 and "'no-such-customer'" in printed.err
    # party 1's owner lowers its lifetime cap to what it has spent: the next request is refused
    # at join, nothing released by anyone, and the online workers go on
    stop_all([workers[1]])
    with OwnerLedger(tmp_path / "partitions" / "client-1" / LEDGER_FILENAME) as ledger:
        spent = ledger.epsilon(delta=PRIVATE.delta, accountant="rdp")
    workers[1] = online_worker(fed, out, 1, processes, "--max-lifetime-epsilon", repr(spent))
    code, printed = ask(fed, out, [scored[3]], capsys)
    assert code == 6 and "lifetime" in printed.err, printed.err
    refused = request_session_id(online, 3)
    for m in range(3):
        assert releases(fed, m, refused) == 0
    assert main(["session", "close", "--server", fed.admin.base_url, "--admin-token-file",
                 str(tmp_path / "admin.token"), "--session", online]) == 0  # fmt: skip
    for worker in workers:
        assert worker.process.wait(timeout=120) == 0, worker.tail()
