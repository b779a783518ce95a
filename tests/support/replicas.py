"""Several ``glasu serve`` replicas on one database behind HAProxy, on loopback: the scaled-out
service of tests/e2e/test_replicas.py and ``bench/load.py --replicas N``.

    replicas = start_replicas(3, cluster.new_database("run"), root)
    with replicas, HAProxy.start(replicas.urls, root) as proxy:
        ...  # every client talks to proxy.url; replicas.kill(1) is kill -9

    python -m tests.support.replicas --database postgresql://... [--replicas 3]   # until Ctrl-C

HAProxy (Debian's ``haproxy``, run in the foreground) balances every request round robin, with
no stickiness: consecutive requests of one keep-alive connection go to different replicas, so
any replica must be able to serve any request of any session. It checks each replica's
``/healthz`` every second and stops sending to one after two failures; a request that cannot
connect is sent to another replica (``option redispatch``), and one cut off mid-answer comes
back as a 502 that the clients retry like any 5xx.
"""

from __future__ import annotations

import argparse
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from clients.local.processes import (
    STARTUP_SECONDS,
    FederationFailed,
    ManagedProcess,
    ServedService,
    free_port,
    glasu_command,
    start_process,
    start_serve,
    stop_all,
)

#: Where Debian's package installs HAProxy (not on a non-root user's PATH).
DEBIAN_HAPROXY = Path("/usr/sbin/haproxy")

#: Longer than the longest long poll (``MAX_LONG_POLL_SECONDS``, 60 s): HAProxy must not cut a
#: waiting download, nor a client's idle keep-alive connection between two passes.
PROXY_TIMEOUT_SECONDS = 90

#: One line per request on HAProxy's output: the replica that served it, the status, the
#: method and the URI (parsed by :meth:`HAProxy.served_by`).
ACCESS_LINE = re.compile(r"^glasu-access (?P<server>\S+) (?P<status>-?\d+) (?P<method>\S+) ")


def haproxy_binary() -> Path | None:
    """HAProxy on PATH or where Debian installs it; None when it is not installed."""
    found = shutil.which("haproxy")
    if found:
        return Path(found)
    return DEBIAN_HAPROXY if DEBIAN_HAPROXY.exists() else None


class StoppedOnExit:
    """``with`` stops it (``self.stop()``), whatever happens."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class Replicas(StoppedOnExit):
    """``glasu serve`` processes sharing one database and one admin token."""

    services: list[ServedService]
    admin_token: str

    @property
    def urls(self) -> list[str]:
        return [served.url for served in self.services]

    @property
    def processes(self) -> list[ManagedProcess]:
        return [served.managed for served in self.services]

    def kill(self, index: int) -> int:
        """kill -9 replica ``index``; its exit code once it is gone."""
        process = self.services[index].process
        process.send_signal(signal.SIGKILL)
        return process.wait()

    def stop(self) -> None:
        stop_all(self.processes)


def start_replicas(
    count: int,
    database: str | Path,
    root: Path,
    *,
    admin_token: str | None = None,
    extra_args: Sequence[str] = (),
    command: Callable[..., list[str]] = glasu_command,
) -> Replicas:
    """``count`` healthy ``glasu serve`` processes on ``database`` (a ``postgresql://`` URL;
    an SQLite path works for one replica only), each on its own free loopback port with its log
    ``root / replica-<i>.log`` and the same admin token (default: a fresh one). The first starts
    alone and applies the schema migrations; the others then start together."""
    token = admin_token or secrets.token_urlsafe(32)
    replicas = Replicas([], token)
    try:
        for batch in ([0], range(1, count)):
            started = [
                start_serve(
                    root,
                    admin_token=token,
                    database=database,
                    name=f"replica-{i}",
                    extra_args=extra_args,
                    command=command,
                )
                for i in batch
            ]
            replicas.services += started
            for served in started:
                served.wait_healthy()
    except BaseException:
        replicas.stop()
        raise
    return replicas


@dataclass
class HAProxy(StoppedOnExit):
    """HAProxy in the foreground on a free loopback port, in front of some HTTP backends."""

    managed: ManagedProcess
    url: str
    config_path: Path

    @classmethod
    def start(
        cls,
        backends: Sequence[str],
        root: Path,
        *,
        port: int | None = None,
        binary: Path | None = None,
        timeout: float = STARTUP_SECONDS,
    ) -> HAProxy:
        """Write ``root / haproxy.cfg`` for ``backends`` (``http://host:port`` URLs), check it,
        start HAProxy (log ``root / haproxy.log``) and wait until it answers ``/healthz``."""
        binary = binary or haproxy_binary()
        if binary is None:
            raise FederationFailed("HAProxy is not installed (Debian: apt-get install haproxy)")
        port = port or free_port()
        config_path = root / "haproxy.cfg"
        config_path.write_text(haproxy_config(backends, port))
        check = start_process("haproxy check", [str(binary), "-c", "-f", str(config_path)],
                              root / "haproxy-check.log")  # fmt: skip
        if check.process.wait(timeout=30) != 0:
            raise FederationFailed(f"HAProxy refuses {config_path}:\n{check.tail()}")
        managed = start_process(
            "haproxy", [str(binary), "-db", "-f", str(config_path)], root / "haproxy.log"
        )
        proxy = cls(managed, f"http://127.0.0.1:{port}", config_path)
        try:
            proxy.wait_ready(timeout)
        except BaseException:
            proxy.stop()
            raise
        return proxy

    def wait_ready(self, timeout: float = STARTUP_SECONDS) -> None:
        """Until ``/healthz`` through the proxy answers 200."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                code = self.managed.process.poll()
                if code is not None:
                    raise FederationFailed(f"HAProxy exited with code {code}:\n{self.tail()}")
                try:
                    if http.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise FederationFailed(f"HAProxy did not answer in {timeout:.0f} s:\n{self.tail()}")

    def served_by(self, method: str | None = None) -> Counter[str]:
        """Requests answered so far (of ``method`` only, when given), per backend server
        (``replica-<i>``, in the order of the backends; ``<NOSRV>`` when none could take it)."""
        counts: Counter[str] = Counter()
        for line in self.managed.log_text().splitlines():
            found = ACCESS_LINE.match(line)
            if found and method in (None, found["method"]):
                counts[found["server"]] += 1
        return counts

    def tail(self, lines: int = 15) -> str:
        return self.managed.tail(lines)

    def stop(self) -> None:
        stop_all([self.managed])


def haproxy_config(backends: Sequence[str], port: int) -> str:
    """HTTP mode, round robin, no stickiness (no cookie, no ``prefer-last-server``), health
    checks on ``/healthz``, timeouts above the longest long poll, one access line per request
    on standard output."""
    servers = "\n".join(
        f"    server replica-{i} {url.split('://', 1)[1]} check" for i, url in enumerate(backends)
    )
    timeout = f"{PROXY_TIMEOUT_SECONDS}s"
    return f"""\
global
    log stdout format raw local0 info

defaults
    mode http
    log global
    log-format "glasu-access %s %ST %HM %HU"
    option redispatch
    retries 3
    timeout connect 5s
    timeout client {timeout}
    timeout server {timeout}
    timeout http-request {timeout}
    timeout http-keep-alive {timeout}
    timeout queue {timeout}

frontend glasu
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 1s fall 2 rise 2
{servers}
"""


def main() -> int:
    """Replicas on ``--database`` behind HAProxy, on loopback, until Ctrl-C."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--database", required=True, help="postgresql://... (GLASU_DATABASE)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--public-context", type=Path, help="to accept CKKS sessions")
    args = parser.parse_args()
    extra = ["--public-context", str(args.public_context)] if args.public_context else []
    with tempfile.TemporaryDirectory(prefix="glasu-replicas-") as tmp:
        root = Path(tmp)
        with (
            start_replicas(args.replicas, args.database, root, extra_args=extra) as replicas,
            HAProxy.start(replicas.urls, root) as proxy,
        ):
            token_file = replicas.services[0].admin_token_file
            print(f"{args.replicas} replicas behind {proxy.url}; admin token in {token_file}")
            try:
                while all(s.process.poll() is None for s in replicas.services):
                    time.sleep(1.0)
            except KeyboardInterrupt:
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
