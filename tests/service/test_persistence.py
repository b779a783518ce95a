"""A restart with the same database keeps sessions, tokens, progress and payload bounds."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    Federation,
    admin,
    bearer,
    client_path,
    create_session,
    database_sql,
    expected_sum,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    session_request,
)

from service.app import service_context
from service.store import Store

pytestmark = pytest.mark.anyio


async def test_restart_keeps_sessions_tokens_and_progress(
    make_app: Callable[..., FastAPI],
) -> None:
    first = make_app()
    async with http_client(first) as http:
        created = await create_session(http, clients=2, label="survivor")
        sid, tokens = created["session_id"], created["client_tokens"]
        # Pass 0 half done: both node sets, then client 0's share of layer 1.
        for m, nodes in enumerate([[1, 4], [4, 7]]):
            response = await http.put(
                f"{client_path(sid, m)}/passes/0/layers/1/nodes",
                content=nodes_body(nodes),
                headers={**bearer(tokens[m]), **node_headers(np.asarray(nodes))},
            )
            assert response.status_code == 201
        share0 = np.full((3, 8), 0.25, dtype=np.float32)
        response = await http.put(
            f"{client_path(sid, 0)}/passes/0/layers/1/embedding",
            content=share0.tobytes(),
            headers={**bearer(tokens[0]), **matrix_headers(3, 8)},
        )
        assert response.status_code == 201
        await http.post(
            f"{client_path(sid, 0)}/passes/0/metrics", json={"loss": 0.5}, headers=bearer(tokens[0])
        )
    service_context(first).close()

    second = make_app()
    async with http_client(second) as http:
        status = await http.get(f"/v1/sessions/{sid}", headers=bearer(tokens[1]))
        assert status.status_code == 200
        body = status.json()
        assert body["label"] == "survivor" and body["state"] == "running"
        assert body["progress"]["layers"][0]["embeddings_received"] == [0]
        assert body["metrics"][0]["loss"] == 0.5
        assert body["bytes_up"] > 0
        # old tokens still work and are still bound to their index
        forbidden = await http.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[1]))
        assert forbidden.status_code == 403
        # idempotency survives: the same share again is a duplicate, another one conflicts
        again = await http.put(
            f"{client_path(sid, 0)}/passes/0/layers/1/embedding",
            content=share0.tobytes(),
            headers={**bearer(tokens[0]), **matrix_headers(3, 8)},
        )
        assert again.status_code == 200
        union = await http.get(
            f"{client_path(sid, 1)}/passes/0/layers/1/nodes", headers=bearer(tokens[1])
        )
        assert np.frombuffer(union.content, dtype="<i8").tolist() == [1, 4, 7]
        share1 = np.full((3, 8), 2.0, dtype=np.float32)
        response = await http.put(
            f"{client_path(sid, 1)}/passes/0/layers/1/embedding",
            content=share1.tobytes(),
            headers={**bearer(tokens[1]), **matrix_headers(3, 8)},
        )
        assert response.status_code == 201
        total = await http.get(
            f"{client_path(sid, 0)}/passes/0/layers/1/aggregate", headers=bearer(tokens[0])
        )
        assert total.status_code == 200
        np.testing.assert_array_equal(
            np.frombuffer(total.content, dtype="<f4").reshape(3, 8),
            expected_sum({0: share0, 1: share1}),
        )


async def test_sum_interrupted_by_a_restart_is_redone(
    make_app: Callable[..., FastAPI], database: Path
) -> None:
    """All shares stored but the service died before writing the sum: a download recomputes it."""
    first = make_app()
    async with http_client(first) as http:
        created = await create_session(http, clients=1, agg_layers=[{"layer": 3, "width": 2}])
        sid, token = created["session_id"], created["client_tokens"][0]
        share = np.ones((5, 2), dtype=np.float32)
        response = await http.put(
            f"{client_path(sid, 0)}/passes/0/layers/3/embedding",
            content=share.tobytes(),
            headers={**bearer(token), **matrix_headers(5, 2)},
        )
        assert response.status_code == 201
    service_context(first).close()
    database_sql(  # simulate the crash between the two transactions
        database,
        "DELETE FROM results WHERE kind = 'aggregate'",
        "UPDATE sessions SET current_pass = 0",
    )

    async with http_client(make_app()) as http:
        total = await http.get(
            f"{client_path(sid, 0)}/passes/0/layers/3/aggregate", headers=bearer(token)
        )
        assert total.status_code == 200
        assert total.content == share.tobytes()
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["current_pass"] == 1


async def test_only_current_and_previous_pass_payloads_are_kept(
    make_app: Callable[..., FastAPI], database: Path
) -> None:
    request = session_request(rounds=4, eval_every=0)
    async with http_client(make_app()) as http:
        created = await create_session(http, rounds=4, eval_every=0)
        federation = Federation(http, created, request)
        for p in range(4):
            await federation.run_pass(p)
        sid, token = created["session_id"], created["client_tokens"][0]
        old = await http.get(
            f"{client_path(sid, 0)}/passes/1/layers/1/aggregate", headers=bearer(token)
        )
        assert old.status_code == 409 and "discarded" in old.json()["detail"]
        previous = await http.get(
            f"{client_path(sid, 0)}/passes/3/layers/3/aggregate", headers=bearer(token)
        )
        assert previous.status_code == 200
    kept, (hashes,) = database_sql(
        database,
        "SELECT DISTINCT pass_index FROM uploads WHERE body IS NOT NULL ORDER BY 1",
        "SELECT COUNT(*) FROM uploads WHERE body IS NULL",
    )
    assert [p for (p,) in kept] == [3]  # pass 4 is current but has no uploads yet
    assert hashes[0] > 0  # hashes of discarded bodies stay for idempotency


@pytest.mark.sqlite_only  # PostgreSQL's: tests/service/test_postgres_store.py
def test_ledger_rows_are_committed_under_synchronous_full(database: Path) -> None:
    """A release's ledger row must survive a power loss once the release is served: the store
    appends it only in a durable transaction, which commits under synchronous=FULL (the WAL is
    synced before COMMIT returns). Other transactions keep NORMAL (a process crash loses nothing
    committed; a power loss may lose the last commits, never a ledger row before them)."""
    store = Store(database)
    try:
        full, normal = 2, 1  # PRAGMA synchronous values
        with store.transaction() as tx:
            assert tx.durable is False
            assert tx.connection.execute("PRAGMA synchronous").fetchone() == (normal,)
            tx.insert_session("s", "{}", [b"h" * 32])
            with pytest.raises(RuntimeError, match="durable transaction"):
                tx.append_ledger(
                    "s", release_index=1, pass_index=0, epsilon=0.5, at=1.0, clients=[0]
                )
        with store.transaction(durable=True) as tx:
            assert tx.connection.execute("PRAGMA synchronous").fetchone() == (full,)
            tx.append_ledger("s", release_index=1, pass_index=0, epsilon=0.5, at=1.0, clients=[0])
        with pytest.raises(ValueError, match="boom"), store.transaction(durable=True) as tx:
            tx.append_ledger("s", release_index=2, pass_index=1, epsilon=0.7, at=2.0, clients=[0])
            raise ValueError("boom")  # rolled back, and the connection is back to NORMAL
        with store.transaction() as tx:
            assert tx.connection.execute("PRAGMA synchronous").fetchone() == (normal,)
            assert [(r.release_index, r.pass_index) for r in tx.ledger("s")] == [(1, 0)]
    finally:
        store.close()


@pytest.mark.sqlite_only  # an SQLite file an earlier release wrote
def test_a_ledger_written_before_the_clients_column_is_read_as_everyones(database: Path) -> None:
    """A database of an earlier release gains the column in place; its rows held every
    client's share."""
    db = sqlite3.connect(database)
    db.execute(
        "CREATE TABLE privacy_ledger (session_id TEXT NOT NULL, release_index INTEGER NOT NULL,"
        " pass_index INTEGER NOT NULL, epsilon REAL NOT NULL, released_at REAL NOT NULL,"
        " PRIMARY KEY (session_id, release_index), UNIQUE (session_id, pass_index))"
    )
    db.execute("INSERT INTO privacy_ledger VALUES ('s', 1, 0, 0.5, 1.0)")
    db.commit()
    db.close()
    store = Store(database)
    try:
        with store.transaction() as tx:
            assert [(r.release_index, r.clients) for r in tx.ledger("s")] == [(1, None)]
    finally:
        store.close()


@pytest.mark.sqlite_only  # SQLite's files
def test_the_database_and_its_wal_files_are_created_private(database: Path) -> None:
    """Like the payload files: the database holds token hashes and the ledger, and a umask of
    022 must not make them world-readable."""
    umask = os.umask(0o022)
    try:
        store = Store(database)
        try:
            with store.transaction() as tx:
                tx.insert_session("s", "{}", [b"h" * 32])
            files = [p for p in database.parent.glob(f"{database.name}*") if p.is_file()]
            modes = {p.name: oct(p.stat().st_mode & 0o777) for p in files}
        finally:
            store.close()
    finally:
        os.umask(umask)
    names = [database.name, f"{database.name}-wal", f"{database.name}-shm"]
    assert modes == dict.fromkeys(names, oct(0o600))
