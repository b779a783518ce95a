"""The alignments' tables, in the service's database (SQLite or PostgreSQL: the store's
connection, inside its transactions: ``Store.transaction()``), with their own numbered
migrations (component ``alignments``, see ``service/store/migrations.py``). On PostgreSQL a
transaction holds the alignment's lock from its first read of the alignment's row, so that its
checks-then-write stay atomic across replicas (as the sessions', ``service/store/engines.py``).

An alignment keeps: its parties' token hashes; every blinded set a party posted, by owner and
hop, in the parts it travelled in (each part's body and the poster's signature, if any, until
the alignment is complete, then only their sizes and SHA-256s; a set counts as posted once all
its parts are in); and, once complete, for each owner the aligned index of every position of
the set it posted; a kept alignment keeps each owner's fully blinded set
(``KEPT_SCHEMA``, :mod:`service.alignment.kept_tables`). No node id, and no value anyone could
test an id against without every party's key, is ever stored (docs/threat-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from service.store import Store, Transaction
from service.store.dialect import Connection
from service.store.migrations import Migration, added_columns, schema
from service.store.queries import can_be_an_id

#: The column that ties a row to its alignment, first in the tables of an alignment's rows.
ALIGNMENT_ID_COLUMN = "alignment_id TEXT NOT NULL REFERENCES alignments(id)"

# as first released; migration 2 adds the columns of ADDED_COLUMNS
ALIGNMENT_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS alignments (
    id TEXT PRIMARY KEY,
    parties INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    label TEXT,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    aligned_nodes INTEGER,
    digest BLOB,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS alignment_tokens (
    {ALIGNMENT_ID_COLUMN},
    party INTEGER NOT NULL,
    token_sha256 BLOB NOT NULL UNIQUE,
    PRIMARY KEY (alignment_id, party)
);
CREATE TABLE IF NOT EXISTS alignment_sets (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    hop INTEGER NOT NULL,
    size INTEGER NOT NULL,
    sha256 BLOB NOT NULL,
    body BLOB,
    created_at REAL NOT NULL,
    PRIMARY KEY (alignment_id, owner, hop)
);
CREATE TABLE IF NOT EXISTS alignment_positions (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (alignment_id, owner)
);
"""


# columns added after the first release: (table, column, declaration)
ADDED_COLUMNS = (
    (
        "alignments",
        "nodes",
        "TEXT NOT NULL DEFAULT 'intersection' CHECK (nodes IN ('intersection', 'union'))",
    ),
    ("alignments", "shared_nodes", "INTEGER"),
    ("alignment_sets", "signature", "BLOB"),
)

# sets travel in parts: each part's body (alignment_sets keeps a set's size and signature once
# all its parts are in); an alignment's part_elements is NULL when created before (one part)
SET_PARTS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS alignment_set_parts (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    hop INTEGER NOT NULL,
    part INTEGER NOT NULL,
    size INTEGER NOT NULL,
    sha256 BLOB NOT NULL,
    body BLOB,
    signature BLOB,
    created_at REAL NOT NULL,
    PRIMARY KEY (alignment_id, owner, hop, part)
);
"""


def _sets_in_parts(connection: Connection) -> None:
    connection.run_schema(SET_PARTS_SCHEMA)
    connection.add_column("alignments", "part_elements", "INTEGER")
    # a set posted whole before is its own part 0
    connection.execute(
        "INSERT INTO alignment_set_parts"
        " (alignment_id, owner, hop, part, size, sha256, body, signature, created_at)"
        " SELECT alignment_id, owner, hop, 0, size, sha256, body, signature, created_at"
        " FROM alignment_sets"
    )
    connection.execute("UPDATE alignment_sets SET body = NULL")


# an alignment the service keeps (``keep``) or that updates a kept one (``base``): each owner's
# kept set and positions (service/alignment/incremental.py), an update's removed positions and,
# once done, each owner's changes (JSON, secure.wire.alignment.AlignmentChanges)
KEPT_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS alignment_kept (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    elements BLOB NOT NULL,
    positions BLOB NOT NULL,
    PRIMARY KEY (alignment_id, owner)
);
CREATE TABLE IF NOT EXISTS alignment_removed (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (alignment_id, owner)
);
CREATE TABLE IF NOT EXISTS alignment_changes (
    {ALIGNMENT_ID_COLUMN},
    owner INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (alignment_id, owner)
);
"""
KEPT_COLUMNS = (
    ("alignments", "keep", "INTEGER NOT NULL DEFAULT 0"),
    ("alignments", "base", "TEXT"),
    ("alignments", "base_kept_digest", "TEXT"),
    ("alignments", "kept_digest", "TEXT"),
)


def _kept_alignments(connection: Connection) -> None:
    connection.run_schema(KEPT_SCHEMA)
    added_columns(KEPT_COLUMNS)(connection)


ALIGNMENT_MIGRATIONS = (
    Migration(1, "alignments, their tokens, sets and positions", schema(ALIGNMENT_SCHEMA)),
    Migration(2, "columns added after the first release", added_columns(ADDED_COLUMNS)),
    Migration(3, "sets travel in parts", _sets_in_parts),
    Migration(4, "kept alignments and their updates", _kept_alignments),
)
WHOLE_SETS = 2**62  # the part_elements of an alignment created before sets travelled in parts


@dataclass(frozen=True, slots=True)
class AlignmentRow:
    id: str
    parties: int
    seed: int
    label: str | None
    state: str
    aligned_nodes: int | None
    digest: bytes | None
    created_at: float
    nodes: str  # "intersection" or "union": which ids the aligned index covers
    shared_nodes: int | None  # ids every party holds (the intersection's size), once done
    part_elements: int  # elements per part of its sets and positions
    keep: bool = False  # the service keeps its fully blinded sets (an update may follow)
    base: str | None = None  # the kept alignment this one updates
    base_kept_digest: str | None = None  # what the service keeps of the base, when created
    kept_digest: str | None = None  # what it keeps of this one, once done


@dataclass(frozen=True, slots=True)
class SetRow:
    """A set all of whose parts are in."""

    owner: int
    hop: int
    size: int
    signature: bytes | None  # the poster's, relayed unchecked; None unsigned or once complete


@dataclass(frozen=True, slots=True)
class PartRow:
    part: int
    size: int  # elements in the whole set, as its poster declared
    sha256: bytes  # of this part's body
    signature: bytes | None  # the poster's over the whole set


def create_alignment_tables(store: Store) -> None:
    """Create or migrate the tables (idempotent)."""
    store.migrate("alignments", ALIGNMENT_MIGRATIONS)


class AlignmentTables:
    """The alignments' queries within one store transaction."""

    def __init__(self, tx: Transaction) -> None:
        self._db = tx.connection
        self._now = tx.now
        self._lock = tx.lock

    def insert(
        self,
        alignment_id: str,
        *,
        parties: int,
        seed: int,
        label: str | None,
        nodes: str,
        part_elements: int,
        token_hashes: list[bytes],
        keep: bool = False,
        base: str | None = None,
        base_kept_digest: str | None = None,
    ) -> None:
        now = self._now()
        self._db.execute(
            "INSERT INTO alignments"
            " (id, parties, seed, label, state, created_at, updated_at, nodes, part_elements,"
            " keep, base, base_kept_digest)"
            " VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
            (alignment_id, parties, seed, label, now, now, nodes, part_elements, int(keep), base,
             base_kept_digest),
        )  # fmt: skip
        self._db.executemany(
            "INSERT INTO alignment_tokens (alignment_id, party, token_sha256) VALUES (?, ?, ?)",
            [(alignment_id, m, h) for m, h in enumerate(token_hashes)],
        )

    def alignment(self, alignment_id: str) -> AlignmentRow | None:
        """The alignment's row; no other transaction of the alignment runs from here to the end
        of this one."""
        if not can_be_an_id(alignment_id):
            return None
        self._lock("alignment", alignment_id)
        row = self._db.execute(
            "SELECT id, parties, seed, label, state, aligned_nodes, digest, created_at, nodes,"
            " shared_nodes, part_elements, keep, base, base_kept_digest, kept_digest"
            " FROM alignments WHERE id = ?",
            (alignment_id,),
        ).fetchone()
        if not row:
            return None
        digest = bytes(row[6]) if row[6] is not None else None
        part_elements = WHOLE_SETS if row[10] is None else int(row[10])
        return AlignmentRow(*row[:6], digest, *row[7:10], part_elements, bool(row[11]), *row[12:])

    def token_owner(self, token_sha256: bytes) -> tuple[str, int] | None:
        row = self._db.execute(
            "SELECT alignment_id, party FROM alignment_tokens WHERE token_sha256 = ?",
            (token_sha256,),
        ).fetchone()
        return (str(row[0]), int(row[1])) if row else None

    def sets(self, alignment_id: str) -> list[SetRow]:
        rows = self._db.execute(
            "SELECT owner, hop, size, signature FROM alignment_sets"
            " WHERE alignment_id = ?"
            " ORDER BY owner, hop",
            (alignment_id,),
        ).fetchall()
        return [_set_row(row) for row in rows]

    def set(self, alignment_id: str, owner: int, hop: int) -> SetRow | None:
        row = self._db.execute(
            "SELECT owner, hop, size, signature FROM alignment_sets"
            " WHERE alignment_id = ? AND owner = ? AND hop = ?",
            (alignment_id, owner, hop),
        ).fetchone()
        return _set_row(row) if row else None

    def parts(self, alignment_id: str, owner: int, hop: int) -> list[PartRow]:
        """The parts of the set in hop ``hop`` of ``owner`` posted so far, by part."""
        rows = self._db.execute(
            "SELECT part, size, sha256, signature FROM alignment_set_parts"
            " WHERE alignment_id = ? AND owner = ? AND hop = ? ORDER BY part",
            (alignment_id, owner, hop),
        ).fetchall()
        return [
            PartRow(int(p), int(size), bytes(sha), bytes(sig) if sig else None)
            for p, size, sha, sig in rows
        ]

    def part_body(self, alignment_id: str, owner: int, hop: int, part: int) -> bytes | None:
        """A part's body; None once the alignment is complete (or never posted)."""
        row = self._db.execute(
            "SELECT body FROM alignment_set_parts"
            " WHERE alignment_id = ? AND owner = ? AND hop = ? AND part = ?",
            (alignment_id, owner, hop, part),
        ).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    def set_body(self, alignment_id: str, owner: int, hop: int) -> bytes:
        """The whole set, its parts joined in order (the alignment must not be complete)."""
        rows = self._db.execute(
            "SELECT body FROM alignment_set_parts"
            " WHERE alignment_id = ? AND owner = ? AND hop = ? ORDER BY part",
            (alignment_id, owner, hop),
        ).fetchall()
        return b"".join(bytes(row[0]) for row in rows)

    def insert_part(
        self,
        alignment_id: str,
        owner: int,
        hop: int,
        part: int,
        *,
        size: int,
        sha256: bytes,
        body: bytes,
        signature: bytes | None,
    ) -> None:
        self._db.execute(
            "INSERT INTO alignment_set_parts"
            " (alignment_id, owner, hop, part, size, sha256, body, signature, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (alignment_id, owner, hop, part, size, sha256, body, signature, self._now()),
        )

    def insert_set(
        self,
        alignment_id: str,
        owner: int,
        hop: int,
        *,
        sha256: bytes,
        size: int,
        signature: bytes | None,
    ) -> None:
        """Record a set all of whose parts are in (``sha256``: over its parts' SHA-256s)."""
        self._db.execute(
            "INSERT INTO alignment_sets"
            " (alignment_id, owner, hop, size, sha256, body, signature, created_at)"
            " VALUES (?, ?, ?, ?, ?, NULL, ?, ?)",
            (alignment_id, owner, hop, size, sha256, signature, self._now()),
        )

    def complete(
        self,
        alignment_id: str,
        *,
        aligned_nodes: int,
        shared_nodes: int,
        digest: bytes,
        positions: list[bytes] | None,
        kept_digest: str | None = None,
    ) -> None:
        """Store each owner's positions (None: an update's, which answers changes instead),
        mark the alignment done and drop every set body (and signature)."""
        self._db.executemany(
            "INSERT INTO alignment_positions (alignment_id, owner, body) VALUES (?, ?, ?)",
            [(alignment_id, owner, body) for owner, body in enumerate(positions or [])],
        )
        self._db.execute(
            "UPDATE alignments SET state = 'done', aligned_nodes = ?, shared_nodes = ?,"
            " digest = ?, kept_digest = ?, updated_at = ? WHERE id = ?",
            (aligned_nodes, shared_nodes, digest, kept_digest, self._now(), alignment_id),
        )
        for table in ("alignment_sets", "alignment_set_parts"):
            self._db.execute(
                f"UPDATE {table} SET body = NULL, signature = NULL WHERE alignment_id = ?",
                (alignment_id,),
            )

    def positions(self, alignment_id: str, owner: int, span: range) -> bytes | None:
        """The positions ``span`` of ``owner``'s set (little-endian int64 each)."""
        row = self._db.execute(
            "SELECT substr(body, ?, ?) FROM alignment_positions"
            " WHERE alignment_id = ? AND owner = ?",
            (span.start * POSITION_BYTES + 1, len(span) * POSITION_BYTES, alignment_id, owner),
        ).fetchone()
        return bytes(row[0]) if row else None


POSITION_BYTES = 8  # little-endian int64


def _set_row(row: tuple) -> SetRow:
    owner, hop, size, signature = row
    return SetRow(int(owner), int(hop), int(size), bytes(signature) if signature else None)
