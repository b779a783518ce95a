"""The processes of a federation on this machine: start each with its log, name how it ended,
and stop them all, whatever happens. ``glasu serve`` on a free loopback port is started here
for ``glasu train`` and for the tests and benchmarks (:func:`start_serve`), one way."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

#: ``glasu``'s exit code when interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130


class FederationFailed(RuntimeError):
    """A process of the local federation failed; the message says which and why."""


#: How long ``glasu serve`` may take to answer ``/healthz`` (a loaded machine included).
STARTUP_SECONDS = 60.0

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

    def log_text(self) -> str:
        """Its whole log ("" when it cannot be read)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)


def log_tail(log: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a process's log, printed when it failed ("" when the log
    cannot be read)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def glasu_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "clients.cli.main", *args]


def without_glasu_settings(**extra: str) -> dict[str, str]:
    """This process's environment without its ``GLASU_*`` settings (a started ``glasu`` reads
    only its arguments), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GLASU_")}, **extra}


def secret_file(path: Path, content: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(content)
    return path


def start_process(
    name: str,
    command: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
            env=env,
        )  # fmt: skip
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


@dataclass
class ServedService:
    """``glasu serve`` started by :func:`start_serve`: its process, its URL, its admin token
    (and the file it reads it from) and how a client checks its certificate (with TLS)."""

    managed: ManagedProcess
    url: str
    admin_token: str
    admin_token_file: Path
    verify: ssl.SSLContext | bool = True

    @property
    def process(self) -> subprocess.Popen:
        return self.managed.process

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.managed.log_text()

    def wait_healthy(self, timeout: float = STARTUP_SECONDS, poll_seconds: float = 0.2) -> None:
        """Until ``GET /healthz`` answers 200; :class:`FederationFailed` when the process exits
        first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, verify=self.verify, timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise exit_failure(self.managed, code)
                try:
                    if http.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(poll_seconds)
        raise FederationFailed(
            f"the service did not become healthy in {timeout:.0f} s:\n{self.managed.tail()}"
        )

    def stop(self, grace: float = 15.0) -> None:
        stop_all([self.managed], grace)


def start_serve(
    root: Path,
    *,
    admin_token: str,
    database: Path | str | None = None,
    name: str = "service",
    extra_args: Sequence[str] = (),
    tls_dir: Path | None = None,
    command: Callable[..., list[str]] = glasu_command,
    port: int | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ServedService:
    """Start ``command(*serve arguments)`` (default: this interpreter's ``glasu serve``) on
    loopback at ``port`` (default: a free one), on ``database`` (default ``root /
    service.sqlite3``; a ``postgresql://`` URL goes to the process as ``GLASU_DATABASE``, off
    its command line, where it could show a password), with ``admin_token`` in the private file
    ``root / admin.token`` and its log in ``root / name.log``. ``extra_args``: more ``serve``
    options (``--public-context PATH``). ``tls_dir``: serve HTTPS with the ``server.crt`` and
    ``server.key`` there (deploy/dev-ca.sh), trusting its ``ca.crt``. Does not wait: call
    :meth:`ServedService.wait_healthy`."""
    port = port or free_port()
    token_file = secret_file(root / "admin.token", admin_token)
    database_args = ["--database", str(database or root / "service.sqlite3")]
    if isinstance(database, str) and "://" in database:
        env = {**(os.environ if env is None else env), "GLASU_DATABASE": database}
        database_args = []
    serve_args = [
        "serve", "--host", "127.0.0.1", "--port", str(port), *database_args,
        "--admin-token-file", str(token_file), "--log-level", "warning", *extra_args,
    ]  # fmt: skip
    scheme, verify = "http", True
    if tls_dir is not None:
        serve_args += ["--tls-certfile", str(tls_dir / "server.crt")]
        serve_args += ["--tls-keyfile", str(tls_dir / "server.key")]
        scheme, verify = "https", ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    managed = start_process(name, command(*serve_args), root / f"{name}.log", cwd=cwd, env=env)
    url = f"{scheme}://127.0.0.1:{port}"
    return ServedService(managed, url, admin_token, token_file, verify)
