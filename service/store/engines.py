"""The two databases under the store: how each opens, runs a transaction and tells the time.

**SQLite** (the embedded default): one connection in WAL mode, guarded by a lock, each
transaction ``BEGIN IMMEDIATE``. The connection runs ``synchronous=NORMAL``, under which a commit
survives a crash of the process but the last commits may be lost in a power loss or an OS crash
(the WAL is synced only at checkpoints). A durable transaction commits under
``synchronous=FULL``: the WAL is synced before ``COMMIT`` returns, and since the WAL is appended
in order, every earlier commit becomes durable with it. (Measured on the development VM: ~3 ms
per FULL commit against ~0.03 ms under NORMAL; one durable commit per pass, so FULL is not the
connection's default: every download commits its traffic counter, and the lock would be held
for each fsync.)

**PostgreSQL**: a ``psycopg_pool.ConnectionPool`` (:data:`POOL_SIZE` connections per process),
isolation READ COMMITTED, and a transaction-level advisory lock per session (see
:meth:`~service.store.queries.Queries.lock`): a transaction takes its session's lock when it
first reads the session's row, which every round-engine transaction does before anything else,
so the checks-then-write of the round engine run one at a time per session across every
replica, as they do on SQLite for the whole database, while other sessions run in parallel.
READ COMMITTED, not REPEATABLE READ or SERIALIZABLE: each statement reads what was committed
before it, hence everything the lock's previous holder wrote (a snapshot taken at the
transaction's first statement could predate the lock), and nothing has to be retried (a
serialisation failure could not be, since a transaction is the body of a ``with`` block).
The pool's connections run ``synchronous_commit = off``, the analogue of SQLite's NORMAL: a
commit is in the server's memory (it survives the service's processes, not a crash of the
server's machine); a durable transaction runs ``SET LOCAL synchronous_commit = on`` (the
server's own default), so its ``COMMIT`` returns once the WAL, with every earlier commit, is
flushed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.settings import POSTGRES_SCHEMES
from service.store.dialect import Backend, Connection, Dialect

# WAL mode: NORMAL survives a process crash; FULL (durable transactions) also a power loss.
DEFAULT_SYNCHRONOUS = "NORMAL"
DURABLE_SYNCHRONOUS = "FULL"

# per process; the server's default max_connections (100) fits 3 replicas and their listeners
POOL_SIZE = 16
CONNECT_TIMEOUT_SECONDS = 10.0


class SqliteEngine:
    backend: Backend = "sqlite"

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
        self._connection = Connection(self._db, Dialect("sqlite"))

    @contextmanager
    def transaction(self, *, durable: bool) -> Iterator[Connection]:
        """``durable``: SQLite allows the switch to ``synchronous=FULL`` only outside a
        transaction, so it is made around it."""
        with self._lock:
            if durable:
                self._db.execute(f"PRAGMA synchronous={DURABLE_SYNCHRONOUS}")
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._connection
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            finally:
                if durable:
                    self._db.execute(f"PRAGMA synchronous={DEFAULT_SYNCHRONOUS}")

    def user_version(self) -> int:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        return int(version)

    def set_user_version(self, version: int) -> None:
        self._db.execute(f"PRAGMA user_version = {int(version)}")

    def ping(self) -> None:
        with self._lock:
            self._db.execute("SELECT 1").fetchone()

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresEngine:
    backend: Backend = "postgresql"

    def __init__(self, url: str, *, pool_size: int = POOL_SIZE) -> None:
        from psycopg_pool import ConnectionPool

        self.url = url
        self._dialect = Dialect("postgresql")
        self._pool: Any = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"options": "-c synchronous_commit=off", "application_name": "glasu"},
            name="glasu-store",
            open=False,
        )
        self._pool.open(wait=False)
        try:
            self._pool.wait(timeout=CONNECT_TIMEOUT_SECONDS)
        except Exception as exc:
            self._pool.close()
            raise ConnectionError(f"cannot connect to {redacted(url)}: {exc}") from exc

    @contextmanager
    def transaction(self, *, durable: bool) -> Iterator[Connection]:
        # the pool's block commits when it ends (rolls back on an exception)
        with self._pool.connection() as raw:
            if durable:
                raw.execute("SET LOCAL synchronous_commit = on")
            yield Connection(raw, self._dialect)

    def database_time(self) -> float:
        """The server's ``clock_timestamp()``, seconds since the epoch."""
        with self._pool.connection() as raw:
            (at,) = raw.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
        return float(at)

    def ping(self) -> None:
        with self._pool.connection() as raw:
            raw.execute("SELECT 1").fetchone()

    def close(self) -> None:
        self._pool.close()


def is_database_url(database: str | Path) -> bool:
    """Whether ``database`` names a PostgreSQL server rather than an SQLite file."""
    return isinstance(database, str) and database.startswith(POSTGRES_SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


def _create_private(path: Path) -> None:
    """Create a new database file with mode 0600 (it holds token hashes and the ledger); SQLite
    gives its ``-wal`` and ``-shm`` files the database file's mode. An existing file is left as
    its operator set it."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
