"""A service that lies (tests/e2e/lying_service.py, a proxy in front of the real ``glasu serve``)
against real worker processes: what docs/threat-model.md promises against a malicious operator,
attack by attack ("What a malicious service can and cannot do")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_kit import start_federation
from lying_service import Exchange, lying_service, problem

from clients.local.processes import ManagedProcess, free_port, restart_process
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.config import TrainConfig
from secure.protocol import decode_nodes, encode_nodes

pytestmark = pytest.mark.e2e

# two clients, DP on, plaintext shares (so the test can read what the proxy captured; the
# attacks do not need the plaintext); passes: train 0, 1, 2, eval 3
CONFIG = TrainConfig(
    clients=2, rounds=3, eval_every=0, hidden=16, encryption="none", dp=True, epsilon=8.0,
    seed=5, device="cpu",
)  # fmt: skip
VICTIM, ATTACKED_PASS = 1, 1
PASS_PATH = re.compile(r"/clients/(\d+)/passes/(\d+)/layers/1/(nodes|embedding|aggregate)$")


@dataclass
class SameNoiseAttack:
    """Answer the victim's sum of ``ATTACKED_PASS`` with a 409 (the worker exits; Kubernetes
    restarts it), then hand the restarted worker the pass's union with one extra node id: a
    second release of the same pass, which must not carry the first one's noise."""

    num_nodes: int
    unions: list[np.ndarray] = field(default_factory=list)
    releases: list[tuple[bytes, str]] = field(default_factory=list)  # (body, shape header)
    refused_sum: bool = False

    def __call__(self, exchange: Exchange) -> httpx.Response:
        match = PASS_PATH.search(exchange.path)
        if match is None or (int(match[1]), int(match[2])) != (VICTIM, ATTACKED_PASS):
            return exchange.forward()
        what = match[3]
        if what == "embedding" and exchange.method == "PUT":
            self.releases.append((exchange.body, exchange.headers["x-glasu-shape"]))
            return exchange.forward()
        if what == "aggregate" and not self.refused_sum:
            answer = exchange.forward()
            if answer.status_code != 200:
                return answer
            self.refused_sum = True
            return problem(409, "conflict", "this pass is being replayed")
        answer = exchange.forward()
        if what == "nodes" and exchange.method == "GET" and answer.status_code == 200:
            union = decode_nodes(answer.content)
            if self.refused_sum:  # the replay: one node more than the first time
                extra = np.setdiff1d(np.arange(self.num_nodes), union)[-1]  # the last row
                union = np.sort(np.append(union, extra))
                answer = httpx.Response(200, content=encode_nodes(union), headers=answer.headers)
            self.unions.append(union)
        return answer


def ledger_rows(root: Path, session_id: str, client: int) -> list[tuple[int, int | None]]:
    with OwnerLedger(root / "partitions" / f"client-{client}" / LEDGER_FILENAME) as ledger:
        rows = ledger._connection.execute(
            "SELECT pass_index, layer FROM releases WHERE session_id = ? ORDER BY id",
            (session_id,),
        ).fetchall()
    return [(int(p), layer) for p, layer in rows]


def wait_exit(worker: ManagedProcess, timeout: float = 300) -> int:
    return worker.process.wait(timeout=timeout)


@pytest.mark.slow  # over 15 s on 2 cores: the full run (README) has it
def test_a_replayed_pass_with_other_inputs_gets_independent_noise_and_is_counted(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    port = free_port()
    attack = SameNoiseAttack(num_nodes=cora.num_nodes)
    with lying_service(f"http://127.0.0.1:{port}", attack) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy if client == VICTIM else url,
        )  # fmt: skip
        victim = fed.workers[VICTIM]
        assert wait_exit(victim) == 3, victim.tail()  # the refused sum
        restart_process(victim)  # what a Kubernetes Job does
        code = wait_exit(victim)
    # the real service holds the first release: the second, with other inputs, cannot complete
    # the pass; the worker says so and stops (before this fix it took the stored sum)
    assert code == 1 and "differs from it" in victim.tail(), victim.tail()
    assert len(attack.releases) == 2 and len(attack.unions) == 2
    (first, shape1), (second, shape2) = attack.releases
    rows1, cols = (int(v) for v in shape1.split(","))
    rows2, _ = (int(v) for v in shape2.split(","))
    assert (rows1 + 1, rows2) == (rows2, len(attack.unions[1]))
    a = np.frombuffer(first, "<f4").reshape(rows1, cols)
    b = np.frombuffer(second, "<f4").reshape(rows2, cols)
    common = np.searchsorted(attack.unions[1], attack.unions[0])  # row of each first-run node
    difference = a - b[common]
    std = (
        fed.admin.privacy(fed.session_id)["noise_multiplier"]
        * fed.admin.privacy(fed.session_id)["sensitivity"]
    )
    print(f"difference std {difference.std():.3f}, noise std {std:.3f}")
    # independent noise: the difference has std sqrt(2) sigma (same noise: ~0.2, the clean rows')
    assert difference.std() == pytest.approx(np.sqrt(2) * std, rel=0.1)
    # both releases are in the owner's ledger: passes 0 and 1, then pass 1 again
    assert ledger_rows(tmp_path, fed.session_id, VICTIM) == [(0, 1), (1, 1), (1, 1)]


def test_a_service_answering_for_another_session_is_refused(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    """The owner's ledger is keyed by the session id it configured: a service that reports an
    old session's id (to pass new releases off as an old session's) is refused at once."""

    def echo_another(exchange: Exchange) -> httpx.Response:
        answer = exchange.forward()
        if exchange.method == "GET" and re.fullmatch(r"/v1/sessions/[^/]+", exchange.path):
            body = answer.json()
            body["session_id"] = "an-old-session"
            return httpx.Response(200, content=json.dumps(body).encode(), headers=answer.headers)
        return answer

    port = free_port()
    with lying_service(f"http://127.0.0.1:{port}", echo_another) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy if client == VICTIM else url,
        )  # fmt: skip
        victim = fed.workers[VICTIM]
        assert wait_exit(victim) == 1, victim.tail()
    assert "answered for session 'an-old-session'" in victim.tail()
    assert ledger_rows(tmp_path, fed.session_id, VICTIM) == []
