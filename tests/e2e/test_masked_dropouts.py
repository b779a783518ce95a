"""Dropouts under masked secure aggregation against real processes (docs/secure-aggregation.md,
"Dropouts"): four workers, masks, DP, stragglers "continue". Worker 3 uploads its masked share of
an evaluation pass, which the service keeps to itself (SecAgg's attack: it holds the share and
says the worker dropped), and is killed (SIGKILL). The pass is void, the other three go on with
the next passes masked over themselves, the session completes with a sane accuracy, their
ledgers agree, and the share the service kept is uniform noise to it even with a colluding
worker's keys: no seed of it was ever released. A lying service that states a pass's
participants as two, or without the worker, is refused before anything is uploaded.

The straggler wait is an hour of the service's clock, which jumps once the three survivors'
shares are in (SERVICE_CLOCK_JUMP): no healthy worker can be left out on a loaded machine."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e_kit import correlation, fixed_masking_keys, masking_keys_of, start_federation
from lying_service import Exchange, lying_service, problem

from clients.local.processes import ManagedProcess, free_port
from clients.owner_ledger import OwnerLedger, ledger_location
from models.config import TrainConfig
from secure.aggregation import rows_digest
from secure.ckks_frame import parse_frame
from secure.masking.bfv import PLAIN_MODULUS, decode_sum, decrypt
from secure.masking.codec import generate_bfv_keys, load_bfv_secret_context
from secure.masking.streams import MaskSlot, party_mask

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# passes: train 0-3, eval 4, train 5-8, eval 9, the killed pass the first evaluation; split
# noise is off under "continue" (a pass over fewer than M would carry less than the ledger
# counts); a large epsilon, so that 8 rounds learn
CONFIG = TrainConfig(
    clients=4, rounds=8, eval_every=4, hidden=64, release_width=32, batch_size=64, seed=3,
    device="cpu", secure_aggregation="masks", epsilon=50.0, stragglers="continue",
    straggler_wait_seconds=3600.0,
)  # fmt: skip
VICTIM, COLLUDER, KILLED_PASS = 3, 0, 4
SURVIVORS = (0, 1, 2)
SHARE_PUT = re.compile(r"/clients/(\d+)/passes/(\d+)/layers/(\d+)/embedding$")
# `glasu serve` whose wall clock runs the seconds written in the file argv[1] ahead
SERVICE_CLOCK_JUMP = """\
import sys, threading, time
from pathlib import Path

jump_file, real_time, ahead = Path(sys.argv[1]), time.time, [0.0]

def follow() -> None:
    while True:
        try:
            ahead[0] = float(jump_file.read_text() or 0)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)

threading.Thread(target=follow, daemon=True).start()
time.time = lambda: real_time() + ahead[0]
from clients.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class KeepAndKill:
    """Keeps the victim's share of the killed pass from the service (and holds its request until
    the test killed it); tells the test once every survivor's share of that pass is in."""

    kept: tuple[bytes, str, int] | None = None  # (body, shape, layer)
    victim_uploaded: threading.Event = field(default_factory=threading.Event)
    killed: threading.Event = field(default_factory=threading.Event)
    survivors_in: threading.Event = field(default_factory=threading.Event)
    uploaded: set[int] = field(default_factory=set)

    def __call__(self, exchange: Exchange) -> httpx.Response:
        match = SHARE_PUT.search(exchange.path)
        if exchange.method != "PUT" or match is None or int(match[2]) != KILLED_PASS:
            return exchange.forward()
        client = int(match[1])
        if client == VICTIM:
            self.kept = (exchange.body, exchange.headers["x-glasu-shape"], int(match[3]))
            self.victim_uploaded.set()
            self.killed.wait(timeout=300)
            return problem(503, "unavailable", "the worker is gone")
        answer = exchange.forward()
        if answer.status_code == 201:
            self.uploaded.add(client)
            if self.uploaded >= set(SURVIVORS):
                self.survivors_in.set()
        return answer


def test_a_worker_killed_mid_pass_voids_the_pass_and_nothing_of_its_share_is_readable(
    cora, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    jump_file = tmp_path / "service-clock-ahead"
    jump_file.write_text("0")
    jump = str(jump_file)
    secret, _ = generate_bfv_keys(tmp_path / "keys")
    masking = fixed_masking_keys(tmp_path, CONFIG.clients)
    port = free_port()
    handler = KeepAndKill()
    with lying_service(f"http://127.0.0.1:{port}", handler) as proxy:
        fed = start_federation(
            CONFIG, cora, tmp_path, processes,
            service_command=lambda *args: [sys.executable, "-c", SERVICE_CLOCK_JUMP, jump, *args],
            port=port, server_for=lambda client, url: proxy,
            extra=lambda m: ["--secret-context", str(secret), *masking[m], "--poll-seconds", "1"],
        )  # fmt: skip
        victim = fed.workers[VICTIM]
        assert handler.victim_uploaded.wait(timeout=600), victim.tail(30)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=60)
        handler.killed.set()
        assert handler.survivors_in.wait(timeout=600), [w.tail(30) for w in fed.workers]
        jump_file.write_text(str(2 * CONFIG.straggler_wait_seconds))  # the pass's wait is over
        for m in SURVIVORS:
            worker = fed.workers[m]
            assert worker.process.wait(timeout=900) == 0, worker.tail(30)
        status = fed.admin.session(fed.session_id)
        service_privacy = fed.admin.privacy(fed.session_id)
    assert status["state"] == "finished"
    results = [json.loads((tmp_path / f"client-{m}.json").read_text()) for m in SURVIVORS]
    assert all(r["skipped_passes"] == [KILLED_PASS] for r in results)
    # every survivor released every pass, the void one included: their ledgers agree
    ledgers = [ledger_releases(tmp_path, m, fed.session_id) for m in range(CONFIG.clients)]
    assert ledgers[:3] == [fed.passes_total] * 3
    assert ledgers[VICTIM] == KILLED_PASS + 1  # its last share was written before it left
    assert service_privacy["releases"] == fed.passes_total  # the void pass counted too
    # it learned: well above Cora's largest class (34 % of the test nodes). The noise is fresh
    # every run (a seeded one is refused by the workers' policy): 0.546, 0.566 and 0.601 in three
    # runs, the party alone 0.588 in the same 8 rounds
    last = results[0]["history"][-1]
    accuracy, alone = last["test_accuracy"], last["reference_test_accuracy"]
    print(f"test accuracy {accuracy:.3f} after a void pass, the party alone {alone:.3f}")
    assert accuracy > 0.45

    # the service with the colluder's keys: the kept share less the colluder's stream with it
    assert handler.kept is not None
    body, shape, layer = handler.kept
    rows, cols = (int(v) for v in shape.split(","))
    residues = decrypt(load_bfv_secret_context(secret), parse_frame(body).chunks)
    slot = MaskSlot(
        fed.session_id, KILLED_PASS, layer, 0, rows_digest(np.arange(cora.num_nodes))
    )  # an evaluation pass's rows: every node, in order; masked over all four

    def pair_secrets(m: int):
        own, peers = masking_keys_of(masking[m])
        return peers.pair_secrets(own, party=m)

    mask = party_mask(
        pair_secrets(VICTIM), slot, party=VICTIM, count=residues.size, modulus=PLAIN_MODULUS
    )
    share = decode_sum(residues - mask)  # the test holds every key
    assert np.abs(share).max() > 0.1  # a real share
    known = party_mask(
        {VICTIM: pair_secrets(COLLUDER)[VICTIM]}, slot, party=COLLUDER, count=residues.size,
        modulus=PLAIN_MODULUS,
    )  # fmt: skip
    best_guess = decode_sum(residues + known)
    bound = 6 / np.sqrt(residues.size)  # 6 standard deviations of uncorrelated values
    print(f"{residues.size} values: correlation {correlation(best_guess, share):+.4f}")
    assert abs(correlation(best_guess, share)) < bound
    centred = (residues + known) % PLAIN_MODULUS
    assert abs(centred.mean() / PLAIN_MODULUS - 0.5) < 0.01  # uniform residues
    assert rows * cols == residues.size


def ledger_releases(root: Path, client: int, session_id: str) -> int:
    with OwnerLedger(ledger_location(root / "partitions" / f"client-{client}")) as ledger:
        return ledger.releases(session_id=session_id)


@dataclass
class StatedParticipants:
    """Answers each fooled worker's descriptor of pass 0 with its lie; records every upload."""

    lies: dict[int, list[int]]
    uploads: list[tuple[int, str]] = field(default_factory=list)

    def __call__(self, exchange: Exchange) -> httpx.Response:
        client = re.search(r"/clients/(\d+)/", exchange.path)
        if exchange.method == "PUT" and client is not None:
            self.uploads.append((int(client[1]), exchange.path))
        answer = exchange.forward()
        fooled = None if client is None else int(client[1])
        if (
            exchange.method != "GET"
            or not exchange.path.endswith("/passes/0")
            or (fooled not in self.lies)
        ):
            return answer
        info = answer.json() | {"participants": self.lies[fooled]}
        return httpx.Response(200, json=info)


def test_a_lying_statement_of_the_participants_is_refused_before_any_upload(
    cora, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    config = dataclasses.replace(
        CONFIG, clients=3, rounds=1, eval_every=0, hidden=16, dp=False, stragglers="wait"
    )
    secret, _ = generate_bfv_keys(tmp_path / "keys")
    masking = fixed_masking_keys(tmp_path, config.clients)
    port = free_port()
    lies = StatedParticipants({0: [0, 1], 1: [0, 2]})  # two; one without worker 1
    with lying_service(f"http://127.0.0.1:{port}", lies) as proxy:
        fed = start_federation(
            config, cora, tmp_path, processes, port=port,
            server_for=lambda client, url: proxy,
            extra=lambda m: ["--secret-context", str(secret), *masking[m]],
        )  # fmt: skip
        for m, says in ((0, "masks need 3 at least"), (1, "leave this client 1 out")):
            worker = fed.workers[m]
            assert worker.process.wait(timeout=300) != 0, worker.tail(30)
            assert says in worker.tail(30) and "nothing of it is sent" in worker.tail(30)
        fed.workers[2].process.kill()  # it would wait for the others' shares
    assert not [path for client, path in lies.uploads if client in lies.lies]
