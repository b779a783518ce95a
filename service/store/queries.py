"""The part of a store transaction that every group of queries shares: the connection, the
clock and the locks that serialise one session's transactions on PostgreSQL; and the column that
ties a row to its session, which every group's tables declare."""

from __future__ import annotations

from typing import Literal

from service.clock import Clock
from service.store.dialect import Backend, Connection

# The first key of PostgreSQL's two-key advisory locks: what the second (a hash) names.
LockScope = Literal["session", "slot", "alignment", "migrations", "listing-order", "body"]
LOCK_SCOPES: dict[LockScope, int] = {
    "session": 1,
    "slot": 2,
    "alignment": 3,
    "migrations": 4,
    "listing-order": 5,
    "body": 6,
}

#: The column that ties a row to its session, first in the tables of a session's rows.
SESSION_ID_COLUMN = "session_id TEXT NOT NULL REFERENCES sessions(id)"


def can_be_an_id(text: str) -> bool:
    """Whether ``text`` could name a row. The service makes its ids itself and none holds NUL,
    which PostgreSQL's text cannot hold at all (a query with one fails instead of finding
    nothing); asked for such an id, both databases answer "no such row" without a query."""
    return "\x00" not in text


class Queries:
    """Base of the query groups a :class:`~service.store.Transaction` is made of."""

    def __init__(self, connection: Connection, clock: Clock) -> None:
        self._db = connection
        self._clock = clock
        self._held: set[tuple[LockScope, str]] = set()

    @property
    def backend(self) -> Backend:
        return self._db.backend

    def now(self) -> float:
        """The service clock's time: every timestamp a row holds."""
        return self._clock.now()

    def lock(self, scope: LockScope, key: str) -> None:
        """Hold the lock on ``key`` until the transaction ends. PostgreSQL: a transaction-level
        advisory lock (other replicas wait for it); SQLite: nothing, its ``BEGIN IMMEDIATE``
        already serialises every transaction."""
        if self._db.backend == "sqlite" or (scope, key) in self._held:
            return
        self._db.execute(
            "SELECT pg_advisory_xact_lock(CAST(? AS INTEGER), hashtext(?))",
            (LOCK_SCOPES[scope], key),
        ).fetchone()
        self._held.add((scope, key))
