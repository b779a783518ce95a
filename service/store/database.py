"""SQLite persistence: the connection, its transactions and the schema.

The queries come in three groups, one module each, that :class:`Transaction` puts together:
sessions and their tokens (:mod:`.sessions`), the rounds' uploads, results and absences
(:mod:`.rounds`), and the metrics, traffic and privacy ledger (:mod:`.accounts`).

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.clock import Clock, SystemClock
from service.store.accounts import ACCOUNT_SCHEMA, AccountQueries
from service.store.rounds import ROUND_SCHEMA, RoundQueries
from service.store.sessions import SESSION_SCHEMA, SessionQueries

SCHEMA_VERSION = 1
SCHEMA = SESSION_SCHEMA + ROUND_SCHEMA + ACCOUNT_SCHEMA

# columns added after the first release: (table, column, declaration), added in place on open
ADDED_COLUMNS = (("privacy_ledger", "clients", "TEXT"),)

# WAL mode: NORMAL survives a process crash; FULL (durable transactions) also a power loss.
DEFAULT_SYNCHRONOUS = "NORMAL"
DURABLE_SYNCHRONOUS = "FULL"


class Transaction(SessionQueries, RoundQueries, AccountQueries):
    """The queries, valid only inside :meth:`Store.transaction`."""

    def __init__(
        self, connection: sqlite3.Connection, clock: Clock, *, durable: bool = False
    ) -> None:
        super().__init__(connection, clock)
        self.durable = durable  # committed under synchronous=FULL

    @property
    def connection(self) -> sqlite3.Connection:
        """The connection, for modules that keep their own tables in this database (the
        alignments: ``service/alignment/tables.py``); only inside this transaction."""
        return self._db

    def lock_slot(self, session_id: str, pass_index: int, layer: int) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already serialises the transactions."""


class Store:
    shared = False  # no other process writes this database

    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = path
        self.clock = clock or SystemClock()
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
                    yield Transaction(self._db, self.clock, durable=durable)
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
