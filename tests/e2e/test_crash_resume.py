"""A federation that survives crashes, with real processes over loopback HTTP (issue 12).

- A worker is killed (SIGKILL, right after its share of a pass reached the service, before it
  got the sum); ``glasu train`` starts it again with the same command, it resumes from its
  checkpoint, and the run ends with exactly the accuracies of the uninterrupted run.
- The service is killed three times (SIGKILL: while it commits an upload, while workers wait in
  long polls, right after a pass's last sum is stored) and started again on the same database
  and port; the workers ride through with their bounded retries, and the run ends with exactly
  the uninterrupted run's accuracies.

The kills are placed by bootstrap code (``python -c BOOTSTRAP ...``) that wraps one function
of the process and kills it there once (a marker file keeps the restarted process alive). They
are ordered by events, never by sleeping: a share that is held until the other clients' long
polls are open, a kill when the last of them is told to wait, a restart when the process's exit
is seen.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from e2e_kit import Federation, start_federation

from clients.local import federation
from clients.local.federation import train_over_http
from clients.local.processes import ManagedProcess, restart_process
from models.config import TrainConfig
from models.layout import layout_federation
from models.run_summary import RunSummary
from models.trainer import train_inprocess

pytestmark = pytest.mark.e2e

# K = 2 of L = 4 layers (two uploads per pass); W = 2: the workset carries batches across rounds
CONFIG = TrainConfig(
    rounds=3,
    eval_every=0,
    hidden=32,
    encryption="none",
    dp=False,
    seed=5,
    cache_rounds=2,
    device="cpu",
)  # passes: train 0, train 1, train 2, eval 3
WORKER_CRASH = (1, 2)  # client 1 dies after its first share of pass 2 was accepted
# the pass of each kill of the service, in this order: the upload of client 1's first share of
# pass 1; the end of pass 1 (its last sum stored); a long poll for a sum of pass 2
SERVICE_CRASHES = {"upload": 1, "between": 1, "poll": 2}

WORKER_BOOTSTRAP = """\
import os, signal, sys
from pathlib import Path

argv = sys.argv[1:]
client, crash_pass = (int(v) for v in os.environ["CRASHTEST_WORKER"].split(","))
marker = Path(os.environ["CRASHTEST_DIR"]) / "worker"
if argv[:1] == ["worker"] and int(argv[argv.index("--client") + 1]) == client:
    from clients.session_client import SessionClient

    put = SessionClient.put_share

    def put_then_die(self, pass_index, layer, payload, **kwargs):
        put(self, pass_index, layer, payload, **kwargs)
        if pass_index == crash_pass and not marker.exists():
            marker.write_text(f"pass {pass_index} layer {layer}")
            os.kill(os.getpid(), signal.SIGKILL)  # the share is in; the sum never fetched

    SessionClient.put_share = put_then_die

from clients.cli.main import main

sys.exit(main(argv))
"""

SERVICE_BOOTSTRAP = """\
import os, signal, sys, threading
from pathlib import Path

from service.rounds import downloads, sums, uploads
from service.notify import Pending

markers = Path(os.environ["CRASHTEST_DIR"])
upload_pass, between_pass, poll_pass = (int(v) for v in os.environ["CRASHTEST_SERVICE"].split(","))
EVENT_SECONDS = 120.0  # no event this long: the test fails on what did not happen, not here


def once(name):
    marker = markers / f"service-{name}"
    if marker.exists():
        return False
    marker.write_text(f"{len(list(markers.glob('service-*')))} {os.getpid()}")
    return True


def die():
    os.kill(os.getpid(), signal.SIGKILL)


record = uploads.Uploads._record


def record_then_die(self, caller, kind, sha256, body, slot, **kwargs):
    outcome = record(self, caller, kind, sha256, body, slot, **kwargs)
    if kind == "share" and slot.pass_index == upload_pass and caller.client_index == 1:
        if once("upload"):
            die()  # the share is committed; its answer is never sent
    return outcome


# The poll kill: the late client's share of the poll pass is held until every other client
# has been told to wait for the sum (its long poll is open); the service dies then.
LATE, OTHERS = 2, {0, 1}
polling = set()
polling_lock = threading.Lock()
killed = threading.Event()  # nothing sets it: the kill ends the wait
put = uploads.Uploads.put


def put_late(self, kind, caller, pass_index, layer, **kwargs):
    if kind == "share" and pass_index == poll_pass and caller.client_index == LATE:
        if not (markers / "service-poll").exists():
            killed.wait(EVENT_SECONDS)
    return put(self, kind, caller, pass_index, layer, **kwargs)


get = downloads.Downloads.get


def get_then_die_in_the_poll(self, kind, caller, pass_index, layer, part=0):
    answer = get(self, kind, caller, pass_index, layer, part)
    if kind == "sum" and pass_index == poll_pass and isinstance(answer, Pending):
        with polling_lock:
            polling.add(caller.client_index)
            if polling >= OTHERS and once("poll"):
                die()
    return answer


store = sums.ShareSums._store


def store_then_die(self, plan, slot, *args, **kwargs):
    store(self, plan, slot, *args, **kwargs)
    if slot.pass_index == between_pass and slot.layer == max(plan.widths) and once("between"):
        die()  # the pass is complete, nobody has its sum yet


uploads.Uploads._record = record_then_die
uploads.Uploads.put = put_late
downloads.Downloads.get = get_then_die_in_the_poll
sums.ShareSums._store = store_then_die

from clients.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


def bootstrap_command(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


@pytest.fixture(scope="module")
def uninterrupted(cora) -> RunSummary:
    """The reference: the same run in process (over HTTP it equals it, test_local_http.py)."""
    return train_inprocess(CONFIG, dataset=cora, progress=False)


def accuracies(history: list[Any]) -> list[tuple[int, float, float]]:
    return [(h.round, h.val_accuracy, h.test_accuracy) for h in history]


@pytest.mark.slow  # 15-40 s: a service and three worker processes, one of them twice
def test_a_killed_worker_resumes_and_the_run_is_unchanged(
    cora,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uninterrupted: RunSummary,
) -> None:
    monkeypatch.setenv("CRASHTEST_DIR", str(tmp_path))
    monkeypatch.setenv("CRASHTEST_WORKER", ",".join(map(str, WORKER_CRASH)))
    monkeypatch.setattr(
        federation, "glasu_command", lambda *args: bootstrap_command(WORKER_BOOTSTRAP, *args)
    )
    report = train_over_http(
        CONFIG, layout_federation(CONFIG, cora), cora, progress=False, work_dir=tmp_path
    )
    client, crash_pass = WORKER_CRASH
    assert (tmp_path / "worker").read_text() == f"pass {crash_pass} layer 2"  # it did die
    assert "worker 1 crashed (exit code -9); restarted it (1 of 3)" in capsys.readouterr().err
    log = (tmp_path / f"client-{client}.log").read_text()
    assert f"resumed from pass {crash_pass}" in log
    results = [json.loads((tmp_path / f"client-{m}.json").read_text()) for m in range(3)]
    assert [r["resumed_from"] for r in results] == [[], [crash_pass], []]
    assert accuracies(report.history) == accuracies(uninterrupted.history)
    assert report.test_accuracy == uninterrupted.test_accuracy
    assert [h.loss for h in report.history] == pytest.approx(
        [h.loss for h in uninterrupted.history], rel=1e-6
    )


def ride_through(fed: Federation, *, timeout: float = 300.0) -> int:
    """Start the service again (same command: database, port) as soon as it dies; return how
    often, once every worker has exited (each must exit 0)."""
    restarts = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [w.process.poll() for w in fed.workers]
        for worker, code in zip(fed.workers, codes, strict=True):
            assert code in (None, 0), (
                f"{worker.name} exited with {code}:\n{worker.tail(30)}\n"
                f"service ({restarts} restarts):\n{fed.service.tail(30)}"
            )
        if all(code == 0 for code in codes):
            return restarts
        try:  # returns the moment the service dies; the workers are looked at again meanwhile
            code = fed.service.process.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue
        assert code == -9, fed.service.tail(30)
        restart_process(fed.service)
        restarts += 1
    raise AssertionError("the federation did not finish in time")


@pytest.mark.slow  # 20-50 s: three kills of the service, each survived by three workers
def test_workers_ride_through_service_crashes(
    cora,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    processes: list[ManagedProcess],
    uninterrupted: RunSummary,
) -> None:
    monkeypatch.setenv("CRASHTEST_DIR", str(tmp_path))
    monkeypatch.setenv("CRASHTEST_SERVICE", ",".join(map(str, SERVICE_CRASHES.values())))
    fed = start_federation(
        CONFIG,
        cora,
        tmp_path,
        processes,
        service_command=lambda *args: bootstrap_command(SERVICE_BOOTSTRAP, *args),
    )
    restarts = ride_through(fed)
    # each kill in its own life of the service, in the order planned
    kills = {name: (tmp_path / f"service-{name}").read_text().split() for name in SERVICE_CRASHES}
    assert [kills[name][0] for name in SERVICE_CRASHES] == ["0", "1", "2"], kills
    assert len({pid for _, pid in kills.values()}) == len(SERVICE_CRASHES), kills
    assert restarts == len(SERVICE_CRASHES)
    status = fed.admin.session(fed.session_id)
    assert status["state"] == "finished" and status["current_pass"] == status["passes_total"]
    results = [json.loads((tmp_path / f"client-{m}.json").read_text()) for m in range(3)]
    assert all(r["resumed_from"] == [] for r in results)  # the workers never stopped
    logs = "".join(w.log_path.read_text() for w in fed.workers)
    # the workers rode through each kill with their retries; at the "between" kill the request
    # that dies is the last upload of pass 1 or a long poll for its sum, whichever stored it
    assert "passes/1/layers/2/embedding failed" in logs
    assert re.search(r"passes/1/layers/4/(embedding|aggregate) failed", logs)
    assert f"passes/{SERVICE_CRASHES['poll']}/layers/2/aggregate failed" in logs
    for i, entry in enumerate(uninterrupted.history):
        for key in ("val_accuracy", "test_accuracy"):
            values = [r["history"][i][key] for r in results]
            assert float(np.mean(values)) == getattr(entry, key), (i, key)
    fed.admin.close()
