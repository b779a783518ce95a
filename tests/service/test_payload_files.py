"""Share and sum bodies live in files beside the database (service/rounds/payload_files.py), kept
for the current and the previous pass like the bodies SQLite holds, and dropped with the session
when it is closed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI
from service_testkit import Federation, admin, create_session, http_client, session_request

from service.rounds.payload_files import PayloadFiles
from service.store import Slot

pytestmark = pytest.mark.anyio


def pass_dirs(database: Path, session_id: str) -> list[int]:
    session_dir = database.parent / f"{database.name}-payloads" / session_id
    if not session_dir.exists():
        return []
    return sorted(int(path.name) for path in session_dir.iterdir())


@pytest.mark.sqlite_only  # the files of an SQLite store; PostgreSQL's table: test_postgres_store
async def test_files_follow_the_kept_passes_and_go_with_the_session(
    make_app: Callable[..., FastAPI], database: Path
) -> None:
    request = session_request(rounds=4, eval_every=0)
    async with http_client(make_app()) as http:
        created = await create_session(http, rounds=4, eval_every=0)
        sid = created["session_id"]
        federation = Federation(http, created, request)
        for p in range(3):
            await federation.run_pass(p)
            # pass p is now the previous pass, p + 1 the current one (no uploads yet)
            assert pass_dirs(database, sid) == [p]
        closed = await http.delete(f"/v1/sessions/{sid}", headers=admin())
        assert closed.status_code == 200
    assert pass_dirs(database, sid) == []


def test_write_and_read_back(tmp_path: Path) -> None:
    files = PayloadFiles.beside(tmp_path / "service.sqlite3")
    sha, slot = bytes(range(32)), Slot("s", 3, 1)
    files.write_share(slot, 2, sha, b"share")
    files.write_sum(slot, b"sum", sync=True)
    assert files.read_share(slot, 2, sha) == b"share"
    assert files.read_sum(slot) == b"sum"
    assert not [p for p in (tmp_path / "service.sqlite3-payloads").rglob(".*")]  # no temporaries
    files.discard("s", before_pass=3)
    assert files.read_sum(slot) == b"sum"
    files.discard("s", before_pass=4)
    assert files.read_sum(slot) is None
    with pytest.raises(FileNotFoundError):
        files.read_share(slot, 2, sha)
