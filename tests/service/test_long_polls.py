"""Waiting long polls cost nothing until something can change their answer: no periodic
re-check through the thread pool and the store's lock, one timer per straggler deadline. Time is
the service's clock, a :class:`ManualClock` advanced by hand (no test here depends on how fast
the machine is)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    bearer,
    client_path,
    create_session,
    http_client,
    node_headers,
    nodes_body,
)

from service.app import service_context
from service.clock import ManualClock

pytestmark = pytest.mark.anyio

WAITERS = 300


class CountedChecks:
    """Counts the downloads' store checks (run in worker threads); ``reached(n)`` waits until
    ``n`` have returned."""

    def __init__(self, app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._goal: tuple[int, asyncio.Event] | None = None
        self._loop = asyncio.get_running_loop()
        downloads = service_context(app).engine.downloads
        get = downloads.get

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return get(*args, **kwargs)
            finally:
                with self._lock:
                    self.count += 1
                    if self._goal is not None and self.count >= self._goal[0]:
                        self._loop.call_soon_threadsafe(self._goal[1].set)

        monkeypatch.setattr(downloads, "get", counted)

    async def reached(self, n: int) -> None:
        event = asyncio.Event()
        with self._lock:
            self._goal = (n, event)
            if self.count >= n:
                event.set()
        await event.wait()


async def _put_nodes(http: httpx.AsyncClient, created: dict[str, Any], m: int) -> None:
    nodes = np.arange(5) + m
    response = await http.put(
        f"{client_path(created['session_id'], m)}/passes/0/layers/1/nodes",
        content=nodes_body(nodes),
        headers={**bearer(created["client_tokens"][m]), **node_headers(nodes)},
    )
    assert response.status_code == 201, response.text


def _union_polls(
    http: httpx.AsyncClient, created: dict[str, Any], m: int
) -> list[asyncio.Task[httpx.Response]]:
    url = f"{client_path(created['session_id'], m)}/passes/0/layers/1/nodes"

    def poll() -> Awaitable[httpx.Response]:
        return http.get(url, params={"wait": 60}, headers=bearer(created["client_tokens"][m]))

    return [asyncio.ensure_future(poll()) for _ in range(WAITERS)]


async def _let_the_loop_run(iterations: int = 50) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)


async def test_waiting_long_polls_are_not_checked_again_until_their_slot_completes(
    make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    app = make_app(long_poll_seconds=60, clock=clock)
    checks = CountedChecks(app, monkeypatch)
    async with http_client(app) as http:
        created, other = await create_session(http), await create_session(http)
        polls = _union_polls(http, created, 0)
        await checks.reached(WAITERS)  # each has checked once and waits
        clock.advance(30)  # half their wait: a periodic re-check would be due many times over
        await _let_the_loop_run()
        health = await http.get("/healthz")
        elsewhere = await http.get(
            f"{client_path(other['session_id'], 0)}/passes/0",
            headers=bearer(other["client_tokens"][0]),
        )
        assert health.status_code == 200 and elsewhere.status_code == 200
        assert checks.count == WAITERS
        for m in range(3):  # the third node set completes the slot and wakes them, once each
            await _put_nodes(http, created, m)
        answers = await asyncio.gather(*polls)
    assert [a.status_code for a in answers] == [200] * WAITERS
    assert checks.count == 2 * WAITERS


async def test_a_wait_that_runs_out_is_checked_once_more(
    make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    app = make_app(long_poll_seconds=60, clock=clock)
    checks = CountedChecks(app, monkeypatch)
    async with http_client(app) as http:
        created = await create_session(http)
        polls = _union_polls(http, created, 0)
        await checks.reached(WAITERS)
        await _put_nodes(http, created, 1)  # does not complete the slot: wakes nobody
        clock.advance(60)
        answers = await asyncio.gather(*polls)
    assert {a.status_code for a in answers} == {202}
    assert {tuple(a.json()["received"]) for a in answers} == {(1,)}  # the last check's view
    assert checks.count == 2 * WAITERS


async def test_a_straggler_deadline_is_one_timer_for_all_its_waiters(
    make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    app = make_app(long_poll_seconds=60, clock=clock)
    notifier = service_context(app).notifier
    checks = CountedChecks(app, monkeypatch)
    async with http_client(app) as http:
        created = await create_session(http, stragglers="continue", straggler_wait_seconds=10)
        for m in (0, 1):
            await _put_nodes(http, created, m)
        polls = _union_polls(http, created, 0)
        await checks.reached(WAITERS)
        assert notifier.pending_deadlines == 1
        clock.advance(10)  # the wait is over: the slot closes without client 2
        answers = await asyncio.gather(*polls)
    assert [a.status_code for a in answers] == [200] * WAITERS
    assert notifier.pending_deadlines == 0
    assert checks.count == 2 * WAITERS
