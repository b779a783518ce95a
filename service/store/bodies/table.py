"""Share and sum bodies as rows of table ``payloads``, on PostgreSQL: :class:`TableBodies`, and
the queries of the store's transactions that it runs (:class:`BodyQueries`). SQLite keeps the
bodies as files beside the database (:mod:`.files`) and never creates this table."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

from service.store.bodies.interface import Bodies, BodyKey
from service.store.queries import Queries
from service.store.rounds import SLOT_COLUMNS

if TYPE_CHECKING:
    from service.store import Store, Transaction

# bodies are random floats or ciphertexts: EXTERNAL keeps them out of line and uncompressed
_BODY_TABLE = f"""
CREATE TABLE IF NOT EXISTS payloads (
    {SLOT_COLUMNS},
    client_index INTEGER NOT NULL,
    sha256 BLOB NOT NULL,
    body BLOB NOT NULL,
    part INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, pass_index, layer, part, client_index, sha256)
)
"""
# the table and its primary key (store migration 4 adds ``part`` to a table without it)
BODY_TABLE = (_BODY_TABLE, "session_id, pass_index, layer, part, client_index, sha256")
BODY_SCHEMA = _BODY_TABLE + ";ALTER TABLE payloads ALTER COLUMN body SET STORAGE EXTERNAL"

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


class BodyQueries(Queries):
    def put_body(self, key: BodyKey, body: bytes) -> None:
        """Insert or replace a body. Streamed in with COPY, a piece at a time; COPY has no ON
        CONFLICT, so the row is deleted first, under the body's own lock (two replicas storing
        one body, a retried upload, replace it one after the other)."""
        columns = _key_columns(key)
        self.lock("body", repr(columns))
        self._db.execute(f"DELETE FROM payloads WHERE {_KEY}", columns)
        self._db.copy_in(
            f"COPY payloads ({_COLUMNS}, body) FROM STDIN (FORMAT BINARY)",
            _copy_row(columns, body),
        )

    def read_body(self, key: BodyKey) -> bytes | None:
        """The body, read a piece at a time (``substring`` of an uncompressed, out-of-line
        value reads only the piece's TOAST chunks); None if there is none (or it is deleted
        while it is read)."""
        columns = _key_columns(key)
        row = self._db.execute(
            f"SELECT length(body) FROM payloads WHERE {_KEY}", columns
        ).fetchone()
        if row is None:
            return None
        body = bytearray(int(row[0]))
        for start in range(0, len(body), BODY_PIECE_BYTES):
            piece = self._db.execute(
                "SELECT substring(body FROM CAST(? AS INTEGER) FOR CAST(? AS INTEGER))"
                f" FROM payloads WHERE {_KEY}",
                (start + 1, BODY_PIECE_BYTES, *columns),
            ).fetchone()
            if piece is None:
                return None
            body[start : start + BODY_PIECE_BYTES] = piece[0]
        return bytes(body)

    def delete_bodies(self, session_id: str, before_pass: int | None = None) -> None:
        """Delete the bodies of passes < ``before_pass`` (all passes if None)."""
        self._db.execute(
            "DELETE FROM payloads WHERE session_id = ? AND pass_index < ?",
            (session_id, before_pass if before_pass is not None else 2**62),
        )


class TableBodies(Bodies):
    """Bodies as rows of the store's PostgreSQL database. A body is written in its own
    committed transaction before the row that acknowledges it (as a file is), or, when the
    caller passes its transaction (``tx=``), in that transaction: either way a committed row
    always has its body."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        with self.store.transaction() as tx:
            tx.delete_bodies(session_id, before_pass)

    def _write(self, key: BodyKey, body: bytes, *, durable: bool, tx: Transaction | None) -> None:
        if tx is not None:
            tx.put_body(key, body)
            return
        with self.store.transaction(durable=durable) as own:
            own.put_body(key, body)

    def _read(self, key: BodyKey, *, tx: Transaction | None) -> bytes | None:
        if tx is not None:
            return tx.read_body(key)
        with self.store.transaction() as own:
            return own.read_body(key)


def _key_columns(key: BodyKey) -> tuple[str, int, int, int, int, bytes]:
    """The key's values in the order of the table's key."""
    return (*key.slot, key.client, key.sha256)


def _copy_row(
    columns: tuple[str, int, int, int, int, bytes], body: bytes
) -> Iterator[bytes | memoryview]:
    """One row of COPY's binary format (its header, the row, its trailer): the key's columns,
    then the body a piece at a time. Every integer column of the store is a BIGINT
    (:mod:`service.store.dialect`); a column of another type would make COPY fail, not store a
    wrong value."""
    session_id, pass_index, layer, part, client_index, sha256 = columns
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
