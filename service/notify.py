"""Long-poll support: wake the requests waiting on a session when something in it changes.

Waiters re-check the store after every wake-up and at least every ``RECHECK_SECONDS``, so a
missed notification costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")
W = TypeVar("W")

RECHECK_SECONDS = 1.0


class SessionNotifier:
    """One :class:`asyncio.Event` per session with waiters; used from the event loop only."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def event(self, session_id: str) -> asyncio.Event:
        event = self._events.get(session_id)
        if event is None:
            event = self._events[session_id] = asyncio.Event()
        return event

    def notify(self, session_id: str) -> None:
        event = self._events.pop(session_id, None)
        if event is not None:
            event.set()


async def long_poll(
    notifier: SessionNotifier,
    session_id: str,
    check: Callable[[], T | W],
    *,
    is_waiting: Callable[[T | W], bool],
    timeout: float,
    recheck_in: Callable[[T | W], float | None] = lambda _: None,
) -> T | W:
    """Run the blocking ``check`` in a worker thread until it stops waiting or time is up.
    ``recheck_in`` may bring the next check forward (seconds; None: ``RECHECK_SECONDS``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        # Take the event before checking, so a change between check and wait still wakes us.
        event = notifier.event(session_id)
        result = await run_in_threadpool(check)
        remaining = deadline - loop.time()
        if not is_waiting(result) or remaining <= 0:
            return result
        with contextlib.suppress(TimeoutError):
            due = recheck_in(result)
            recheck = RECHECK_SECONDS if due is None else min(max(due, 0.01), RECHECK_SECONDS)
            await asyncio.wait_for(event.wait(), timeout=min(remaining, recheck))
