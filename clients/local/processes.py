"""The processes of a federation on this machine: start each with its log, name how it ended,
and stop them all, whatever happens."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: ``glasu``'s exit code when interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130


class FederationFailed(RuntimeError):
    """A process of the local federation failed; the message says which and why."""


#: How often the local federation restarts one crashed worker (it resumes from its checkpoint).
MAX_WORKER_RESTARTS = 3

#: Exit codes of a crash (killed by the kernel or by kill -9, a fatal signal of its own), not of
#: a stop that someone asked for (SIGINT, SIGTERM) or of a failure the worker reported itself.
CRASH_CODES = frozenset(
    -sig for sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL)
)


@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen
    log_path: Path
    command: tuple[str, ...] = ()
    restarts: int = 0

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def glasu_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "clients.cli.main", *args]


def secret_file(path: Path, content: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(content)
    return path


def start_process(name: str, command: Sequence[str], log_path: Path) -> ManagedProcess:
    log = log_path.open("wb")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    log.close()
    return ManagedProcess(name=name, process=process, log_path=log_path, command=tuple(command))


def restart_process(managed: ManagedProcess) -> None:
    """Start ``managed``'s command again, its output appended to the same log."""
    if not managed.command:
        raise ValueError(f"{managed.name} has no command to restart")
    with managed.log_path.open("ab") as log:
        log.write(f"--- restarted after exit code {managed.process.returncode} ---\n".encode())
        log.flush()
        managed.process = subprocess.Popen(
            managed.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    managed.restarts += 1


def crashed(code: int | None) -> bool:
    """Whether exit code ``code`` is a crash (see :data:`CRASH_CODES`)."""
    return code in CRASH_CODES


def stop_all(processes: Sequence[ManagedProcess], grace: float = 5.0) -> None:
    """Workers first, the service last; SIGTERM, then SIGKILL after ``grace`` seconds. A second
    Ctrl-C while they stop kills the rest at once instead of leaving them behind."""
    for managed in reversed(processes):
        if managed.process.poll() is None:
            managed.process.terminate()
    deadline = time.monotonic() + grace
    try:
        for managed in reversed(processes):
            try:
                managed.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                managed.process.kill()
                managed.process.wait()
    except KeyboardInterrupt:
        for managed in processes:
            if managed.process.poll() is None:
                managed.process.kill()
        for managed in processes:
            managed.process.wait()
        raise


def exit_failure(managed: ManagedProcess, code: int) -> FederationFailed:
    """How a process of the federation ended, for people. Stopped or interrupted processes
    (Ctrl-C reaches the whole process group; the service stops cleanly, with code 0) are named
    without their log, which may end in a traceback of the interruption."""
    if code in (EXIT_INTERRUPTED, -signal.SIGINT):
        return FederationFailed(f"{managed.name} was interrupted (exit code {code})")
    if code in (-signal.SIGTERM, -signal.SIGKILL):
        return FederationFailed(f"{managed.name} was killed (exit code {code})")
    if code == 0:
        return FederationFailed(f"{managed.name} stopped before the training finished")
    return FederationFailed(f"{managed.name} exited with code {code}:\n{managed.tail()}")
