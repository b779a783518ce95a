"""The bodies of the latest sums in memory, within a byte budget (older ones are read from the
payload store). The budget is a bound, never passed: a body larger than the whole budget is not
kept at all."""

from __future__ import annotations

import threading
from collections import OrderedDict

from service.store import Slot


class RecentSums:
    """The bodies of the latest sums, newest first, within a byte budget."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bodies: OrderedDict[Slot, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Slot) -> bytes | None:
        with self._lock:
            return self._bodies.get(key)

    @property
    def budget(self) -> int:
        return self._max_bytes

    @property
    def held_bytes(self) -> int:
        """The bytes of the bodies kept now (at most the budget)."""
        with self._lock:
            return self._bytes

    def put(self, key: Slot, body: bytes) -> None:
        with self._lock:
            self._pop(key)
            if len(body) > self._max_bytes:
                return
            self._bodies[key] = body
            self._bytes += len(body)
            while self._bytes > self._max_bytes:
                self._pop(next(iter(self._bodies)))

    def drop(self, session_id: str, *, before_pass: int) -> None:
        with self._lock:
            for key in [k for k in self._bodies if k[0] == session_id and k[1] < before_pass]:
                self._pop(key)

    def _pop(self, key: Slot) -> None:
        body = self._bodies.pop(key, None)
        if body is not None:
            self._bytes -= len(body)
