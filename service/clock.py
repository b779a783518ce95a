"""The service's clock: wall-clock seconds (epoch) for every timestamp and deadline it keeps
(rows' ``created_at``, straggler deadlines, long-poll waits), and timers at such a time.

The app takes a :class:`Clock` (``create_app(settings, clock=...)``): :class:`SystemClock` in
production, :class:`ManualClock` in tests, which moves only when the test advances it, so that
no test waits for real time to pass. ``SystemClock`` reads ``time.time`` at each call, so a
process that replaces ``time.time`` (the straggler end-to-end test speeds up ``glasu serve``'s
clock that way) changes the service's clock too.

Several replicas on one PostgreSQL database must agree on the time (a straggler deadline set by
one is checked by another): there the store's clock is a :class:`DatabaseClock`, the
database's ``clock_timestamp()``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the running event loop once ``now() >= at``; call from the loop."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, at - time.time()), callback)


class DatabaseClock:
    """The database's time, read cheaply: the offset between ``read_database_time()`` and the
    local monotonic clock is measured (at the middle of the query's round trip, so it is off by
    at most half of it) and refreshed every ``refresh_seconds``; ``now()`` is the monotonic
    clock plus that offset, and never goes back. Every replica thus reads the database's one
    clock, within a round trip, whatever each machine's wall clock says."""

    def __init__(
        self, read_database_time: Callable[[], float], *, refresh_seconds: float = 30.0
    ) -> None:
        self._read = read_database_time
        self._refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._offset = 0.0
        self._measured_at = -float("inf")
        self._last = -float("inf")
        self._measure()

    def now(self) -> float:
        if time.monotonic() - self._measured_at > self._refresh_seconds:
            self._measure()
        with self._lock:
            self._last = max(self._last, time.monotonic() + self._offset)
            return self._last

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, at - self.now()), callback)

    def _measure(self) -> None:
        before = time.monotonic()
        at = self._read()
        after = time.monotonic()
        with self._lock:
            self._offset = at - (before + after) / 2
            self._measured_at = after


class ManualClock:
    """A clock that stands still until :meth:`advance`; its timers fire (on their event loops)
    when it passes their time. Thread-safe: the service reads it from worker threads."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        with self._lock:
            return self._now

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(asyncio.get_running_loop(), callback)
        with self._lock:
            heapq.heappush(self._timers, (at, next(self._order), timer))
        self._fire_due()
        return timer

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
        self._fire_due()

    @property
    def pending_timers(self) -> int:
        with self._lock:
            return sum(not t.cancelled for _, _, t in self._timers)

    def _fire_due(self) -> None:
        with self._lock:
            due = []
            while self._timers and self._timers[0][0] <= self._now:
                due.append(heapq.heappop(self._timers)[2])
        for timer in due:
            timer.fire()


class _ManualTimer:
    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        if not self.cancelled and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        if not self.cancelled:
            self._callback()
