"""Share and sum bodies as rows, on PostgreSQL (``service/rounds/payload_store.py`` says why);
SQLite keeps them as files beside the database and never creates this table."""

from __future__ import annotations

from typing import NamedTuple

from service.store.queries import Queries

# bodies are random floats or ciphertexts: EXTERNAL keeps them out of line and uncompressed
_PAYLOAD_TABLE = """
CREATE TABLE IF NOT EXISTS payloads (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    pass_index INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    client_index INTEGER NOT NULL,
    sha256 BLOB NOT NULL,
    body BLOB NOT NULL,
    part INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, pass_index, layer, part, client_index, sha256)
)
"""
# the table and its primary key (store migration 4 adds ``part`` to a table without it)
PAYLOAD_TABLE = (_PAYLOAD_TABLE, "session_id, pass_index, layer, part, client_index, sha256")
PAYLOAD_SCHEMA = _PAYLOAD_TABLE + ";ALTER TABLE payloads ALTER COLUMN body SET STORAGE EXTERNAL"

SUM_CLIENT = -1  # the client_index of a layer part's sum (its sha256 is empty)


class BodySlot(NamedTuple):
    """Where a body belongs: one part of one layer of one pass of a session (in the order of
    the table's key)."""

    session_id: str
    pass_index: int
    layer: int
    part: int = 0


class PayloadQueries(Queries):
    def put_payload(self, slot: BodySlot, client_index: int, sha256: bytes, body: bytes) -> None:
        """Insert or replace a body. A share is named by its content (an identical re-upload
        replaces it by itself); a sum by its slot."""
        self._db.execute(
            "INSERT INTO payloads (session_id, pass_index, layer, part, client_index, sha256,"
            " body) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT"
            " (session_id, pass_index, layer, part, client_index, sha256)"
            " DO UPDATE SET body = excluded.body",
            (*slot, client_index, sha256, body),
        )

    def payload(self, slot: BodySlot, client_index: int, sha256: bytes) -> bytes | None:
        row = self._db.execute(
            "SELECT body FROM payloads WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND part = ? AND client_index = ? AND sha256 = ?",
            (*slot, client_index, sha256),
        ).fetchone()
        return bytes(row[0]) if row else None

    def delete_payloads(self, session_id: str, before_pass: int | None = None) -> None:
        """Delete the bodies of passes < ``before_pass`` (all passes if None)."""
        self._db.execute(
            "DELETE FROM payloads WHERE session_id = ? AND pass_index < ?",
            (session_id, before_pass if before_pass is not None else 2**62),
        )
