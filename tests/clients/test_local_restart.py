"""`glasu train` starts a crashed worker again (it resumes from its checkpoint) instead of
failing the run; a worker that keeps crashing, or fails on its own, still ends the run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from clients.admin import AdminClient
from clients.local.federation import follow
from clients.local.processes import (
    MAX_WORKER_RESTARTS,
    FederationFailed,
    ManagedProcess,
    crashed,
)


class Scripted:
    """A process that has already exited with ``code`` (or runs, with None)."""

    def __init__(self, code: int | None) -> None:
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


def status_admin() -> AdminClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"current_pass": 1, "metrics": []})

    return AdminClient(
        base_url="http://glasu.test", token="t", transport=httpx.MockTransport(answer)
    )


def managed(tmp_path: Path, name: str, code: int | None, command: tuple[str, ...] = ()):
    log = tmp_path / f"{name.replace(' ', '-')}.log"
    log.write_text("before the crash\n")
    return ManagedProcess(name, Scripted(code), log, command=command)  # type: ignore[arg-type]


def test_a_killed_worker_is_started_again_with_its_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = managed(tmp_path, "service", None)
    worker = managed(
        tmp_path, "worker 1", -signal.SIGKILL, (sys.executable, "-c", "print('resumed')")
    )
    with status_admin() as admin:
        follow(admin, "s", [service, worker], passes_total=4, progress=False)
    assert worker.restarts == 1 and isinstance(worker.process, subprocess.Popen)
    assert worker.process.returncode == 0
    assert worker.log_path.read_text() == (
        "before the crash\n--- restarted after exit code -9 ---\nresumed\n"
    )
    assert "worker 1 crashed (exit code -9); restarted it (1 of 3)" in capsys.readouterr().err


def test_a_worker_that_keeps_crashing_ends_the_run(tmp_path: Path) -> None:
    service = managed(tmp_path, "service", None)
    worker = managed(
        tmp_path, "worker 0", -signal.SIGKILL,
        (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
    )  # fmt: skip
    with status_admin() as admin, pytest.raises(FederationFailed, match="worker 0 was killed"):
        follow(admin, "s", [service, worker], passes_total=4, progress=False)
    assert worker.restarts == MAX_WORKER_RESTARTS


def test_only_crashes_are_restarted() -> None:
    assert crashed(-signal.SIGKILL) and crashed(-signal.SIGSEGV)
    for code in (None, 0, 1, 3, 4, 5, 6, 130, -signal.SIGINT, -signal.SIGTERM):
        assert not crashed(code), code
