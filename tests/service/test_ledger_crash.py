"""The served process dies right after a release's ledger row commits: the ledger keeps it.

The fault is injected without any hook in the service's code: the served process is started
with ``python -c BOOTSTRAP serve ...`` instead of ``python -m clients.cli.main serve ...``, and
BOOTSTRAP, before calling the same ``clients.cli.main.main``, wraps two methods of
``service.store``: ``Transaction.append_ledger`` marks its transaction, and ``Store.transaction``
calls ``os._exit(137)`` (no cleanup, no response: what a SIGKILL does) as soon as a marked
transaction's ``COMMIT`` has returned. That is the moment between "the release is counted" and
"the release is served": the sum that completes the release is stored, the upload that completed
it gets no answer. Everything else (uvicorn, the routes, the round engine, SQLite on a file) is
the real service.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_testkit import (
    FLOAT32_LE,
    INT64_LE,
    Federation,
    ServedProcess,
    admin,
    bearer,
    client_path,
    matrix_headers,
    node_headers,
    nodes_body,
    private_session_request,
    start_serve,
)

pytestmark = pytest.mark.anyio

KILLED = 137

BOOTSTRAP = """\
import contextlib, os, sys

from service import store

_append_ledger = store.Transaction.append_ledger
_transaction = store.Store.transaction


def append_ledger(self, *args, **kwargs):
    _append_ledger(self, *args, **kwargs)
    self.test_crash_after_commit = True


@contextlib.contextmanager
def transaction(self, *args, **kwargs):
    with _transaction(self, *args, **kwargs) as tx:
        yield tx
    if getattr(tx, "test_crash_after_commit", False):
        os._exit(137)  # the ledger row is committed; nothing has been answered yet


store.Transaction.append_ledger = append_ledger
store.Store.transaction = transaction

from clients.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[ServedProcess]]:
    """The processes a test starts; stopped at the end whatever happened."""
    processes: list[ServedProcess] = []
    yield processes
    for process in processes:
        process.stop()


async def test_a_release_committed_before_a_crash_stays_on_the_ledger(
    tmp_path: Path, served: list[ServedProcess]
) -> None:
    """Kill the service right after the ledger row of pass 0's release commits and before the
    upload that completed the release is answered; restart it on the same database: the release
    is on the ledger, its sum is served, and the session goes on to the end.

    What this shows is the order (ledger row committed, then served) and that a dead process
    loses nothing committed. A power loss cannot be simulated here: a process that dies leaves
    its writes in the OS page cache, so this test would pass under synchronous=NORMAL too. What
    covers a power loss is that the transaction appending the ledger commits under
    synchronous=FULL (service/store/, checked by test_persistence.py): its COMMIT returns only
    once the WAL is synced to disk, so a release is never served before its row is on the disk.
    """
    database = tmp_path / "service.sqlite3"
    crashing = start_serve(tmp_path, database, name="crashing", bootstrap=BOOTSTRAP)
    served.append(crashing)
    crashing.wait_healthy()
    request = private_session_request(
        {"delta": 1e-5, "clip": 1.0, "occurrence_cap": 0, "noise_multiplier": 2.0},
        clients=2,
        layers=2,
        rounds=2,
        eval_every=0,
    )
    created = httpx.post(f"{crashing.url}/v1/sessions", json=request, headers=admin(), timeout=60)
    assert created.status_code == 201, created.text
    sid, tokens = created.json()["session_id"], created.json()["client_tokens"]
    passes_total = created.json()["passes_total"]
    assert passes_total == 3  # two training rounds and the final evaluation

    # Pass 0: node sets at layer 1 (below the top layer 2), then the two shares of the release.
    with httpx.Client(base_url=crashing.url, timeout=30) as http:
        for m, nodes in enumerate([[1, 4], [4, 7]]):
            put = http.put(
                f"{client_path(sid, m)}/passes/0/layers/1/nodes",
                content=nodes_body(nodes),
                headers={**bearer(tokens[m]), **node_headers(np.asarray(nodes))},
            )
            assert put.status_code == 201, put.text
        shares = [np.full((3, 8), v, dtype=FLOAT32_LE) for v in (0.25, 2.0)]
        put = http.put(
            f"{client_path(sid, 0)}/passes/0/layers/1/embedding",
            content=shares[0].tobytes(),
            headers={**bearer(tokens[0]), **matrix_headers(3, 8)},
        )
        assert put.status_code == 201, put.text
        # The last share completes the release: the service sums, commits the ledger row, dies.
        with pytest.raises(httpx.TransportError):
            http.put(
                f"{client_path(sid, 1)}/passes/0/layers/1/embedding",
                content=shares[1].tobytes(),
                headers={**bearer(tokens[1]), **matrix_headers(3, 8)},
            )
    assert crashing.process.wait(timeout=30) == KILLED, crashing.log_text()
    with sqlite3.connect(database) as db:  # read by SQLite itself, as a restart will
        rows = db.execute("SELECT release_index, pass_index FROM privacy_ledger").fetchall()
    assert rows == [(1, 0)]

    restarted = start_serve(tmp_path, database, name="restarted")
    served.append(restarted)
    restarted.wait_healthy()
    async with httpx.AsyncClient(base_url=restarted.url, timeout=60) as http:
        report = (await http.get(f"/v1/sessions/{sid}/privacy", headers=admin())).json()
        assert report["releases"] == 1
        assert [entry["pass"] for entry in report["ledger"]] == [0]
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert (status["state"], status["current_pass"]) == ("running", 1)

        # The counted release is served after the restart, to both clients.
        for m in (0, 1):
            total = await http.get(
                f"{client_path(sid, m)}/passes/0/layers/1/aggregate", headers=bearer(tokens[m])
            )
            assert total.status_code == 200, total.text
            assert total.headers["X-Glasu-Count"] == "2"
            np.testing.assert_array_equal(
                np.frombuffer(total.content, dtype=FLOAT32_LE).reshape(3, 8), shares[0] + shares[1]
            )
        union = await http.get(
            f"{client_path(sid, 1)}/passes/0/layers/1/nodes", headers=bearer(tokens[1])
        )
        assert np.frombuffer(union.content, dtype=INT64_LE).tolist() == [1, 4, 7]
        # Client 1 never got its answer; its retry is a harmless duplicate.
        retry = await http.put(
            f"{client_path(sid, 1)}/passes/0/layers/1/embedding",
            content=shares[1].tobytes(),
            headers={**bearer(tokens[1]), **matrix_headers(3, 8)},
        )
        assert retry.status_code == 200 and retry.json()["status"] == "duplicate"

        # The session goes on: one release per remaining pass, none counted twice.
        federation = Federation(http, created.json(), request)
        for p in range(1, passes_total):
            await federation.run_pass(p)
        report = (await http.get(f"/v1/sessions/{sid}/privacy", headers=admin())).json()
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["state"] == "finished"
    assert report["releases"] == passes_total
    assert [entry["pass"] for entry in report["ledger"]] == list(range(passes_total))
