"""SQLite persistence: sessions, client token hashes, round progress, metrics, traffic, ledger.

One connection in WAL mode, guarded by a lock: every read and write happens inside
:meth:`Store.transaction`, so a check and the write that depends on it are atomic. Callers on the
event loop must reach the store through a worker thread (``run_in_threadpool``).

Durability: the connection runs ``synchronous=NORMAL``, under which a commit survives a crash of
the process but the last commits may be lost in a power loss or an OS crash (the WAL is synced
only at checkpoints). A transaction that appends to the privacy ledger must be opened with
``transaction(durable=True)``, which commits under ``synchronous=FULL``: the WAL is synced
before ``COMMIT`` returns, hence before the release is served, and since the WAL is appended in
order, every earlier commit becomes durable with it. :meth:`Transaction.append_ledger` refuses to
run in any other transaction. (Measured on the development VM: ~3 ms per FULL commit against
~0.03 ms under NORMAL; one durable commit per pass, so FULL is not the connection's default:
every download commits its traffic counter, and the store's lock would be held for each fsync.)

Payload bodies are kept for the current and the previous pass only (see
:meth:`Transaction.discard_payloads`); their SHA-256 stays so identical re-uploads remain harmless.
Only node sets and their unions (kilobytes) keep their bodies here. Embedding shares and sums
(0.1 to 10 MB each) are files beside the database (``service/rounds/payload_files.py``): an
upload's row holds its hash and size, and written in SQLite such a body would be written twice
(WAL, then checkpoint) and read back under the store's lock.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    state TEXT NOT NULL,
    current_pass INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS client_tokens (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    client_index INTEGER NOT NULL,
    token_sha256 BLOB NOT NULL UNIQUE,
    PRIMARY KEY (session_id, client_index)
);
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
    PRIMARY KEY (session_id, pass_index, layer, kind, client_index)
);
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
    PRIMARY KEY (session_id, pass_index, layer, kind)
);
CREATE TABLE IF NOT EXISTS pass_metrics (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    pass_index INTEGER NOT NULL,
    client_index INTEGER NOT NULL,
    loss REAL,
    val_accuracy REAL,
    test_accuracy REAL,
    train_accuracy REAL,
    reported_at REAL NOT NULL,
    PRIMARY KEY (session_id, pass_index, client_index)
);
CREATE TABLE IF NOT EXISTS traffic (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    client_index INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, client_index)
);
CREATE TABLE IF NOT EXISTS absences (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    client_index INTEGER NOT NULL,
    from_pass INTEGER NOT NULL,
    back_at INTEGER,
    PRIMARY KEY (session_id, client_index)
);
CREATE TABLE IF NOT EXISTS privacy_ledger (
    session_id TEXT NOT NULL REFERENCES sessions(id),
    release_index INTEGER NOT NULL,
    pass_index INTEGER NOT NULL,
    epsilon REAL NOT NULL,
    released_at REAL NOT NULL,
    clients TEXT,
    PRIMARY KEY (session_id, release_index),
    UNIQUE (session_id, pass_index)
);
"""

# columns added after the first release: (table, column, declaration), added in place on open
ADDED_COLUMNS = (("privacy_ledger", "clients", "TEXT"),)

# WAL mode: NORMAL survives a process crash; FULL (durable transactions) also a power loss.
DEFAULT_SYNCHRONOUS = "NORMAL"
DURABLE_SYNCHRONOUS = "FULL"

UploadKind = Literal["nodes", "embedding"]
ResultKind = Literal["union", "aggregate"]


@dataclass(frozen=True, slots=True)
class SessionRow:
    id: str
    state: str
    current_pass: int
    created_at: float


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


@dataclass(frozen=True, slots=True)
class MetricsRow:
    pass_index: int
    reports: int
    loss: float | None
    val_accuracy: float | None
    test_accuracy: float | None
    train_accuracy: float | None


@dataclass(frozen=True, slots=True)
class LedgerRow:
    release_index: int
    pass_index: int
    epsilon: float
    released_at: float
    clients: list[int] | None  # whose shares it holds; None: all (written before the column)


class Transaction:
    """The queries, valid only inside :meth:`Store.transaction`."""

    def __init__(self, connection: sqlite3.Connection, *, durable: bool = False) -> None:
        self._db = connection
        self.durable = durable  # committed under synchronous=FULL

    @property
    def connection(self) -> sqlite3.Connection:
        """The connection, for modules that keep their own tables in this database (the
        alignments: ``service/alignment_store.py``); only inside this transaction."""
        return self._db

    # Sessions and tokens

    def insert_session(
        self, session_id: str, config_json: str, token_hashes: list[bytes], *, state: str
    ) -> None:
        now = time.time()
        self._db.execute(
            "INSERT INTO sessions (id, config, state, current_pass, created_at, updated_at)"
            " VALUES (?, ?, ?, 0, ?, ?)",
            (session_id, config_json, state, now, now),
        )
        self._db.executemany(
            "INSERT INTO client_tokens (session_id, client_index, token_sha256) VALUES (?, ?, ?)",
            [(session_id, m, h) for m, h in enumerate(token_hashes)],
        )

    def session(self, session_id: str) -> SessionRow | None:
        row = self._db.execute(
            "SELECT id, state, current_pass, created_at FROM sessions WHERE id = ?",
            (session_id,),
        ).fetchone()
        return SessionRow(*row) if row else None

    def session_config(self, session_id: str) -> str:
        """The stored plan JSON (large: it holds the node lists; plans are cached)."""
        (config,) = self._db.execute(
            "SELECT config FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return str(config)

    def sessions_page(self, *, after: str | None, limit: int) -> list[tuple[SessionRow, str]]:
        """Up to ``limit`` sessions in the order they were created, from the one after session
        ``after`` (from the first if None), each with its stored plan JSON."""
        rows = self._db.execute(
            "SELECT id, state, current_pass, created_at, config FROM sessions"
            " WHERE ? IS NULL OR rowid > (SELECT rowid FROM sessions WHERE id = ?)"
            " ORDER BY rowid LIMIT ?",
            (after, after, limit),
        ).fetchall()
        return [(SessionRow(*row[:4]), str(row[4])) for row in rows]

    def count_sessions(self, state: str) -> int:
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM sessions WHERE state = ?", (state,)
        ).fetchone()
        return int(count)

    def set_session_state(self, session_id: str, state: str) -> None:
        self._db.execute(
            "UPDATE sessions SET state = ?, updated_at = ? WHERE id = ?",
            (state, time.time(), session_id),
        )

    def set_current_pass(self, session_id: str, pass_index: int) -> None:
        self._db.execute(
            "UPDATE sessions SET current_pass = ?, updated_at = ? WHERE id = ?",
            (pass_index, time.time(), session_id),
        )

    def token_owner(self, token_sha256: bytes) -> tuple[str, int] | None:
        row = self._db.execute(
            "SELECT session_id, client_index FROM client_tokens WHERE token_sha256 = ?",
            (token_sha256,),
        ).fetchone()
        return (str(row[0]), int(row[1])) if row else None

    def client_token_hash(self, session_id: str, client_index: int) -> bytes | None:
        row = self._db.execute(
            "SELECT token_sha256 FROM client_tokens WHERE session_id = ? AND client_index = ?",
            (session_id, client_index),
        ).fetchone()
        return bytes(row[0]) if row else None

    # Uploads and results

    def upload(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind, client_index: int
    ) -> UploadRow | None:
        row = self._db.execute(
            "SELECT client_index, sha256, size FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ? AND client_index = ?",
            (session_id, pass_index, layer, kind, client_index),
        ).fetchone()
        return UploadRow(int(row[0]), bytes(row[1]), int(row[2])) if row else None

    def uploaders(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind
    ) -> list[int]:
        rows = self._db.execute(
            "SELECT client_index FROM uploads WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND kind = ? ORDER BY client_index",
            (session_id, pass_index, layer, kind),
        ).fetchall()
        return [int(r[0]) for r in rows]

    def uploads(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind
    ) -> list[UploadRow]:
        """The slot's uploads in client index order."""
        rows = self._db.execute(
            "SELECT client_index, sha256, size FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ? ORDER BY client_index",
            (session_id, pass_index, layer, kind),
        ).fetchall()
        return [UploadRow(int(r[0]), bytes(r[1]), int(r[2])) for r in rows]

    def first_upload_at(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind
    ) -> float | None:
        (at,) = self._db.execute(
            "SELECT MIN(created_at) FROM uploads WHERE session_id = ? AND pass_index = ?"
            " AND layer = ? AND kind = ?",
            (session_id, pass_index, layer, kind),
        ).fetchone()
        return at

    def result_slots(self, session_id: str, pass_index: int) -> list[tuple[int, ResultKind]]:
        """The (layer, kind) of every result of the pass stored so far."""
        rows = self._db.execute(
            "SELECT layer, kind FROM results WHERE session_id = ? AND pass_index = ?",
            (session_id, pass_index),
        ).fetchall()
        return [(int(layer), kind) for layer, kind in rows]

    def upload_bodies(
        self, session_id: str, pass_index: int, layer: int, kind: UploadKind
    ) -> list[bytes]:
        """Bodies in client index order; raises if one was discarded."""
        rows = self._db.execute(
            "SELECT body FROM uploads WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND kind = ? ORDER BY client_index",
            (session_id, pass_index, layer, kind),
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
    ) -> None:
        """``body`` None: the body is kept outside SQLite (embedding shares)."""
        self._db.execute(
            "INSERT INTO uploads (session_id, pass_index, layer, kind, client_index, sha256, size,"
            " body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                pass_index,
                layer,
                kind,
                client_index,
                sha256,
                size,
                body,
                time.time(),
            ),
        )

    def result(
        self, session_id: str, pass_index: int, layer: int, kind: ResultKind
    ) -> ResultRow | None:
        row = self._db.execute(
            "SELECT rows, cols, count, body, released_at FROM results WHERE session_id = ?"
            " AND pass_index = ? AND layer = ? AND kind = ?",
            (session_id, pass_index, layer, kind),
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
    ) -> None:
        """``body`` None: the body is kept outside SQLite (sums)."""
        self._db.execute(
            "INSERT INTO results (session_id, pass_index, layer, kind, rows, cols, count, body,"
            " created_at, released_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                pass_index,
                layer,
                kind,
                rows,
                cols,
                count,
                body,
                time.time(),
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

    # Metrics, traffic, ledger

    def upsert_metrics(
        self,
        session_id: str,
        pass_index: int,
        client_index: int,
        *,
        loss: float | None,
        val_accuracy: float | None,
        test_accuracy: float | None,
        train_accuracy: float | None,
    ) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO pass_metrics (session_id, pass_index, client_index, loss,"
            " val_accuracy, test_accuracy, train_accuracy, reported_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                pass_index,
                client_index,
                loss,
                val_accuracy,
                test_accuracy,
                train_accuracy,
                time.time(),
            ),
        )

    def metrics(self, session_id: str) -> list[MetricsRow]:
        """Per pass: the mean of each value over the clients that reported it (AVG skips NULL)."""
        rows = self._db.execute(
            "SELECT pass_index, COUNT(*), AVG(loss), AVG(val_accuracy), AVG(test_accuracy),"
            " AVG(train_accuracy) FROM pass_metrics WHERE session_id = ?"
            " GROUP BY pass_index ORDER BY pass_index",
            (session_id,),
        ).fetchall()
        return [MetricsRow(*row) for row in rows]

    def add_traffic(
        self, session_id: str, client_index: int, *, up: int = 0, down: int = 0
    ) -> None:
        self._db.execute(
            "INSERT INTO traffic (session_id, client_index, bytes_up, bytes_down)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (session_id, client_index) DO UPDATE SET"
            " bytes_up = bytes_up + excluded.bytes_up,"
            " bytes_down = bytes_down + excluded.bytes_down",
            (session_id, client_index, up, down),
        )

    def traffic(self, session_id: str) -> dict[int, tuple[int, int]]:
        rows = self._db.execute(
            "SELECT client_index, bytes_up, bytes_down FROM traffic WHERE session_id = ?",
            (session_id,),
        ).fetchall()
        return {int(m): (int(up), int(down)) for m, up, down in rows}

    def ledger(self, session_id: str) -> list[LedgerRow]:
        rows = self._db.execute(
            "SELECT release_index, pass_index, epsilon, released_at, clients FROM privacy_ledger"
            " WHERE session_id = ? ORDER BY release_index",
            (session_id,),
        ).fetchall()
        return [
            LedgerRow(
                *row[:4], clients=None if row[4] is None else [int(m) for m in row[4].split(",")]
            )
            for row in rows
        ]

    def append_ledger(
        self,
        session_id: str,
        *,
        release_index: int,
        pass_index: int,
        epsilon: float,
        at: float,
        clients: list[int],
    ) -> None:
        """Only in a ``durable`` transaction: a ledger row must survive a power loss once the
        release it counts has been served."""
        if not self.durable:
            raise RuntimeError("the privacy ledger is appended only in a durable transaction")
        self._db.execute(
            "INSERT INTO privacy_ledger (session_id, release_index, pass_index, epsilon,"
            " released_at, clients) VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, release_index, pass_index, epsilon, at, ",".join(map(str, clients))),
        )


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(path)
        self._lock = threading.Lock()
        # isolation_level=None: we issue BEGIN/COMMIT ourselves; the lock serialises threads.
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={DEFAULT_SYNCHRONOUS}")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        with self.transaction():
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version not in (0, SCHEMA_VERSION):
                raise RuntimeError(
                    f"{path}: database schema version {version} is not supported"
                    f" (expected {SCHEMA_VERSION})"
                )
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)
            for table, column, declaration in ADDED_COLUMNS:
                columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in columns:  # a database written before the column existed
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[Transaction]:
        """One atomic transaction. ``durable``: its ``COMMIT`` returns only once the WAL is
        synced to disk (``synchronous=FULL``; SQLite allows the switch only outside a
        transaction), so it survives a power loss; needed to append the privacy ledger."""
        with self._lock:
            if durable:
                self._db.execute(f"PRAGMA synchronous={DURABLE_SYNCHRONOUS}")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield Transaction(self._db, durable=durable)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            finally:
                if durable:
                    self._db.execute(f"PRAGMA synchronous={DEFAULT_SYNCHRONOUS}")

    def ping(self) -> None:
        with self._lock:
            self._db.execute("SELECT 1").fetchone()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _create_private(path: Path) -> None:
    """Create a new database file with mode 0600 (it holds token hashes and the ledger); SQLite
    gives its ``-wal`` and ``-shm`` files the database file's mode. An existing file is left as
    its operator set it."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
