"""The rounds' rows: uploads (hashes, sizes and the bodies of node sets), results (unions with
their bodies; sums' rows only) and the absences of stragglers.

A share and a sum are keyed by their part (``secure.protocol.part_span``): part k of (pass,
layer) holds a slice of the layer's rows. Node sets and unions are always part 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from service.store.queries import Queries

UPLOADS_TABLE = """
CREATE TABLE IF NOT EXISTS uploads (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    pass_index INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('nodes', 'embedding')),
    client_index INTEGER NOT NULL,
    sha256 BLOB NOT NULL,
    size INTEGER NOT NULL,
    body BLOB,
    created_at REAL NOT NULL,
    part INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, pass_index, layer, kind, client_index, part)
)
"""
RESULTS_TABLE = """
CREATE TABLE IF NOT EXISTS results (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    pass_index INTEGER NOT NULL,
    layer INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('union', 'aggregate')),
    rows INTEGER NOT NULL,
    cols INTEGER NOT NULL,
    count INTEGER NOT NULL,
    body BLOB,
    created_at REAL NOT NULL,
    released_at REAL,
    part INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, pass_index, layer, kind, part)
)
"""
ABSENCES_TABLE = """
CREATE TABLE IF NOT EXISTS absences (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    client_index INTEGER NOT NULL,
    from_pass INTEGER NOT NULL,
    back_at INTEGER,
    PRIMARY KEY (session_id, client_index)
)
"""
ROUND_SCHEMA = "".join(f"{table};" for table in (UPLOADS_TABLE, RESULTS_TABLE, ABSENCES_TABLE))
# the tables keyed by part since store migration 4, with their primary keys
PARTED_TABLES = {
    "uploads": (UPLOADS_TABLE, "session_id, pass_index, layer, kind, client_index, part"),
    "results": (RESULTS_TABLE, "session_id, pass_index, layer, kind, part"),
}

UploadKind = Literal["nodes", "share"]  # a client's node set, or its share of a layer's part
ResultKind = Literal["union", "sum"]  # the node union, or the sum of the shares of a part

# The code says share (one client's upload of a layer's embeddings, encrypted or masked) and sum
# (the service's aggregate of the shares). The ``kind`` column of the uploads and results tables,
# the REST paths (``PUT .../embedding``, ``GET .../aggregate``), the telemetry's ``kind`` label and
# the problem details keep the names that stored sessions, clients and dashboards know: this is
# the one place that maps them.
KIND_NAME: dict[str, str] = {
    "nodes": "nodes",
    "share": "embedding",
    "union": "union",
    "sum": "aggregate",
}
_KIND_OF_NAME = {name: kind for kind, name in KIND_NAME.items()}


class Slot(NamedTuple):
    """One slot of a session's rounds: part ``part`` of layer ``layer`` of pass ``pass_index``
    (node sets and unions are part 0). It keys uploads, results and their bodies (in the order
    of the tables' keys)."""

    session_id: str
    pass_index: int
    layer: int
    part: int = 0


@dataclass(frozen=True, slots=True)
class UploadRow:
    client_index: int
    sha256: bytes
    size: int


@dataclass(frozen=True, slots=True)
class ResultRow:
    rows: int
    cols: int
    count: int
    body: bytes | None  # None once discarded, and for sums (kept outside SQLite)
    released_at: float | None


class RoundQueries(Queries):
    def lock_slot(self, session_id: str, pass_index: int, layer: int, part: int = 0) -> None:
        """Hold the lock of one (pass, layer, part) of a session until the transaction ends
        (whoever stores its sum). The session's lock is taken first, so that locks are always
        taken in the same order (PostgreSQL; on SQLite both are no-ops)."""
        self.lock("session", session_id)
        self.lock("slot", f"{session_id}/{pass_index}/{layer}/{part}")

    def upload(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        client_index: int,
        part: int = 0,
    ) -> UploadRow | None:
        row = self._db.execute(
            "SELECT client_index, sha256, size FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ? AND client_index = ? AND part = ?",
            (session_id, pass_index, layer, KIND_NAME[kind], client_index, part),
        ).fetchone()
        return UploadRow(int(row[0]), bytes(row[1]), int(row[2])) if row else None

    def uploaders(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind, part: int = 0
    ) -> list[int]:
        return [u.client_index for u in self.uploads(session_id, pass_index, layer, kind, part)]

    def uploads(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind, part: int = 0
    ) -> list[UploadRow]:
        """The slot's uploads in client index order."""
        rows = self._db.execute(
            "SELECT client_index, sha256, size FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ? AND part = ? ORDER BY client_index",
            (session_id, pass_index, layer, KIND_NAME[kind], part),
        ).fetchall()
        return [UploadRow(int(r[0]), bytes(r[1]), int(r[2])) for r in rows]

    def first_upload_at(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind, part: int = 0
    ) -> float | None:
        (at,) = self._db.execute(
            "SELECT MIN(created_at) FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ? AND part = ?",
            (session_id, pass_index, layer, KIND_NAME[kind], part),
        ).fetchone()
        return at

    def result_slots(self, session_id: str, pass_index: int) -> list[tuple[int, ResultKind, int]]:
        """The (layer, kind, part) of every result of the pass stored so far."""
        rows = self._db.execute(
            "SELECT layer, kind, part FROM results WHERE session_id = ? AND pass_index = ?",
            (session_id, pass_index),
        ).fetchall()
        return [(int(layer), _KIND_OF_NAME[name], int(part)) for layer, name, part in rows]

    def result_parts(self, session_id: str, pass_index: int, layer: int, kind: ResultKind) -> int:
        """How many parts of the (pass, layer) result are stored."""
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM results WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND kind = ?",
            (session_id, pass_index, layer, KIND_NAME[kind]),
        ).fetchone()
        return int(count)

    def upload_bodies(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind
    ) -> list[bytes]:
        """Bodies of part 0 (node sets) in client index order; raises if one was discarded."""
        rows = self._db.execute(
            "SELECT body FROM uploads WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND kind = ? AND part = 0 ORDER BY client_index",
            (session_id, pass_index, layer, KIND_NAME[kind]),
        ).fetchall()
        if any(r[0] is None for r in rows):
            raise LookupError(f"uploads of pass {pass_index} layer {layer} were discarded")
        return [bytes(r[0]) for r in rows]

    def insert_upload(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        client_index: int,
        *,
        sha256: bytes,
        size: int,
        body: bytes | None,
        part: int = 0,
    ) -> None:
        """``body`` None: the body is kept outside SQLite (shares)."""
        self._db.execute(
            "INSERT INTO uploads (session_id, pass_index, layer, kind, client_index, part, sha256,"
            " size, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                pass_index,
                layer,
                KIND_NAME[kind],
                client_index,
                part,
                sha256,
                size,
                body,
                self.now(),
            ),
        )

    def result(
        self, session_id: str, pass_index: int, layer: int, kind: ResultKind, part: int = 0
    ) -> ResultRow | None:
        row = self._db.execute(
            "SELECT rows, cols, count, body, released_at FROM results WHERE session_id = ?"
            " AND pass_index = ? AND layer = ? AND kind = ? AND part = ?",
            (session_id, pass_index, layer, KIND_NAME[kind], part),
        ).fetchone()
        if not row:
            return None
        body = bytes(row[3]) if row[3] is not None else None
        return ResultRow(int(row[0]), int(row[1]), int(row[2]), body, row[4])

    def insert_result(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        kind: ResultKind,
        *,
        rows: int,
        cols: int,
        count: int,
        body: bytes | None,
        released_at: float | None = None,
        part: int = 0,
    ) -> None:
        """``body`` None: the body is kept outside SQLite (sums). ``rows``: the part's."""
        self._db.execute(
            "INSERT INTO results (session_id, pass_index, layer, kind, part, rows, cols, count,"
            " body, created_at, released_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                pass_index,
                layer,
                KIND_NAME[kind],
                part,
                rows,
                cols,
                count,
                body,
                self.now(),
                released_at,
            ),
        )

    def discard_payloads(self, session_id: str, before_pass: int | None = None) -> None:
        """Drop bodies of passes < ``before_pass`` (all passes if None); hashes and sizes stay."""
        limit = before_pass if before_pass is not None else 2**62
        for table in ("uploads", "results"):
            self._db.execute(
                f"UPDATE {table} SET body = NULL WHERE session_id = ? AND pass_index < ?"
                " AND body IS NOT NULL",
                (session_id, limit),
            )

    # Absent clients (stragglers "continue")

    def absent_clients(self, session_id: str, pass_index: int) -> set[int]:
        """Clients left out of an earlier pass and not back by ``pass_index``."""
        rows = self._db.execute(
            "SELECT client_index FROM absences WHERE session_id = ? AND from_pass <= ?"
            " AND (back_at IS NULL OR back_at > ?)",
            (session_id, pass_index, pass_index),
        ).fetchall()
        return {int(r[0]) for r in rows}

    def mark_absent(self, session_id: str, client_index: int, *, from_pass: int) -> None:
        self._db.execute(
            "INSERT INTO absences (session_id, client_index, from_pass, back_at) VALUES (?, ?, ?,"
            " NULL) ON CONFLICT (session_id, client_index) DO UPDATE SET from_pass ="
            " excluded.from_pass, back_at = NULL",
            (session_id, client_index, from_pass),
        )

    def mark_back(self, session_id: str, client_index: int, *, at_pass: int) -> None:
        self._db.execute(
            "UPDATE absences SET back_at = ? WHERE session_id = ? AND client_index = ?",
            (at_pass, session_id, client_index),
        )
