"""The store on PostgreSQL: replicas share one database (constraints and locks, not luck, keep
them apart), the privacy ledger's durable commits, the payload table, the database's clock, and
the schema's migrations (both backends)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi import FastAPI
from service_testkit import (
    Federation,
    admin,
    create_session,
    database_sql,
    http_client,
    session_request,
    until_a_transaction_waits_on_a_lock,
)

from service.alignment.tables import ALIGNMENT_MIGRATIONS, create_alignment_tables
from service.clock import DatabaseClock, ManualClock
from service.store import Slot, Store
from service.store.accounts import ACCOUNT_SCHEMA
from service.store.bodies import BodyKey, BodyMissing, TableBodies
from service.store.bodies import table as body_table
from service.store.database import STORE_MIGRATIONS
from service.store.dialect import Connection
from service.store.rounds import ROUND_SCHEMA
from service.store.sessions import SESSION_SCHEMA


@pytest.fixture
def url(postgres_cluster) -> Iterator[str]:
    with postgres_cluster.scratch_database() as url:
        yield url


@pytest.fixture
def replicas(url: str) -> Iterator[tuple[Store, Store]]:
    """Two stores on one database: what two replicas of the service hold."""
    first, second = Store(url), Store(url)
    with first.transaction() as tx:
        tx.insert_session("s", "{}", [b"a" * 32, b"b" * 32])
    yield first, second
    first.close()
    second.close()


def test_two_replicas_cannot_count_one_release_twice(replicas: tuple[Store, Store]) -> None:
    first, second = replicas
    assert first.shared and first.backend == "postgresql"
    with first.transaction(durable=True) as tx:
        tx.append_ledger("s", release_index=1, pass_index=0, epsilon=0.5, at=1.0, clients=[0, 1])
    # the same release again (same index), or the same pass under the next index: refused
    for release_index, pass_index in ((1, 1), (2, 0)):
        with pytest.raises(psycopg.errors.UniqueViolation), second.transaction(durable=True) as tx:
            tx.append_ledger(
                "s",
                release_index=release_index,
                pass_index=pass_index,
                epsilon=0.7,
                at=2.0,
                clients=[0, 1],
            )
    with second.transaction() as tx:
        assert [(r.release_index, r.pass_index) for r in tx.ledger("s")] == [(1, 0)]


def test_the_durable_transaction_commits_synchronously(replicas: tuple[Store, Store]) -> None:
    """A release's transaction commits with synchronous_commit on (flushed before COMMIT
    returns); the others with it off (SQLite's NORMAL); the ledger refuses the others."""
    store, _ = replicas
    with store.transaction() as tx:
        assert tx.connection.execute("SHOW synchronous_commit").fetchone() == ("off",)
        with pytest.raises(RuntimeError, match="durable transaction"):
            tx.append_ledger("s", release_index=1, pass_index=0, epsilon=0.5, at=1.0, clients=[0])
    with store.transaction(durable=True) as tx:
        assert tx.connection.execute("SHOW synchronous_commit").fetchone() == ("on",)
        tx.append_ledger("s", release_index=1, pass_index=0, epsilon=0.5, at=1.0, clients=[0])
    with store.transaction() as tx:  # SET LOCAL ended with its transaction
        assert tx.connection.execute("SHOW synchronous_commit").fetchone() == ("off",)


def test_a_session_and_a_slot_are_locked_across_replicas(
    replicas: tuple[Store, Store], url: str
) -> None:
    """A transaction holds its session's lock from its first read of the session: the other
    replica's transaction of that session waits for its commit and then sees its writes."""
    first, second = replicas
    locked, seen = threading.Event(), []

    def other_replica() -> None:
        locked.wait()
        with second.transaction() as tx:
            tx.lock_slot("s", 0, 1)  # takes the session's lock first
            row = tx.session("s")
            assert row is not None
            seen.append(row.current_pass)

    thread = threading.Thread(target=other_replica)
    thread.start()
    with first.transaction() as tx:
        assert tx.session("s") is not None
        locked.set()
        until_a_transaction_waits_on_a_lock(url)
        assert seen == []  # still waiting
        tx.set_current_pass("s", 1)
    thread.join(10)
    assert seen == [1]


def test_payload_bodies_live_in_the_database(replicas: tuple[Store, Store]) -> None:
    first, second = replicas
    payloads, other = TableBodies(first), TableBodies(second)
    sha, three, four = bytes(range(32)), Slot("s", 3, 1), Slot("s", 4, 1)
    payloads.write_share(three, 0, sha, b"share")
    payloads.write_share(three, 0, sha, b"share")  # an identical re-upload
    payloads.write_sum(three, b"sum", sync=True)
    with first.transaction() as tx:  # or in the caller's transaction
        payloads.write_sum(four, b"next", sync=False, tx=tx)
    assert other.read_share(three, 0, sha) == b"share"
    assert other.read_sum(three) == b"sum"
    other.discard("s", before_pass=4)
    assert payloads.read_sum(three) is None
    assert payloads.read_sum(four) == b"next"
    with pytest.raises(BodyMissing):
        payloads.read_share(three, 0, sha)
    payloads.discard("s")
    assert payloads.read_sum(four) is None


def test_payload_bodies_cross_the_connection_in_bounded_pieces(
    replicas: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body is written and read a piece at a time, never as one message: libpq keeps each
    pooled connection's buffers at the size of the largest message it carried, so whole
    bodies would pin their size per connection for good (bench/replica_memory.py)."""
    piece = 1000
    monkeypatch.setattr(body_table, "BODY_PIECE_BYTES", piece, raising=False)
    largest: list[int] = []
    execute, copy_in = Connection.execute, getattr(Connection, "copy_in", None)

    def measured_execute(self: Connection, sql: str, params: Any = ()) -> Any:
        largest.append(max((len(p) for p in params if isinstance(p, bytes)), default=0))
        cursor = execute(self, sql, params)
        rows = cursor.fetchall() if getattr(cursor, "description", None) else []
        for row in rows:
            largest.append(max((len(v) for v in row if isinstance(v, bytes)), default=0))
        return _Fetched(rows)

    def measured_copy_in(self: Connection, sql: str, data: Iterable[bytes]) -> None:
        def measured() -> Iterator[bytes]:
            for block in data:
                largest.append(len(block))
                yield block

        copy_in(self, sql, measured())

    monkeypatch.setattr(Connection, "execute", measured_execute)
    monkeypatch.setattr(Connection, "copy_in", measured_copy_in, raising=False)
    first, second = replicas
    payloads, other = TableBodies(first), TableBodies(second)
    body = np.random.default_rng(0).bytes(3 * piece + 123)  # three pieces and a remainder
    sha, slot = hashlib.sha256(body).digest(), Slot("s", 0, 1)
    payloads.write_share(slot, 0, sha, body)
    other.write_share(slot, 0, sha, body)  # an identical re-upload, on another replica
    payloads.write_sum(slot, body[::-1], sync=True)
    assert other.read_share(slot, 0, sha) == body
    assert other.read_sum(slot) == body[::-1]
    assert 0 < max(largest) <= piece + 64, max(largest)


class _Fetched:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


@pytest.mark.anyio
@pytest.mark.parametrize("backend", ["postgresql"])  # the payload table is PostgreSQL's
async def test_the_payload_table_follows_the_kept_passes(
    make_app: Callable[..., FastAPI], database: Path | str
) -> None:
    """As the payload files do on SQLite (test_payload_files.py)."""
    request = session_request(rounds=3, eval_every=0)
    async with http_client(make_app()) as http:
        created = await create_session(http, rounds=3, eval_every=0)
        sid = created["session_id"]
        federation = Federation(http, created, request)
        for p in range(2):
            await federation.run_pass(p)
            assert _payload_passes(str(database)) == [p]
        closed = await http.delete(f"/v1/sessions/{sid}", headers=admin())
        assert closed.status_code == 200
    assert _payload_passes(str(database)) == []


def _payload_passes(url: str) -> list[int]:
    with psycopg.connect(url) as db:
        rows = db.execute("SELECT DISTINCT pass_index FROM payloads ORDER BY 1").fetchall()
    return [int(p) for (p,) in rows]


def test_the_database_clock_is_every_replicas_clock(url: str) -> None:
    store = Store(url)
    try:
        assert isinstance(store.clock, DatabaseClock)
        readings = [store.clock.now() for _ in range(100)]
        assert readings == sorted(readings)
        assert abs(readings[-1] - time.time()) < 1.0  # the server runs on this machine
    finally:
        store.close()
    injected = ManualClock()
    store = Store(url, injected)
    try:
        assert store.clock is injected
        with store.transaction() as tx:
            assert tx.now() == injected.now()
    finally:
        store.close()


def test_replicas_starting_together_migrate_once(url: str) -> None:
    stores: list[Store] = []
    threads = [threading.Thread(target=lambda: stores.append(Store(url))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert len(stores) == 3
        for store in stores:
            create_alignment_tables(store)
        with psycopg.connect(url) as db:
            rows = db.execute(
                "SELECT component, version FROM schema_migrations ORDER BY 1, 2"
            ).fetchall()
        assert rows == [("alignments", m.version) for m in ALIGNMENT_MIGRATIONS] + [
            ("store", m.version) for m in STORE_MIGRATIONS
        ]
    finally:
        for store in stores:
            store.close()


def test_a_database_of_the_previous_release_is_migrated(tmp_path: Path) -> None:
    """The schema before versioned migrations: PRAGMA user_version 1, the columns added in
    place, no schema_migrations table; it opens, keeps its rows and is recorded at the latest
    version, and a second open applies nothing."""
    path = tmp_path / "previous.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(SESSION_SCHEMA + ROUND_SCHEMA + ACCOUNT_SCHEMA)
        db.execute("ALTER TABLE privacy_ledger ADD COLUMN clients TEXT")
        db.execute("INSERT INTO sessions VALUES ('s', '{}', 'running', 2, 1.0, 1.0)")
        db.execute("INSERT INTO privacy_ledger VALUES ('s', 1, 0, 0.5, 1.0, '0,1')")
        db.execute("PRAGMA user_version = 1")
    db.close()
    for _ in range(2):
        store = Store(path)
        try:
            create_alignment_tables(store)
            with store.transaction() as tx:
                assert [(r.release_index, r.clients) for r in tx.ledger("s")] == [(1, [0, 1])]
                row = tx.session("s")
                assert row is not None and row.current_pass == 2
                versions = tx.connection.execute(
                    "SELECT component, COUNT(*), MAX(version) FROM schema_migrations"
                    " GROUP BY component ORDER BY component"
                ).fetchall()
                (user_version,) = tx.connection.execute("PRAGMA user_version").fetchone()
        finally:
            store.close()
        assert versions == [
            ("alignments", len(ALIGNMENT_MIGRATIONS), len(ALIGNMENT_MIGRATIONS)),
            ("store", len(STORE_MIGRATIONS), len(STORE_MIGRATIONS)),
        ]
        assert user_version == len(STORE_MIGRATIONS)


def test_a_database_of_a_newer_release_is_refused(tmp_path: Path, url: str) -> None:
    path = tmp_path / "newer.sqlite3"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(RuntimeError, match="not supported"):
        Store(path)
    Store(url).close()
    with psycopg.connect(url) as pg:
        pg.execute("INSERT INTO schema_migrations VALUES ('store', 99, 'future', 0)")
    with pytest.raises(RuntimeError, match="newer than this release"):
        Store(url)


# uploads and results as they were before shares travelled in parts (store migration 4)
_UNPARTED_ROUNDS = """
CREATE TABLE uploads (
    session_id TEXT NOT NULL REFERENCES sessions(id), pass_index INTEGER NOT NULL,
    layer INTEGER NOT NULL, kind TEXT NOT NULL, client_index INTEGER NOT NULL,
    sha256 BLOB NOT NULL, size INTEGER NOT NULL, body BLOB, created_at REAL NOT NULL,
    PRIMARY KEY (session_id, pass_index, layer, kind, client_index)
);
CREATE TABLE results (
    session_id TEXT NOT NULL REFERENCES sessions(id), pass_index INTEGER NOT NULL,
    layer INTEGER NOT NULL, kind TEXT NOT NULL, rows INTEGER NOT NULL, cols INTEGER NOT NULL,
    count INTEGER NOT NULL, body BLOB, created_at REAL NOT NULL, released_at REAL,
    PRIMARY KEY (session_id, pass_index, layer, kind)
);
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_database_from_before_parts_keys_its_slots_by_part(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Migration 4 moves the rows of uploads and results (and on PostgreSQL the payloads) to
    part 0 and makes the part a key: a slot's part 1 is a row of its own."""
    database: str | Path = tmp_path / "before.sqlite3"
    if backend == "postgresql":
        database = request.getfixturevalue("url")
    Store(database).close()
    unparted = _UNPARTED_ROUNDS + (
        "ALTER TABLE payloads DROP CONSTRAINT payloads_pkey; ALTER TABLE payloads DROP COLUMN"
        " part; ALTER TABLE payloads ADD PRIMARY KEY"
        " (session_id, pass_index, layer, client_index, sha256);"
        if backend == "postgresql"
        else ""
    )
    sha256 = "'\\xab'" if backend == "postgresql" else "X'ab'"  # a blob literal
    statements = ["DROP TABLE uploads", "DROP TABLE results"]
    if backend == "postgresql":
        unparted = unparted.replace("BLOB", "BYTEA").replace("REAL", "DOUBLE PRECISION")
    statements += [s for s in unparted.split(";") if s.strip()]
    statements += [
        "DELETE FROM schema_migrations WHERE version = 4",
        "INSERT INTO sessions VALUES ('s', '{}', 'running', 0, 1.0, 1.0)",
        f"INSERT INTO uploads VALUES ('s', 0, 1, 'embedding', 2, {sha256}, 3, NULL, 1.0)",
        "INSERT INTO results VALUES ('s', 0, 1, 'aggregate', 5, 4, 3, NULL, 1.0, NULL)",
    ]
    if backend == "postgresql":
        statements.append("INSERT INTO payloads VALUES ('s', 0, 1, -1, '', 'sum')")
    else:
        statements.append("PRAGMA user_version = 3")
    database_sql(database, *statements)
    store = Store(database)
    try:
        with store.transaction() as tx:
            assert tx.uploads("s", 0, 1, "share", 0)[0].sha256 == b"\xab"
            result = tx.result("s", 0, 1, "sum", 0)
            assert result is not None and (result.rows, result.count) == (5, 3)
            assert tx.result("s", 0, 1, "sum", 1) is None
            tx.insert_upload("s", 0, 1, "share", 2, sha256=b"cd", size=3, body=None, part=1)
            tx.insert_result("s", 0, 1, "sum", rows=2, cols=4, count=3, body=None, part=1)
            assert tx.result_parts("s", 0, 1, "sum") == 2
            if backend == "postgresql":
                assert tx.read_body(BodyKey.sum_of(Slot("s", 0, 1, 0))) == b"sum"
                tx.put_body(BodyKey.sum_of(Slot("s", 0, 1, 1)), b"sum 1")
                assert tx.read_body(BodyKey.sum_of(Slot("s", 0, 1, 1))) == b"sum 1"
    finally:
        store.close()
