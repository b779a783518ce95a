"""``glasu serve --migrate-to postgresql://...``: an SQLite database and its payload files,
copied into an empty PostgreSQL database, serve the same sessions there; a database that is
not empty is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI
from service_testkit import (
    ADMIN_TOKEN,
    Federation,
    admin,
    bearer,
    client_path,
    create_session,
    http_client,
    session_request,
)

from clients.cli.main import main
from service.app import service_context
from service.store import Slot, Store
from service.store.bodies import FileBodies, TableBodies
from service.store.transfer import copy_into_postgres

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("backend", ["sqlite"])  # the source; the target is PostgreSQL
async def test_a_migrated_database_serves_the_same_sessions(
    make_app: Callable[..., FastAPI],
    database: Path,
    postgres_cluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    request = session_request(rounds=3, eval_every=0)
    source = make_app()
    async with http_client(source) as http:
        created = await create_session(http, rounds=3, eval_every=0, label="moving")
        sid, token = created["session_id"], created["client_tokens"][0]
        federation = Federation(http, created, request)
        for p in range(2):
            await federation.run_pass(p)
        alignment = await http.post("/v1/alignments", json={"parties": 2}, headers=admin())
        assert alignment.status_code == 201
        sum_path = f"{client_path(sid, 0)}/passes/1/layers/3/aggregate"
        kept_sum = (await http.get(sum_path, headers=bearer(token))).content
        listing = (await http.get("/v1/sessions", headers=admin())).json()
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
    service_context(source).close()

    url = postgres_cluster.new_database("migrated")
    assert main(["serve", "--database", str(database), "--migrate-to", url]) == 0
    assert "payload bodies" in capsys.readouterr().out

    target = make_app(database=url)
    async with http_client(target) as http:
        moved = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert moved["current_pass"] == 2 and moved["label"] == "moving"
        assert moved == status
        served = await http.get(sum_path, headers=bearer(token))
        assert served.status_code == 200 and served.content == kept_sum  # from the payload table
        assert (await http.get("/v1/sessions", headers=admin())).json() == listing
        moved_alignment = await http.get(
            f"/v1/alignments/{alignment.json()['alignment_id']}", headers=admin()
        )
        assert moved_alignment.status_code == 200
        await Federation(http, created, request).run_pass(2)  # training goes on, on PostgreSQL
        done = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert done["current_pass"] == 3

    # a second copy into the same database, now not empty, is refused
    assert main(["serve", "--database", str(database), "--migrate-to", url]) != 0
    assert "not empty" in capsys.readouterr().err


def test_only_an_sqlite_database_is_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--database", str(tmp_path / "none.sqlite3"), "--migrate-to", "x"]) != 0
    assert "postgresql:// URL" in capsys.readouterr().err
    missing = ["serve", "--database", str(tmp_path / "none.sqlite3")]
    assert main([*missing, "--migrate-to", "postgresql://nobody@127.0.0.1:1/x"]) != 0
    assert "no SQLite database" in capsys.readouterr().err
    assert ADMIN_TOKEN  # no admin token is needed to migrate


def test_the_copy_moves_every_row_and_every_body_kept_beside_the_database(
    tmp_path: Path, postgres_cluster
) -> None:
    source = tmp_path / "service.sqlite3"
    store = Store(source)
    with store.transaction() as tx:
        tx.insert_session("s", "{}", [b"a" * 32, b"b" * 32])
    store.close()
    files, sha = FileBodies.beside(source), bytes(range(32))
    files.write_share(Slot("s", 0, 1), 1, sha, b"share")
    files.write_sum(Slot("s", 0, 1, 2), b"sum of part 2", sync=False)
    with postgres_cluster.scratch_database() as url:
        copied = copy_into_postgres(source, url)
        assert (copied.rows["sessions"], copied.rows["client_tokens"]) == (1, 2)
        assert copied.bodies == 2
        target = Store(url)
        try:
            bodies = TableBodies(target)
            assert bodies.read_share(Slot("s", 0, 1), 1, sha) == b"share"
            assert bodies.read_sum(Slot("s", 0, 1, 2)) == b"sum of part 2"
        finally:
            target.close()
