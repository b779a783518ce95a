"""A download that finds every share in but no sum neither waits for nor redoes a sum that another
request is forming (service/rounds/sums.py); once the slot is free it stores the sum itself, from
the shares' files, which is what happens after a restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    bearer,
    client_path,
    create_session,
    database_sql,
    expected_sum,
    http_client,
    matrix_headers,
)

from service.app import service_context
from service.notify import Pending
from service.rounds import Caller, Payload
from service.store import Slot

pytestmark = pytest.mark.anyio


@pytest.mark.sqlite_only  # the in-memory slot lock; a shared store: tests/service/test_replicas.py
async def test_a_download_leaves_a_sum_in_progress_alone(
    make_app: Callable[..., FastAPI], database: Path
) -> None:
    first = make_app()
    async with http_client(first) as http:
        created = await create_session(http, clients=2, agg_layers=[{"layer": 3, "width": 2}])
        sid, tokens = created["session_id"], created["client_tokens"]
        shares = {m: np.full((5, 2), m + 0.5, dtype=np.float32) for m in range(2)}
        for m, share in shares.items():
            put = await http.put(
                f"{client_path(sid, m)}/passes/0/layers/3/embedding",
                content=share.tobytes(),
                headers={**bearer(tokens[m]), **matrix_headers(5, 2)},
            )
            assert put.status_code == 201, put.text
    service_context(first).close()
    database_sql(  # both shares acknowledged, the sum never stored
        database,
        "DELETE FROM results WHERE kind = 'aggregate'",
        "UPDATE sessions SET current_pass = 0",
    )

    restarted = service_context(make_app())
    engine, caller = restarted.engine, Caller(sid, 0)
    with restarted.store.transaction() as tx:
        _, plan = engine.session(tx, sid)
    # another request holds the slot
    with engine.sums.forming(plan, Slot(sid, 0, 3), rows=5, cols=2):
        waiting = engine.downloads.get("sum", caller, 0, 3)
    assert isinstance(waiting, Pending) and waiting.missing == []
    total = engine.downloads.get("sum", caller, 0, 3)
    assert isinstance(total, Payload) and total.count == 2
    np.testing.assert_array_equal(
        np.frombuffer(total.body, dtype="<f4").reshape(5, 2), expected_sum(shares)
    )
