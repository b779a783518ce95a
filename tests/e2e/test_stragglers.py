"""Stragglers "continue" with real processes over loopback HTTP: a worker process is frozen
(SIGSTOP) in the middle of the run; the other two go on without it (the session advances while
it is stopped), and once it is thawed (SIGCONT) it is told so, rejoins and the run finishes with
every worker exiting 0. The straggler wait runs on the service's clock, whose speed the test
sets, and the worker is frozen between two passes: no healthy worker is ever left out on a
loaded machine (one was, once, with a 2 s wait of real time)."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from e2e_kit import start_federation
from lying_service import Exchange, lying_service

from clients.local.processes import ManagedProcess, free_port
from models.config import TrainConfig

pytestmark = pytest.mark.e2e

# The straggler wait is an hour of the service's clock, and the test sets how fast that clock
# runs (SERVICE_CLOCK): at real speed no healthy worker is ever left out however loaded the
# machine; while worker 2 is frozen the clock runs an hour a second, so the others go on without
# it at once. Worker 2 is frozen between two passes (held at the proxy as it asks for pass
# FREEZE_AT), so no share of it is pending that could make a healthy worker the one left out.
CONFIG = TrainConfig(
    rounds=12,
    eval_every=4,
    hidden=32,
    encryption="none",
    dp=False,
    seed=5,
    device="cpu",
    stragglers="continue",
    straggler_wait_seconds=3600.0,
)
FROZEN, FREEZE_AT = 2, 2  # worker 2 is frozen as it asks for pass 2
AWAY = 4  # it is thawed once the others are this many passes further
FAST = 3600.0  # service seconds per real second while it is frozen
# `glasu serve` whose wall clock runs at the rate written in the file argv[1]
SERVICE_CLOCK = """\
import sys, threading, time
from pathlib import Path

rate_file, real_time, clock = Path(sys.argv[1]), time.time, {"offset": 0.0, "rate": 1.0}

def follow() -> None:
    last = real_time()
    while True:
        time.sleep(0.02)
        now = real_time()
        clock["offset"] += (clock["rate"] - 1.0) * (now - last)
        last = now
        try:
            clock["rate"] = float(rate_file.read_text() or 1)
        except (OSError, ValueError):
            pass

threading.Thread(target=follow, daemon=True).start()
time.time = lambda: real_time() + clock["offset"]
from clients.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class FreezePoint:
    """Holds the frozen worker's request for pass FREEZE_AT until the test has frozen it."""

    reached: threading.Event = field(default_factory=threading.Event)
    frozen: threading.Event = field(default_factory=threading.Event)

    def __call__(self, exchange: Exchange) -> httpx.Response:
        if (
            exchange.method == "GET"
            and exchange.path.endswith(f"/clients/{FROZEN}/passes/{FREEZE_AT}")
            and not self.reached.is_set()
        ):
            self.reached.set()
            assert self.frozen.wait(timeout=120), "the test never froze the worker"
        return exchange.forward()


def wait_until(condition: Callable[[], bool], what: str, *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow  # 15-40 s: a service and three worker processes
def test_a_frozen_worker_does_not_stop_the_others_and_rejoins(
    cora, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    clock = tmp_path / "service-clock-rate"
    clock.write_text("1")
    port = free_port()
    freeze = FreezePoint()
    with lying_service(f"http://127.0.0.1:{port}", freeze) as proxy:
        fed = start_federation(
            CONFIG,
            cora,
            tmp_path,
            processes,
            service_command=lambda *args: [sys.executable, "-c", SERVICE_CLOCK, str(clock), *args],
            port=port,
            server_for=lambda client, url: proxy if client == FROZEN else url,
            # a long poll ends within a second: its last check sees the clock's time
            extra=lambda client: ["--poll-seconds", "1"],
        )
        admin, sid, workers = fed.admin, fed.session_id, fed.workers

        def current_pass() -> int:
            return admin.session(sid)["current_pass"]

        assert freeze.reached.wait(timeout=300), "worker 2 never asked for pass 2"
        workers[FROZEN].process.send_signal(signal.SIGSTOP)
        freeze.frozen.set()
        frozen_at = current_pass()
        clock.write_text(str(FAST))  # the others' waits for it are over at once
        wait_until(lambda: current_pass() >= frozen_at + AWAY, "the others to go on without it")
        status = admin.session(sid)
        assert status["progress"]["absent"] == [FROZEN]
        clock.write_text("1")  # back to real speed: no one else can be left out
        workers[FROZEN].process.send_signal(signal.SIGCONT)
        for worker in workers:
            wait_until(lambda w=worker: w.process.poll() is not None, f"{worker.name} to exit")
            assert worker.process.returncode == 0, worker.tail(30)
        status = admin.session(sid)
        assert status["state"] == "finished" and status["progress"] is None
        results = [json.loads((tmp_path / f"client-{m}.json").read_text()) for m in range(3)]
        assert results[0]["skipped_passes"] == results[1]["skipped_passes"] == []
        skipped = results[2]["skipped_passes"]
        assert len(skipped) >= AWAY and skipped == list(range(skipped[0], skipped[-1] + 1))
        assert results[2]["passes"] == fed.passes_total - len(skipped)
        assert results[2]["passes"] > frozen_at  # it took part again after the thaw
        assert "passes went on without this worker" in workers[2].tail(30)
