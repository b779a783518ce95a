"""Long-poll support: wake the requests waiting on a session when something in it changes.

A waiter checks the store when it arrives and then only when it is woken: by a change that can
change its answer (an upload or a download that forms a slot's result, a session closed, a
client rejoining, an alignment set posted), at a straggler deadline (one loop timer per
deadline, however many wait for it), and once more when its own wait runs out. In between it
costs nothing: no thread, no store lock, no timer but its own deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")
W = TypeVar("W")


class SessionNotifier:
    """One :class:`asyncio.Event` per session with waiters, one timer per pending deadline. Used
    from the event loop, except :meth:`notify_threadsafe`."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._deadlines: dict[tuple[str, float], asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def event(self, session_id: str) -> asyncio.Event:
        self._loop = asyncio.get_running_loop()
        event = self._events.get(session_id)
        if event is None:
            event = self._events[session_id] = asyncio.Event()
        return event

    def notify(self, session_id: str) -> None:
        event = self._events.pop(session_id, None)
        if event is not None:
            event.set()

    def notify_threadsafe(self, session_id: str) -> None:
        """:meth:`notify` from a worker thread (the round engine); nobody to wake before the
        first waiter."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(self.notify, session_id)

    def notify_at(self, session_id: str, at: float) -> None:
        """:meth:`notify` at wall-clock time ``at`` (``time.time()``): once, however many
        waiters ask for the same deadline. A deadline already past is not scheduled: the check
        that found it past has tried to close the slot, and whoever holds the slot notifies."""
        key = (session_id, at)
        delay = at - time.time()
        if delay > 0 and key not in self._deadlines:
            self._deadlines[key] = asyncio.get_running_loop().call_later(delay, self._due, key)

    @property
    def pending_deadlines(self) -> int:
        return len(self._deadlines)

    def _due(self, key: tuple[str, float]) -> None:
        del self._deadlines[key]
        self.notify(key[0])


async def long_poll(
    notifier: SessionNotifier,
    session_id: str,
    check: Callable[[], T | W],
    *,
    is_waiting: Callable[[T | W], bool],
    timeout: float,
    wake_at: Callable[[T | W], float | None] = lambda _: None,
) -> T | W:
    """Run the blocking ``check`` in a worker thread until it stops waiting or time is up: when
    called, whenever ``session_id`` is notified, and once more at the end. ``wake_at`` may name
    a wall-clock time at which a waiting answer can change without anybody notifying (a
    straggler deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        # Take the event before checking, so a change between check and wait still wakes us.
        event = notifier.event(session_id)
        result = await run_in_threadpool(check)
        remaining = deadline - loop.time()
        if not is_waiting(result) or remaining <= 0:
            return result
        at = wake_at(result)
        if at is not None:
            notifier.notify_at(session_id, at)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await event.wait()
