"""Sessions and their client tokens: the rows a session's state machine reads and moves."""

from __future__ import annotations

from dataclasses import dataclass

from service.session_state import SessionState, transition
from service.store.queries import SESSION_ID_COLUMN, Queries, can_be_an_id

SESSION_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    current_pass INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS client_tokens (
    {SESSION_ID_COLUMN},
    client_index INTEGER NOT NULL,
    token_sha256 BLOB NOT NULL UNIQUE,
    PRIMARY KEY (session_id, client_index)
);
"""


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    state: SessionState
    current_pass: int
    created_at: float


class SessionQueries(Queries):
    def insert_session(self, session_id: str, config_json: str, token_hashes: list[bytes]) -> None:
        """A new session, running."""
        # The listing's order (``sessions_page``) must be the order in which sessions become
        # visible, or a follower paging with ``after`` skips for good a session that takes a
        # smaller rowid but commits after a larger one. PostgreSQL draws the identity at the
        # INSERT, so every creating transaction takes one lock before drawing it and holds it to
        # its end: PostgreSQL makes a commit visible before it releases the committing
        # transaction's locks, so the next rowid is drawn only after every smaller one is
        # visible (or rolled back, leaving a harmless gap). The cost: session creations commit
        # one at a time, each a two-statement transaction. SQLite's BEGIN IMMEDIATE already
        # runs every transaction alone.
        self.lock("listing-order", "sessions")
        now = self.now()
        self._db.execute(
            "INSERT INTO sessions (id, config, state, current_pass, created_at, updated_at)"
            " VALUES (?, ?, ?, 0, ?, ?)",
            (session_id, config_json, SessionState.RUNNING, now, now),
        )
        self._db.executemany(
            "INSERT INTO client_tokens (session_id, client_index, token_sha256) VALUES (?, ?, ?)",
            [(session_id, m, h) for m, h in enumerate(token_hashes)],
        )

    def session(self, session_id: str) -> SessionRow | None:
        """The session's row; from here to the end of the transaction, no other transaction of
        the session runs (see :meth:`Queries.lock`)."""
        if not can_be_an_id(session_id):
            return None
        self.lock("session", session_id)
        row = self._db.execute(
            "SELECT id, state, current_pass, created_at FROM sessions WHERE id = ?",
            (session_id,),
        ).fetchone()
        return _session_row(row) if row else None

    def session_config(self, session_id: str) -> str:
        """The stored plan JSON (large: it holds the node lists; plans are cached)."""
        (config,) = self._db.execute(
            "SELECT config FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return str(config)

    def sessions_page(self, *, after: str | None, limit: int) -> list[tuple[SessionRow, str]]:
        """Up to ``limit`` sessions in the order they were created, from the one after session
        ``after`` (from the first if None), each with its stored plan JSON."""
        # rowid: SQLite's own; on PostgreSQL an identity column of that name (migration 1)
        columns = "SELECT id, state, current_pass, created_at, config FROM sessions"
        if after is None:
            rows = self._db.execute(f"{columns} ORDER BY rowid LIMIT ?", (limit,)).fetchall()
        else:
            rows = self._db.execute(
                f"{columns} WHERE rowid > (SELECT rowid FROM sessions WHERE id = ?)"
                " ORDER BY rowid LIMIT ?",
                (after, limit),
            ).fetchall()
        return [(_session_row(row[:4]), str(row[4])) for row in rows]

    def count_sessions(self, state: SessionState) -> int:
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM sessions WHERE state = ?", (state,)
        ).fetchone()
        return int(count)

    def set_session_state(self, session_id: str, state: SessionState) -> None:
        """Move the session to ``state`` (``IllegalTransition`` if it may not go there)."""
        self.lock("session", session_id)
        (current,) = self._db.execute(
            "SELECT state FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        self._db.execute(
            "UPDATE sessions SET state = ?, updated_at = ? WHERE id = ?",
            (transition(SessionState(current), state), self.now(), session_id),
        )

    def set_current_pass(self, session_id: str, pass_index: int) -> None:
        self.lock("session", session_id)
        self._db.execute(
            "UPDATE sessions SET current_pass = ?, updated_at = ? WHERE id = ?",
            (pass_index, self.now(), session_id),
        )

    def token_owner(self, token_sha256: bytes) -> tuple[str, int] | None:
        row = self._db.execute(
            "SELECT session_id, client_index FROM client_tokens WHERE token_sha256 = ?",
            (token_sha256,),
        ).fetchone()
        return (str(row[0]), int(row[1])) if row else None


def _session_row(row: tuple) -> SessionRow:
    session_id, state, current_pass, created_at = row
    return SessionRow(session_id, SessionState(state), current_pass, created_at)
