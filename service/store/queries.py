"""The part of a store transaction that every group of queries shares: the connection and the
clock."""

from __future__ import annotations

import sqlite3

from service.clock import Clock


class Queries:
    """Base of the query groups a :class:`~service.store.Transaction` is made of."""

    def __init__(self, connection: sqlite3.Connection, clock: Clock) -> None:
        self._db = connection
        self._clock = clock

    def now(self) -> float:
        """The service clock's time: every timestamp a row holds."""
        return self._clock.now()
