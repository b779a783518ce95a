"""The load balancer of the replicated service (tests/support/replicas.py): a real HAProxy in
front of two real ``glasu serve`` processes (each on its own SQLite file: only ``/healthz`` is
asked), round robin per request on one keep-alive connection, and a replica killed with kill -9
costs no request."""

from __future__ import annotations

import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from clients.local.processes import start_serve
from tests.support.replicas import HAProxy, Replicas, haproxy_binary, haproxy_config

REQUESTS = 20


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[tuple[Replicas, HAProxy]]:
    with replicas_behind_haproxy(tmp_path) as replicas_and_proxy:
        yield replicas_and_proxy


@contextmanager
def replicas_behind_haproxy(tmp_path: Path, *serve_args: str) -> Iterator[tuple[Replicas, HAProxy]]:
    """Two ``glasu serve`` (with ``serve_args``) behind HAProxy, with the config of
    docs/deploy.md (``haproxy_config``)."""
    if haproxy_binary() is None:
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy; .ci/run does)")
    token = secrets.token_urlsafe(24)
    replicas = Replicas([], token)
    with replicas:
        for i in range(2):
            served = start_serve(
                tmp_path, admin_token=token, database=tmp_path / f"replica-{i}.sqlite3",
                name=f"replica-{i}", extra_args=serve_args,
            )  # fmt: skip
            replicas.services.append(served)
        for served in replicas.services:
            served.wait_healthy()
        with HAProxy.start(replicas.urls, tmp_path) as proxy:
            yield replicas, proxy


def test_haproxy_balances_every_request_round_robin(
    two_replicas: tuple[Replicas, HAProxy],
) -> None:
    _, proxy = two_replicas
    before = proxy.served_by("GET")
    with httpx.Client(base_url=proxy.url, timeout=10) as http:  # one keep-alive connection
        codes = [http.get("/healthz").status_code for _ in range(REQUESTS)]
    assert codes == [200] * REQUESTS
    served = wait_for_lines(proxy, before, REQUESTS)
    # no stickiness: the requests of one connection alternate between the replicas
    assert served == {"replica-0": REQUESTS // 2, "replica-1": REQUESTS // 2}, proxy.tail()


def test_a_killed_replica_costs_no_request(two_replicas: tuple[Replicas, HAProxy]) -> None:
    replicas, proxy = two_replicas
    assert replicas.kill(1) == -signal.SIGKILL
    before = proxy.served_by("GET")
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        # at once, before any health check has noticed: a refused connection is redispatched
        codes = [http.get("/healthz").status_code for _ in range(REQUESTS)]
    assert codes == [200] * REQUESTS
    assert wait_for_lines(proxy, before, REQUESTS) == {"replica-0": REQUESTS}, proxy.tail()


def test_the_config_balances_without_stickiness() -> None:
    config = haproxy_config(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], 9000)
    assert "balance roundrobin" in config and "mode http" in config
    assert "option httpchk GET /healthz" in config
    for sticky in ("cookie", "stick", "prefer-last-server", "balance source"):
        assert sticky not in config
    assert "server replica-1 127.0.0.1:8002 check" in config
    assert "timeout server 90s" in config  # above the longest long poll (60 s)


def wait_for_lines(proxy: HAProxy, before: dict[str, int], count: int) -> dict[str, int]:
    """The requests served since ``before``, once HAProxy has logged ``count`` of them."""
    deadline = time.monotonic() + 10
    while True:
        served = proxy.served_by("GET")
        new = {k: v - before.get(k, 0) for k, v in served.items() if v > before.get(k, 0)}
        if sum(new.values()) >= count or time.monotonic() > deadline:
            return new
        time.sleep(0.05)


BODY_LIMIT = 8 * 1024 * 1024
REFUSALS = 20


def test_refusals_on_the_head_of_large_bodies_reach_the_client_through_haproxy(
    tmp_path: Path,
) -> None:
    """A replica that answers 401 or 413 before reading a large body must not reset the
    connection with the body unread: HAProxy would then drop the answer, and the client (a
    worker) would see a broken connection, which it retries as transient."""
    with replicas_behind_haproxy(tmp_path, "--max-body-bytes", str(BODY_LIMIT)) as (
        replicas,
        proxy,
    ):
        unauthenticated = bytes(BODY_LIMIT)  # within the limit: refused for its token
        over_the_limit = b" " * (2 * BODY_LIMIT)  # JSON whitespace, never parsed
        admin = {"Authorization": f"Bearer {replicas.admin_token}"}
        answers: list[int | str] = []
        with httpx.Client(base_url=proxy.url, timeout=30) as http:
            for _ in range(REFUSALS):
                for content, headers in ((unauthenticated, {}), (over_the_limit, admin)):
                    try:
                        response = http.post(
                            "/v1/sessions",
                            content=content,
                            headers={**headers, "Content-Type": "application/json"},
                        )
                        answers.append(response.status_code)
                    except httpx.TransportError as exc:
                        answers.append(type(exc).__name__)
        assert answers == [401, 413] * REFUSALS, proxy.tail()
