"""Sessions with masked secure aggregation (``secure_aggregation: "masks"``): the service, which
holds no key of them, adds the workers' masked BFV shares; what it refuses to create."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    matrix_headers,
    session_request,
)

from secure.aggregation import ShareSlot, to_grid
from tests.support.masking import masked_codecs

MASKED = {"encryption": "ckks", "secure_aggregation": "masks"}


@pytest.mark.anyio
async def test_a_service_without_keys_adds_masked_shares(make_app: Callable[..., FastAPI]) -> None:
    async with http_client(make_app()) as http:  # no --public-context: masks need none
        created = await create_session(http, agg_layers=[{"layer": 3, "width": 3}], **MASKED)
        sid, tokens = created["session_id"], created["client_tokens"]
        config = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()["config"]
        assert (config["secure_aggregation"], config["encoding"]) == ("masks", "bfv-masked")
        info = await http.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[0]))
        rows = len(info.json()["output_nodes"])
        codecs = masked_codecs(3, session=sid)
        rng = np.random.default_rng(0)
        shares = [to_grid(rng.uniform(-1, 1, size=(rows, 3))) for _ in range(3)]
        url = "passes/0/layers/3/embedding"
        ckks_share = await http.put(
            f"{client_path(sid, 0)}/{url}",
            content=b"GLCK" + b"\0" * 40,
            headers={**bearer(tokens[0]), **matrix_headers(rows, 3, "ckks")},
        )
        assert_problem(ckks_share, 422, "wrong-encoding", mentions="'bfv-masked'")
        slot = ShareSlot(pass_index=0, layer=3, part=0)
        for m, share in enumerate(shares):
            response = await http.put(
                f"{client_path(sid, m)}/{url}",
                content=codecs[m].encode(share, slot=slot),
                headers={**bearer(tokens[m]), **matrix_headers(rows, 3, "bfv-masked")},
            )
            assert response.status_code == 201, response.text
        total = await http.get(
            f"{client_path(sid, 2)}/passes/0/layers/3/aggregate", headers=bearer(tokens[2])
        )
        assert total.status_code == 200 and total.headers["X-Glasu-Count"] == "3"
        decoded = codecs[2].decode_sum(total.content, rows=rows, cols=3)
        np.testing.assert_array_equal(decoded, np.sum(shares, axis=0).astype(np.float32))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"clients": 2}, "needs 3 clients or more"),
        ({"encryption": "none"}, "needs encryption"),
        (
            {
                "stragglers": "continue",
                "privacy": {"epsilon": 4, "delta": 1e-5, "clip": 1.0, "split_noise": True},
            },
            "needs unsplit noise",
        ),
        ({"clients": 17}, "at most 16 clients"),
    ],
)
async def test_masked_sessions_it_cannot_run_are_refused(
    make_app: Callable[..., FastAPI], changes: dict, says: str
) -> None:
    async with http_client(make_app()) as http:
        response = await http.post(
            "/v1/sessions", json=session_request(**{**MASKED, **changes}), headers=admin()
        )
    assert_problem(response, 422, "validation-error", mentions=says)
