"""Share and sum bodies as rows, on PostgreSQL (``service/rounds/payload_store.py`` says why);
SQLite keeps them as files beside the database and never creates this table."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from service.store.queries import Queries
from service.store.rounds import Slot

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


#: A body crosses the connection in pieces of at most this many bytes. libpq keeps each
#: connection's input and output buffers at the size of the largest message they carried, for
#: the connection's life, and the pool keeps its connections: one 16 MiB body sent as a
#: parameter or read as a value would pin 16 MiB per buffer per pooled connection (measured:
#: bench/replica_memory.py). In pieces, a buffer stays near this size.
BODY_PIECE_BYTES = 1 << 20

# COPY's binary format: its signature, flags and header extension length; field sizes
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_INT8, _INT16, _INT32 = struct.Struct(">q"), struct.Struct(">h"), struct.Struct(">i")

_COLUMNS = "session_id, pass_index, layer, part, client_index, sha256"
_KEY = (
    "session_id = ? AND pass_index = ? AND layer = ? AND part = ? AND client_index = ?"
    " AND sha256 = ?"
)


class PayloadQueries(Queries):
    def put_payload(self, slot: Slot, client_index: int, sha256: bytes, body: bytes) -> None:
        """Insert or replace a body. A share is named by its content (an identical re-upload
        replaces it by itself); a sum by its slot. Streamed in with COPY, a piece at a time;
        COPY has no ON CONFLICT, so the row is deleted first, under the body's own lock (two
        replicas storing one body, a retried upload, replace it one after the other)."""
        key = (*slot, client_index, sha256)
        self.lock("payload", repr(key))
        self._db.execute(f"DELETE FROM payloads WHERE {_KEY}", key)
        self._db.copy_in(
            f"COPY payloads ({_COLUMNS}, body) FROM STDIN (FORMAT BINARY)", _copy_row(key, body)
        )

    def payload(self, slot: Slot, client_index: int, sha256: bytes) -> bytes | None:
        """The body, read a piece at a time (``substring`` of an uncompressed, out-of-line
        value reads only the piece's TOAST chunks); None if there is none (or it is deleted
        while it is read)."""
        key = (*slot, client_index, sha256)
        row = self._db.execute(f"SELECT length(body) FROM payloads WHERE {_KEY}", key).fetchone()
        if row is None:
            return None
        body = bytearray(int(row[0]))
        for start in range(0, len(body), BODY_PIECE_BYTES):
            piece = self._db.execute(
                "SELECT substring(body FROM CAST(? AS INTEGER) FOR CAST(? AS INTEGER))"
                f" FROM payloads WHERE {_KEY}",
                (start + 1, BODY_PIECE_BYTES, *key),
            ).fetchone()
            if piece is None:
                return None
            body[start : start + BODY_PIECE_BYTES] = piece[0]
        return bytes(body)

    def delete_payloads(self, session_id: str, before_pass: int | None = None) -> None:
        """Delete the bodies of passes < ``before_pass`` (all passes if None)."""
        self._db.execute(
            "DELETE FROM payloads WHERE session_id = ? AND pass_index < ?",
            (session_id, before_pass if before_pass is not None else 2**62),
        )


def _copy_row(key: tuple[Any, ...], body: bytes) -> Iterator[bytes | memoryview]:
    """One row of COPY's binary format (its header, the row, its trailer): the key's columns,
    then the body a piece at a time. Every integer column of the store is a BIGINT
    (:mod:`.dialect`); a column of another type would make COPY fail, not store a wrong value."""
    session_id, pass_index, layer, part, client_index, sha256 = key
    fields = [str(session_id).encode()]
    fields += [_INT8.pack(int(n)) for n in (pass_index, layer, part, client_index)]
    fields.append(bytes(sha256))
    row = bytearray(_COPY_SIGNATURE)
    row += _INT16.pack(len(fields) + 1)
    for value in fields:
        row += _INT32.pack(len(value)) + value
    row += _INT32.pack(len(body))
    yield bytes(row)
    view = memoryview(body)
    for start in range(0, len(body), BODY_PIECE_BYTES):
        yield view[start : start + BODY_PIECE_BYTES]
    yield _INT16.pack(-1)
