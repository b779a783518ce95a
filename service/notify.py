"""Long-poll support: wake the requests waiting on a session when something in it changes.

A waiter checks the store when it arrives and then only when it is woken: by a change that can
change its answer (an upload or a download that forms a slot's result, a session closed, a
client rejoining, an alignment set posted), at a straggler deadline (one clock timer per
deadline, however many wait for it), and once more when its own wait runs out. In between it
costs nothing: no thread, no store lock, no timer but its own deadline. Every time is the
service's :class:`~service.clock.Clock`.

Two notifiers, one interface: :class:`SessionNotifier` wakes the waiters of this process (one
``glasu serve`` on SQLite); :class:`PostgresNotifier` also tells every other replica on the same
PostgreSQL database, through LISTEN/NOTIFY (:mod:`service.notify_postgres`). Straggler deadlines
stay timers of each process: every replica with waiters schedules its own, from the deadline its
check read in the database, and a deadline wakes only the local waiters (whichever of them then
closes the slot notifies everybody).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from service.clock import Clock, Timer

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pending:
    """A long poll's check answering "not ready yet": who has sent their part, who still owes
    it, and when it may become ready without them (a straggler deadline, clock seconds). The
    routes render it as the wire's 202 :class:`secure.wire.common.Waiting`."""

    missing: list[int]
    received: list[int] = field(default_factory=list)
    closes_at: float | None = None


class SessionNotifier:
    """The waiters of each session in this process (one future each), one timer per pending
    deadline. Used from the event loop, except :meth:`notify_threadsafe` and :meth:`close`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._deadlines: dict[tuple[str, float], Timer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def subscribe(self, session_id: str) -> asyncio.Future[None]:
        """A future that the next :meth:`notify` of ``session_id`` completes."""
        self._loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = self._loop.create_future()
        self._waiters.setdefault(session_id, set()).add(woken)
        return woken

    def unsubscribe(self, session_id: str, woken: asyncio.Future[None]) -> None:
        waiters = self._waiters.get(session_id)
        if waiters is not None:
            waiters.discard(woken)
            if not waiters:
                del self._waiters[session_id]

    def waiters(self, session_id: str) -> int:
        """How many requests wait on ``session_id`` now."""
        return len(self._waiters.get(session_id, ()))

    def notify(self, session_id: str) -> None:
        """Something in ``session_id`` changed (committed): wake its waiters."""
        self._wake_local(session_id)

    def notify_threadsafe(self, session_id: str) -> None:
        """:meth:`notify` from a worker thread (the round engine); nobody to wake before the
        first waiter."""
        self._call_on_loop(self.notify, session_id)

    def close(self) -> None:
        """Stop whatever the notifier runs besides the event loop (nothing here)."""

    def notify_at(self, session_id: str, at: float) -> None:
        """:meth:`notify` at clock time ``at``: once, however many waiters ask for the same
        deadline. A deadline already past is not scheduled: the check that found it past has
        tried to close the slot, and whoever holds the slot notifies."""
        key = (session_id, at)
        if at > self.clock.now() and key not in self._deadlines:
            self._deadlines[key] = self.clock.call_at(at, lambda: self._due(key))

    @property
    def pending_deadlines(self) -> int:
        return len(self._deadlines)

    def _due(self, key: tuple[str, float]) -> None:
        del self._deadlines[key]
        self._wake_local(key[0])

    def _wake_local(self, session_id: str) -> None:
        for woken in self._waiters.pop(session_id, ()):
            _wake(woken)

    def _wake_everybody(self) -> None:
        for session_id in list(self._waiters):
            self._wake_local(session_id)

    def _call_on_loop(self, callback: Callable[..., None], *args: str) -> None:
        """Run ``callback`` on the event loop of the waiters, from any thread."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(callback, *args)


async def long_poll(
    notifier: SessionNotifier, session_id: str, check: Callable[[], T], *, timeout: float
) -> T:
    """Run the blocking ``check`` in a worker thread until it answers something other than
    :class:`Pending` or time is up: when called, whenever ``session_id`` is notified, at the
    answer's ``closes_at`` (an answer that can change without anybody notifying) and once more
    at the end."""
    clock = notifier.clock
    deadline = clock.now() + timeout
    expired = timeout <= 0
    woken: asyncio.Future[None] | None = None
    timer: Timer | None = None

    def expire() -> None:
        nonlocal expired
        expired = True
        if woken is not None:
            _wake(woken)

    try:
        while True:
            # Subscribe before checking, so a change between check and wait still wakes us.
            woken = notifier.subscribe(session_id)
            try:
                result = await run_in_threadpool(check)
                if not isinstance(result, Pending) or expired:
                    return result
                if result.closes_at is not None:
                    notifier.notify_at(session_id, result.closes_at)
                if timer is None:  # set once the first check waits
                    timer = clock.call_at(deadline, expire)
                await woken
            finally:
                notifier.unsubscribe(session_id, woken)
    finally:
        if timer is not None:
            timer.cancel()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
