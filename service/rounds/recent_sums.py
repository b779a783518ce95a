"""The bodies of the latest sums in memory, within a byte budget (older ones are read from the
payload store)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from service.store.payload_rows import BodySlot


class RecentSums:
    """The bodies of the latest sums, newest first, within a byte budget."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bodies: OrderedDict[BodySlot, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: BodySlot) -> bytes | None:
        with self._lock:
            return self._bodies.get(key)

    def put(self, key: BodySlot, body: bytes) -> None:
        with self._lock:
            self._pop(key)
            self._bodies[key] = body
            self._bytes += len(body)
            while self._bytes > self._max_bytes and len(self._bodies) > 1:
                self._pop(next(iter(self._bodies)))

    def drop(self, session_id: str, *, before_pass: int) -> None:
        with self._lock:
            for key in [k for k in self._bodies if k[0] == session_id and k[1] < before_pass]:
                self._pop(key)

    def _pop(self, key: BodySlot) -> None:
        body = self._bodies.pop(key, None)
        if body is not None:
            self._bytes -= len(body)
