"""Online scoring against real processes, with docs/data.md's commands ("Online scoring") as
written but for this run's server, files and ids: `glasu serve`, three `glasu worker --online`
that keep their models loaded, and the answering party's `glasu ask`.
Each request is one scoring session (one release) counted once in each owner's ledger; a
request past an owner's cap is refused at join with nothing released; an id the answering
party's alignment does not hold is refused by name before anything is asked; and requests the
answering party did not sign, replayed or altered by a lying service are refused at join by
every worker (docs/threat-model.md, "Scoring")."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from e2e_kit import Federation, start_federation
from nacl.signing import SigningKey

from clients.cli.align_cmd import PUBLIC_KEY_FILE, SIGNING_KEY_FILE
from clients.cli.keyfiles import write_key_pair
from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process, stop_all
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from clients.request_signing import sign_request
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
        # party 0's (the answering party's) signing key pair, as `glasu align keygen` writes it
        self.signing_key, self.public_key = write_key_pair(
            fed.root / "keys", SIGNING_KEY_FILE, PUBLIC_KEY_FILE
        )

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
                  "--predictions": [str(self.out / "answers")],
                  "--answering-party-key": [f"0={self.public_key}"]}  # fmt: skip
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
                  "--predictions": [str(self.out / "answers")],
                  "--signing-key": [str(self.signing_key)]}  # fmt: skip
        code = main(run_here(self.docs["ask"], values))
        return code, capsys.readouterr()


def trained_and_online(
    config: TrainConfig, cora, root: Path, data_dir: Path, processes: list[ManagedProcess]
) -> tuple[Federation, Online, list[ManagedProcess]]:
    """A training that keeps each party's model, then its online session (docs/data.md's
    commands) with its three online workers started."""
    models = root / "models"
    fed = start_federation(
        config, cora, root, processes, extra=lambda m: ["--model-out", str(models / f"{m}")]
    )
    for worker in fed.workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    online_flow = Online(fed, data_dir)
    online_flow.create()
    return fed, online_flow, [online_flow.worker(m, processes) for m in range(3)]


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
    fed, online_flow, workers = trained_and_online(PRIVATE, cora, tmp_path, data_dir, processes)
    online = (online_flow.out / "session.id").read_text()
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


def post_request(fed: Federation, online: str, token: str, nodes: list[int], signed: Any) -> str:
    """What a lying service (or anyone with the asker's token) can do: open a request session
    over ``nodes`` with the ``signed`` statement it chose (None: unsigned)."""
    body: dict[str, Any] = {"nodes": nodes}
    if signed is not None:
        body["signature"] = signed if isinstance(signed, dict) else signed.model_dump(mode="json")
    response = httpx.post(
        f"{fed.admin.base_url}/v1/sessions/{online}/requests",
        json=body, headers={"Authorization": f"Bearer {token}"},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


@pytest.mark.slow  # a training and three long-running workers: over 15 s on 2 cores
def test_requests_nobody_signed_replayed_or_altered_are_refused_at_join_by_every_worker(
    tmp_path: Path,
    cora,
    data_dir: Path,
    processes: list[ManagedProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A service that opens requests the answering party did not ask for (a) unsigned, (b) a
    signed one again, (c) a signed one over other nodes: no worker says ready, no ledger counts
    a release, the reason is in the request session's status, and nothing is left in the
    predictions folder; the requests the party signed are answered."""
    lean = dataclasses.replace(PRIVATE, rounds=2)
    fed, online_flow, _ = trained_and_online(lean, cora, tmp_path, data_dir, processes)
    online = (online_flow.out / "session.id").read_text()
    scored = [int(n) for n in eval_nodes(cora)[-3:]]
    code, printed = online_flow.ask([str(scored[0])], capsys)
    assert code == 0, printed.err
    honest = request_session_id(online, 1)
    asker = (online_flow.out / "client-0.token").read_text().strip()
    signed_before = fed.admin.session(honest)["config"]["request_signature"]
    key = SigningKey(bytes.fromhex(online_flow.signing_key.read_text().strip()))
    signed_for_other_nodes = sign_request(
        key, online_id=online, party=0, nodes=np.array([scored[1]]), now=time.time()
    )
    lies = {
        "not signed by the answering party 0": post_request(fed, online, asker, [scored[1]], None),
        f"replays the signed request of {honest}": post_request(
            fed, online, asker, [scored[0]], signed_before
        ),
        "scores other nodes than party 0 signed": post_request(
            fed, online, asker, [scored[1], scored[2]], signed_for_other_nodes
        ),
    }
    # the party's next signed request is answered: every worker has passed the lies by then
    code, printed = online_flow.ask([str(scored[2])], capsys)
    assert code == 0, printed.err
    assert fed.admin.session(request_session_id(online, 5))["state"] == "finished"
    for why, request in lies.items():
        status = fed.admin.session(request)
        assert status["state"] == "closed"
        answers = status["readiness"]
        assert all(answer["state"] != "ready" for answer in answers), answers
        assert any(why in (answer["reason"] or "") for answer in answers), answers
        assert fed.admin.privacy(request)["releases"] == 0
        for m in range(3):
            assert releases(fed, m, request) == 0
    for number in (1, 5):
        for m in range(3):
            assert releases(fed, m, request_session_id(online, number)) == 1
    left = sorted(p.name for p in (online_flow.out / "answers").iterdir())
    assert left == [f"{request_session_id(online, n)}.csv" for n in (1, 5)]
