"""The end of an interrupted `glasu train`: when Ctrl-C (or a supervisor) stops the service or a
worker while the command follows the session, it names the process instead of failing with a
connection traceback, and an interrupted process is not reported with its log's traceback."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from clients.admin import AdminClient, ServiceUnavailable
from clients.local.federation import follow
from clients.local.processes import FederationFailed, ManagedProcess, stop_all


class FakeProcess:
    """A process whose exit is scripted: ``poll`` answers None ``running`` times, then ``code``
    (None: runs until it is terminated or killed)."""

    def __init__(self, code: int | None, running: int = 0) -> None:
        self.code = code
        self.running = running
        self.returncode: int | None = None
        self.signals: list[str] = []

    def poll(self) -> int | None:
        if self.running > 0 or self.code is None:
            self.running -= 1
            return None
        self.returncode = self.code
        return self.code

    def wait(self, timeout: float | None = None) -> int | None:
        if self.code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        self.running = 0
        return self.poll()

    def terminate(self) -> None:
        self.signals.append("TERM")
        self.code = -signal.SIGTERM if self.code is None else self.code

    def kill(self) -> None:
        self.signals.append("KILL")
        self.code = -signal.SIGKILL if self.code is None else self.code


def _managed(tmp_path: Path, name: str, process: FakeProcess, log: str = "") -> ManagedProcess:
    path = tmp_path / f"{name.replace(' ', '-')}.log"
    path.write_text(log)
    return ManagedProcess(name=name, process=process, log_path=path)  # type: ignore[arg-type]


def _unreachable_admin() -> AdminClient:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    return AdminClient(
        base_url="http://127.0.0.1:9",
        token="t",
        transport=httpx.MockTransport(refuse),
        sleep=lambda seconds: None,
    )


def _follow_fails(processes: list[ManagedProcess]) -> Any:
    with _unreachable_admin() as admin, pytest.raises((FederationFailed, ServiceUnavailable)) as e:
        follow(admin, "s", processes, passes_total=10, progress=False)
    return e.value


def test_a_service_that_stops_between_the_check_and_the_poll_is_named(tmp_path: Path) -> None:
    """The race: the service is alive at the check, gone at the status call (Ctrl-C reaches it
    first, it stops cleanly with code 0)."""
    service = _managed(tmp_path, "service", FakeProcess(0, running=1), log="Traceback ...")
    worker = _managed(tmp_path, "worker 0", FakeProcess(None))
    failure = _follow_fails([service, worker])
    assert isinstance(failure, FederationFailed)
    assert str(failure) == "service stopped before the training finished"


def test_an_interrupted_worker_is_named_without_its_traceback(tmp_path: Path) -> None:
    service = _managed(tmp_path, "service", FakeProcess(None))
    worker = _managed(tmp_path, "worker 1", FakeProcess(130), log="Traceback (most recent ...")
    failure = _follow_fails([service, worker])
    assert str(failure) == "worker 1 was interrupted (exit code 130)"
    killed = _managed(tmp_path, "worker 2", FakeProcess(-signal.SIGKILL))
    assert str(_follow_fails([service, killed])) == "worker 2 was killed (exit code -9)"


def test_a_live_but_unreachable_service_is_one_line(tmp_path: Path) -> None:
    service = _managed(tmp_path, "service", FakeProcess(None))
    worker = _managed(tmp_path, "worker 0", FakeProcess(None))
    failure = _follow_fails([service, worker])
    assert isinstance(failure, ServiceUnavailable)
    assert str(failure).startswith("cannot reach the service at http://127.0.0.1:9: ConnectError")


def test_a_failing_worker_is_shown_with_the_end_of_its_log(tmp_path: Path) -> None:
    service = _managed(tmp_path, "service", FakeProcess(None))
    worker = _managed(tmp_path, "worker 2", FakeProcess(1), log="loading\nbad partition\n")
    failure = _follow_fails([service, worker])
    assert str(failure) == "worker 2 exited with code 1:\nloading\nbad partition"


def test_stop_all_stops_every_running_process(tmp_path: Path) -> None:
    processes = [
        _managed(tmp_path, "service", FakeProcess(None)),
        _managed(tmp_path, "worker 0", FakeProcess(None)),
        _managed(tmp_path, "worker 1", FakeProcess(0)),  # already done
    ]
    stop_all(processes, grace=0.1)
    assert [m.process.signals for m in processes] == [["TERM"], ["TERM"], []]
    assert all(m.process.poll() is not None for m in processes)
