"""A service that lies (tests/e2e/lying_service.py, a proxy in front of the real ``glasu serve``)
against real worker processes: what docs/threat-model.md promises against a malicious operator,
attack by attack ("What a malicious service can and cannot do")."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_kit import Federation, start_federation
from lying_service import Exchange, lying_service, problem

from clients.cli.errors import EXIT_POLICY, EXIT_REFUSED
from clients.local.processes import (
    ManagedProcess,
    free_port,
    restart_process,
    secret_file,
    start_process,
)
from clients.local.session import session_request
from clients.owner_ledger import LEDGER_FILENAME, OwnerLedger
from models.config import TrainConfig
from models.layout import layout_federation
from secure.privacy import SessionPrivacy
from secure.protocol import decode_nodes, encode_nodes
from secure.release_noise import ReleaseKeyedNoise

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


# -- two noise levels, one noise draw, one ledger row (issue 35) ----------------------------------
#
# The same inputs released at z and at 2z with the same noise Z give the clean release exactly:
# 2 r1 - r2 = 2 (x + sZ) - (x + 2sZ) = x. Each attack below gets the victim to send a pass's
# share at twice the noise; what must hold, read from what crossed the wire: every distinct
# body the victim uploaded is a row of its own in the owner's ledger (or the worker refuses
# before sending anything again).

SESSION_PATH = re.compile(r"/v1/sessions/([^/]+)")


@dataclass
class Uploads:
    """Every share body the victim uploaded: (pass, body, shape header)."""

    bodies: list[tuple[int, bytes, str]] = field(default_factory=list)

    def capture(self, exchange: Exchange) -> None:
        match = PASS_PATH.search(exchange.path)
        if match and match[3] == "embedding" and exchange.method == "PUT":
            self.bodies.append((int(match[2]), exchange.body, exchange.headers["x-glasu-shape"]))

    def distinct(self) -> int:
        return len({(p, body) for p, body, _ in self.bodies})

    def reconstruction(self, root: Path, session_id: str, noise_std: float) -> str:
        """For the first pass the victim sent twice with the same rows: the RMSE of 2 r1 - r2
        against the clean release x = r1 - (r1's noise), the noise regenerated from the victim's
        own secret and the release digest in its ledger (what only the owner can do), beside the
        clean release's std; "none sent twice" when no pass was."""
        by_pass: dict[int, list[np.ndarray]] = {}
        for p, body, shape in self.bodies:
            rows, cols = (int(v) for v in shape.split(","))
            by_pass.setdefault(p, []).append(np.frombuffer(body, "<f4").reshape(rows, cols))
        for pass_index, (first, *again) in by_pass.items():
            for second in again:
                if second.shape != first.shape or np.array_equal(first, second):
                    continue
                with OwnerLedger(root / "partitions" / f"client-{VICTIM}" / LEDGER_FILENAME) as led:
                    digest = next(
                        r["release_digest"]
                        for r in led.snapshot().releases
                        if (r["session_id"], r["pass_index"]) == (session_id, pass_index)
                    )
                    keyed = ReleaseKeyedNoise(led.noise_secret(), scope=f"{session_id}/client1")
                noise = keyed.for_release(bytes.fromhex(digest)).sample(first.shape, std=noise_std)
                clean = first - noise
                recovered = 2.0 * first.astype(np.float64) - second
                rmse = float(np.sqrt(np.mean((recovered - clean) ** 2)))
                return (
                    f"pass {pass_index}: RMSE of 2 r1 - r2 against the clean release {rmse:.2e},"
                    f" clean std {clean.std():.3f}, noise std {noise_std:.3f}"
                )
        return "none sent twice"


def rescaled(answer: httpx.Response, factor: float, *, current_pass: int | None) -> httpx.Response:
    """``GET /v1/sessions/{id}`` with z multiplied by ``factor`` and the privacy report made to
    agree (the worker recomputes it), at ``current_pass`` if given."""
    body = answer.json()
    settings = body["config"]["privacy"]
    settings["noise_multiplier"] *= factor
    plan = SessionPrivacy.restore(
        settings,
        clients=body["config"]["clients"],
        passes_total=body["passes_total"],
        encrypted=False,
    ).report(releases=0)
    for name in ("noise_multiplier", "ledger_noise_multiplier", "epsilon_planned", "noise_std"):
        body["privacy"][name] = plan[name]
    if current_pass is not None:
        body["current_pass"] = current_pass
    return httpx.Response(200, content=json.dumps(body).encode(), headers=answer.headers)


@dataclass
class RescaleAttack:
    """Refuse the victim's first sum with a 409 (the worker exits; a supervisor restarts it),
    then describe the session with z x 2 at pass 0: a restarted worker that recomputes pass 0
    sends the same inputs at twice the noise."""

    factor: float = 2.0  # of z
    uploads: Uploads = field(default_factory=Uploads)
    refused_sum: bool = False

    def __call__(self, exchange: Exchange) -> httpx.Response:
        self.uploads.capture(exchange)
        match = PASS_PATH.search(exchange.path)
        if match and match[3] == "aggregate" and not self.refused_sum:
            answer = exchange.forward()
            if answer.status_code != 200:
                return answer
            self.refused_sum = True
            return problem(409, "conflict", "this pass is being replayed")
        answer = exchange.forward()
        described = exchange.method == "GET" and SESSION_PATH.fullmatch(exchange.path)
        if self.refused_sum and described and answer.status_code == 200:
            return rescaled(answer, self.factor, current_pass=0)
        return answer


@dataclass
class LedgerFigures:
    rows: int
    epsilon: float


def ledger_figures(root: Path, session_id: str | None = None) -> LedgerFigures:
    with OwnerLedger(root / "partitions" / f"client-{VICTIM}" / LEDGER_FILENAME) as ledger:
        return LedgerFigures(
            rows=ledger.releases(session_id=session_id),
            epsilon=ledger.epsilon(delta=CONFIG.delta, accountant=CONFIG.accountant),
        )


def report_attack(
    name: str,
    before: LedgerFigures,
    after: LedgerFigures,
    uploads: Uploads,
    *,
    fed: Federation,
    session_id: str | None = None,
) -> None:
    session_id = session_id or fed.session_id
    noise_std = fed.admin.privacy(session_id)["noise_std"]
    print(
        f"{name}: ledger rows {before.rows} -> {after.rows}, epsilon {before.epsilon:.4f} ->"
        f" {after.epsilon:.4f}, distinct bodies uploaded {uploads.distinct()};"
        f" {uploads.reconstruction(fed.root, session_id, noise_std)}"
    )


@pytest.mark.slow  # two runs of the victim, over 15 s on 2 cores
@pytest.mark.parametrize(
    ("factor", "says"),
    [
        (2.0, "another release mechanism (ledger_noise_multiplier"),
        (1.0, "already released this data 1 times"),
    ],
    ids=["z x 2", "same z"],
)
def test_a_rescaled_session_is_refused_to_a_worker_restarted_without_a_checkpoint(
    tmp_path: Path, cora, processes: list[ManagedProcess], factor: float, says: str
) -> None:
    """rescale: the service refuses a sum, then describes the session with z x 2 at pass 0; a
    plain supervisor restart (``--no-checkpoint``) must not send the pass again under its old
    row. With the same z too, the session released this data and the worker has no checkpoint
    of it: refused (a session id comes back only with its checkpoint)."""
    port = free_port()
    attack = RescaleAttack(factor=factor)
    with lying_service(f"http://127.0.0.1:{port}", attack) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy if client == VICTIM else url,
            extra=lambda client: ["--no-checkpoint"] if client == VICTIM else [],
        )  # fmt: skip
        victim = fed.workers[VICTIM]
        assert wait_exit(victim) == EXIT_REFUSED, victim.tail()  # the refused sum
        before = ledger_figures(tmp_path, fed.session_id)
        restart_process(victim)
        code = wait_exit(victim)
    after = ledger_figures(tmp_path, fed.session_id)
    report_attack(f"rescale (z x {factor:g})", before, after, attack.uploads, fed=fed)
    assert code == EXIT_POLICY and says in victim.tail(), victim.tail()
    assert attack.uploads.distinct() == after.rows == before.rows == 1


@pytest.mark.slow  # three runs of the victim, over 15 s on 2 cores
def test_a_rescaled_session_is_refused_with_the_checkpoint_and_with_a_fresh_folder(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    """rescale with a checkpoint: restarted on its checkpoint the worker refuses the session
    whose mechanism differs from the one its ledger recorded; given an empty --checkpoint
    folder (what a refused checkpoint's message suggests) it refuses too: no second body."""
    port = free_port()
    attack = RescaleAttack()
    with lying_service(f"http://127.0.0.1:{port}", attack) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy if client == VICTIM else url,
        )  # fmt: skip
        victim = fed.workers[VICTIM]
        assert wait_exit(victim) == EXIT_REFUSED, victim.tail()
        before = ledger_figures(tmp_path, fed.session_id)
        restart_process(victim)  # on its checkpoint
        on_checkpoint = wait_exit(victim)
        said = victim.tail()
        victim.command = (*victim.command, "--checkpoint", str(tmp_path / "fresh-checkpoints"))
        restart_process(victim)
        on_fresh_folder = wait_exit(victim)
    after = ledger_figures(tmp_path, fed.session_id)
    report_attack("rescale with a checkpoint", before, after, attack.uploads, fed=fed)
    assert on_checkpoint == EXIT_POLICY and "another release mechanism" in said, said
    assert "noise_multiplier" in said
    assert on_fresh_folder == EXIT_POLICY and "another release mechanism" in victim.tail()
    assert attack.uploads.distinct() == after.rows == before.rows == 1


@dataclass
class AliasAttack:
    """Pass the victim's requests through while ``alias`` is None; then answer for the session
    ``alias`` under the old session id ``old``: paths of ``old`` go to ``alias``, and the
    session's description says ``old``."""

    uploads: Uploads = field(default_factory=Uploads)
    old: str = ""
    alias: str | None = None

    def __call__(self, exchange: Exchange) -> httpx.Response:
        self.uploads.capture(exchange)
        if self.alias is None:
            return exchange.forward()
        exchange.path = exchange.path.replace(f"/sessions/{self.old}", f"/sessions/{self.alias}")
        answer = exchange.forward()
        described = exchange.method == "GET" and SESSION_PATH.fullmatch(exchange.path)
        if described and answer.status_code == 200:
            body = answer.json()
            body["session_id"] = self.old
            content = json.dumps(body).encode()
            return httpx.Response(200, content=content, headers=answer.headers)
        return answer


@pytest.mark.slow  # two sessions, over 15 s on 2 cores
def test_a_new_session_joined_under_an_old_session_id_is_refused(
    tmp_path: Path, cora, processes: list[ManagedProcess]
) -> None:
    """alias: after session S finished (and its checkpoints were deleted), the operator makes
    a session with the same settings and z x 2 and has the owner join it as S."""
    port = free_port()
    attack = AliasAttack()
    with lying_service(f"http://127.0.0.1:{port}", attack) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy if client == VICTIM else url,
        )  # fmt: skip
        for worker in fed.workers:
            assert wait_exit(worker) == 0, worker.tail()
        before = ledger_figures(tmp_path)
        victim_data = tmp_path / "partitions" / f"client-{VICTIM}"
        shutil.rmtree(victim_data / "checkpoints")  # as docs/deploy.md says, after a session
        request = session_request(CONFIG, layout_federation(CONFIG, cora), cora)
        request["privacy"]["noise_multiplier"] = (
            2 * fed.admin.privacy(fed.session_id)["noise_multiplier"]
        )
        alias = fed.admin.create_session(request)
        attack.old, attack.alias = fed.session_id, alias["session_id"]
        workers = []
        for client, token in enumerate(alias["client_tokens"]):
            command = list(fed.workers[client].command)
            at = command.index("--session") + 1
            if client != VICTIM:  # the honest peer joins the new session by its own id
                command[at] = alias["session_id"]
                command += ["--max-lifetime-epsilon", "1000"]  # its own data's earlier spend
            at = command.index("--token-file") + 1
            command[at] = str(secret_file(tmp_path / f"alias-{client}.token", token))
            worker = start_process(f"alias {client}", command, tmp_path / f"alias-{client}.log")
            processes.append(worker)
            workers.append(worker)
        code = wait_exit(workers[VICTIM])
    after = ledger_figures(tmp_path)
    report_attack("alias", before, after, attack.uploads, fed=fed)
    tail = workers[VICTIM].tail()
    assert code == EXIT_POLICY and "another release mechanism" in tail, tail
    # no body beyond the first session's 4 releases, each its own row
    assert attack.uploads.distinct() == after.rows == before.rows == fed.passes_total
    assert after.epsilon == before.epsilon
