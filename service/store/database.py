"""The service's database: the store, its transactions and its schema's migrations.

The queries come in four groups, one module each, that :class:`Transaction` puts together:
sessions and their tokens (:mod:`.sessions`), the rounds' uploads, results and absences
(:mod:`.rounds`), the metrics, traffic and privacy ledger (:mod:`.accounts`), and on PostgreSQL
the share and sum bodies (:mod:`.bodies.table`). Each is written once for both databases
(:mod:`.dialect`).

Two backends (:mod:`.engines` says how each runs its transactions and why): **SQLite**, the
embedded default (``database`` is a file path: ``glasu serve`` and ``glasu train`` need no
server), and **PostgreSQL** (``database`` is a ``postgresql://`` URL, e.g.
``GLASU_DATABASE=postgresql://glasu@db/glasu``): several replicas of the service share it
(:attr:`Store.shared`). Every read and write happens inside :meth:`Store.transaction`, so a check
and the write that depends on it are atomic, on PostgreSQL across replicas: a transaction holds
its session's lock from its first read of the session's row. Callers on the event loop must
reach the store through a worker thread (``run_in_threadpool``).

The schema is versioned (:mod:`.migrations`): :data:`STORE_MIGRATIONS` are applied when a store
opens; SQLite's ``PRAGMA user_version`` follows the store's version, so an older release refuses
a database a newer one migrated.

Durability: a transaction that appends to the privacy ledger must be opened with
``transaction(durable=True)``: its ``COMMIT`` returns only once it is on disk (SQLite
``synchronous=FULL``; PostgreSQL ``synchronous_commit = on``), hence before the release is
served; :meth:`Transaction.append_ledger` refuses to run in any other transaction. Two replicas
can never count one release twice: the ledger's primary key (session, release) and its UNIQUE
(session, pass) refuse the second row.

Clock: every timestamp comes from the store's clock (``tx.now()``). On PostgreSQL, unless a
clock is given, it is the database's (:class:`~service.clock.DatabaseClock`), so that every
replica reads one time for rows, straggler deadlines and session clocks.

Payload bodies are kept for the current and the previous pass only (see
:meth:`Transaction.discard_payloads`); their SHA-256 stays so identical re-uploads remain harmless.
Only node sets and their unions (kilobytes) keep their bodies in the rows. Embedding shares and
sums (0.1 to 10 MB each) go to the bodies (:mod:`.bodies`): files beside an SQLite database,
table ``payloads`` in PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.clock import Clock, DatabaseClock, SystemClock
from service.store.accounts import ACCOUNT_SCHEMA, AccountQueries
from service.store.bodies.table import BODY_SCHEMA, BODY_TABLE, BodyQueries
from service.store.dialect import Backend, Connection
from service.store.engines import PostgresEngine, SqliteEngine, is_database_url
from service.store.migrations import Migration, added_columns, added_key_column, migrate
from service.store.rounds import PARTED_TABLES, ROUND_SCHEMA, RoundQueries
from service.store.sessions import SESSION_SCHEMA, SessionQueries

# the order of sessions (SQLite's implicit rowid; ``sessions_page``)
_POSTGRES_ROWID = (
    "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS rowid BIGINT GENERATED ALWAYS AS IDENTITY"
)


def _first_schema(connection: Connection) -> None:
    connection.run_schema(SESSION_SCHEMA + ROUND_SCHEMA + ACCOUNT_SCHEMA)
    if connection.backend == "postgresql":
        connection.execute(_POSTGRES_ROWID)


def _body_table(connection: Connection) -> None:
    if connection.backend == "postgresql":  # SQLite keeps the bodies in files
        connection.run_schema(BODY_SCHEMA)


def _parts(connection: Connection) -> None:
    tables = dict(PARTED_TABLES)
    if connection.backend == "postgresql":
        tables["payloads"] = BODY_TABLE
    added_key_column("part", "INTEGER NOT NULL DEFAULT 0", tables)(connection)


STORE_MIGRATIONS = (
    Migration(1, "sessions, tokens, rounds, metrics, traffic, privacy ledger", _first_schema),
    Migration(
        2,
        "columns added after the first release",
        added_columns([("privacy_ledger", "clients", "TEXT")]),
    ),
    Migration(3, "share and sum bodies in the database (PostgreSQL)", _body_table),
    Migration(
        4, "shares and sums in parts: part in the keys of uploads, results, payloads", _parts
    ),
)


class Transaction(SessionQueries, RoundQueries, AccountQueries, BodyQueries):
    """The queries, valid only inside :meth:`Store.transaction`."""

    def __init__(self, connection: Connection, clock: Clock, *, durable: bool = False) -> None:
        super().__init__(connection, clock)
        self.durable = durable  # its COMMIT returns once it is on disk

    @property
    def connection(self) -> Connection:
        """The connection, for modules that keep their own tables in this database (the
        alignments: ``service/alignment/tables.py``); only inside this transaction."""
        return self._db


class Store:
    def __init__(self, database: str | Path, clock: Clock | None = None) -> None:
        """``database``: an SQLite file's path, or a ``postgresql://`` URL. ``clock``: the
        system's on SQLite, the database's on PostgreSQL, unless given."""
        self.path: Path | None = None
        self._local = threading.local()
        self.url: str | None = None
        self._engine: SqliteEngine | PostgresEngine
        if is_database_url(database):
            self.url = str(database)
            self._engine = PostgresEngine(self.url)
            self.clock: Clock = clock or DatabaseClock(self._engine.database_time)
        else:
            self.path = Path(database)
            self._engine = SqliteEngine(self.path)
            self.clock = clock or SystemClock()
        try:
            self.migrate("store", STORE_MIGRATIONS)
        except BaseException:
            self._engine.close()
            raise

    @property
    def backend(self) -> Backend:
        return self._engine.backend

    @property
    def shared(self) -> bool:
        """Whether other processes (replicas) write this database too."""
        return self.backend == "postgresql"

    def migrate(self, component: str, migrations: tuple[Migration, ...]) -> int:
        """Apply ``component``'s missing migrations (see :mod:`.migrations`); its version."""
        with self.transaction() as tx:
            if isinstance(self._engine, SqliteEngine) and component == "store":
                known = len(migrations)
                if self._engine.user_version() > known:
                    raise RuntimeError(
                        f"{self.path}: database schema version {self._engine.user_version()}"
                        f" is not supported (this release knows up to {known})"
                    )
            version = migrate(tx.connection, component, migrations, now=tx.now())
            if isinstance(self._engine, SqliteEngine) and component == "store":
                self._engine.set_user_version(version)
        return version

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[Transaction]:
        """One atomic transaction. ``durable``: its ``COMMIT`` returns only once it is on disk,
        so it survives a power loss; needed to append the privacy ledger."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            with self._engine.transaction(durable=durable) as connection:
                yield Transaction(connection, self.clock, durable=durable)
        finally:
            self._local.depth = depth

    @property
    def in_transaction(self) -> bool:
        """Whether the calling thread is inside one of this store's transactions (holding the
        SQLite lock, or a PostgreSQL connection and its locks)."""
        return getattr(self._local, "depth", 0) > 0

    def ping(self) -> None:
        self._engine.ping()

    def close(self) -> None:
        self._engine.close()
