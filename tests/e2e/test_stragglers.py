"""Stragglers "continue" with real processes over loopback HTTP: a worker process is frozen
(SIGSTOP) in the middle of the run; the other two go on without it (the session advances while
it is stopped), and once it is thawed (SIGCONT) it is told so, rejoins and the run finishes with
every worker exiting 0. The straggler wait runs on the service's clock, which the test moves,
so no healthy worker is ever left out on a loaded machine (it was, once, with a 2 s wait)."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_kit import start_federation

from clients.local.processes import ManagedProcess
from models.config import TrainConfig

pytestmark = pytest.mark.e2e

# The straggler wait is an hour of the service's clock, which the test moves (SERVICE_CLOCK): a
# healthy worker is never left out however loaded the machine, and the frozen one is left out
# as soon as the test says an hour has passed, whatever the real time.
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
FREEZE_AT = 2  # the pass the session is at when worker 2 is frozen
AWAY = 4  # it is thawed once the others are this many passes further
# `glasu serve` whose wall clock runs ahead by the seconds written in the file argv[1]
SERVICE_CLOCK = """\
import sys, threading, time
from pathlib import Path

offset_file, real_time, offset = Path(sys.argv[1]), time.time, [0.0]

def follow() -> None:
    while True:
        try:
            offset[0] = float(offset_file.read_text() or 0)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)

threading.Thread(target=follow, daemon=True).start()
time.time = lambda: real_time() + offset[0]
from clients.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def wait_until(condition: Callable[[], bool], what: str, *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow  # 15-40 s: a service and three worker processes
def test_a_frozen_worker_does_not_stop_the_others_and_rejoins(
    cora, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    clock = tmp_path / "service-clock"
    clock.write_text("0")
    fed = start_federation(
        CONFIG,
        cora,
        tmp_path,
        processes,
        service_command=lambda *args: [sys.executable, "-c", SERVICE_CLOCK, str(clock), *args],
        # a long poll ends within a second: its last check sees the moved clock
        extra=lambda client: ["--poll-seconds", "1"],
    )
    admin, sid, workers = fed.admin, fed.session_id, fed.workers

    def current_pass() -> int:
        return admin.session(sid)["current_pass"]

    wait_until(lambda: current_pass() >= FREEZE_AT, f"pass {FREEZE_AT}")
    workers[2].process.send_signal(signal.SIGSTOP)
    frozen_at = current_pass()
    clock.write_text(str(CONFIG.straggler_wait_seconds + 1))  # the wait is over, from now on
    wait_until(lambda: current_pass() >= frozen_at + AWAY, "the others to go on without it")
    status = admin.session(sid)
    assert status["progress"]["absent"] == [2]
    clock.write_text("0")  # back to waiting for everyone: no one else can be left out
    workers[2].process.send_signal(signal.SIGCONT)
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
