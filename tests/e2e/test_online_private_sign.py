"""Online scoring of a kept private sign model against real processes (a uvicorn service,
three ``glasu worker`` processes on loopback, Cora): a release session keeps every party's
model, then docs/data.md's online commands ("Online scoring") as written but for this run's
server, files and ids. Each signed request is answered by the answering party's kept head
(``glasu ask`` prints it) and is post-processing of the kept releases: the service states no
release for it, every owner's ledger records it as a session with no release naming the
training; a replayed signed request is refused at join by every worker."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from e2e_kit import Federation

from clients.cli.main import main
from clients.local.processes import ManagedProcess
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.layout import eval_nodes
from secure.wire.sessions import request_session_id
from tests.e2e.test_online_scoring import post_request, trained_and_online
from tests.e2e.test_private_sign_http import UNSEEDED

pytestmark = pytest.mark.e2e

# the private sign design's release session (one release, then local rounds), lean
LEAN_SIGN = dataclasses.replace(UNSEEDED, rounds=4, eval_every=2)


def ledger_of(fed: Federation, m: int) -> OwnerLedger:
    return OwnerLedger(fed.root / "partitions" / f"client-{m}" / LEDGER_FILENAME)


@pytest.mark.slow  # a release session and three long-running workers: over 15 s on 2 cores
def test_a_kept_private_sign_model_answers_signed_requests_for_nothing_and_refuses_a_replay(
    tmp_path: Path,
    cora,
    data_dir: Path,
    processes: list[ManagedProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    fed, online_flow, workers = trained_and_online(LEAN_SIGN, cora, tmp_path, data_dir, processes)
    online = (online_flow.out / "session.id").read_text()
    assert fed.admin.session(online)["config"]["model_kind"] == "release"
    trained = {}
    for m in range(LEAN_SIGN.clients):
        with ledger_of(fed, m) as ledger:
            trained[m] = ledger.releases()
    assert trained == {0: 0, 1: 1, 2: 1}  # the label holder released nothing
    scored = [str(n) for n in eval_nodes(cora)[-3:]]

    code, printed = online_flow.ask([scored[1], scored[0]], capsys)
    assert code == 0, printed.err
    lines = printed.out.splitlines()
    assert [line.split(",")[0].strip('"') for line in lines[1:]] == [scored[1], scored[0]]
    first = request_session_id(online, 1)
    # a service that opens the signed request again (anyone with the asker's token could)
    asker = (online_flow.out / "client-0.token").read_text().strip()
    signed = fed.admin.session(first)["config"]["request_signature"]
    replayed = post_request(fed, online, asker, [int(scored[0]), int(scored[1])], signed)
    # the party's next signed request is answered: every worker has passed the replay by then
    code, printed = online_flow.ask([scored[2]], capsys)
    assert code == 0, printed.err
    assert printed.out.splitlines()[1].split(",")[0].strip('"') == scored[2]
    second = request_session_id(online, 3)

    for request in (first, second):
        status = fed.admin.session(request)
        assert status["state"] == "finished"
        assert status["config"]["model_kind"] == "release"
        stated = fed.admin.privacy(request)
        assert (stated["releases"], stated["epsilon"], stated["epsilon_planned"]) == (0, 0.0, 0.0)
        for m in range(LEAN_SIGN.clients):
            with ledger_of(fed, m) as ledger:
                assert ledger.releases(session_id=request) == 0
                assert ledger.snapshot().sessions[request]["post_processes"] == fed.session_id
    status = fed.admin.session(replayed)
    assert status["state"] == "closed"
    answers = status["readiness"]
    assert all(answer["state"] != "ready" for answer in answers), answers
    assert any(f"replays the signed request of {first}" in (answer["reason"] or "")
               for answer in answers), answers  # fmt: skip
    for m in range(LEAN_SIGN.clients):
        with ledger_of(fed, m) as ledger:
            assert ledger.releases(session_id=replayed) == 0
            assert ledger.releases() == trained[m]  # nothing new, whatever was asked
    left = sorted(p.name for p in (online_flow.out / "answers").iterdir())
    assert left == [f"{first}.csv", f"{second}.csv"]
    assert main(["session", "close", "--server", fed.admin.base_url, "--admin-token-file",
                 str(tmp_path / "admin.token"), "--session", online]) == 0  # fmt: skip
    for worker in workers:
        assert worker.process.wait(timeout=120) == 0, worker.tail()
