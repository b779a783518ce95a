"""A label holder's session (GLASU Appendix B.2) at the service: every training pass gains an
exchange at layer L + 1 (the holder's gradient for the top layer, summed with the others' zero
shares), which completes the pass; evaluation passes have none."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from service_testkit import (
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    matrix_headers,
    node_headers,
    nodes_body,
    session_request,
)

pytestmark = pytest.mark.anyio


async def test_the_label_holder_must_be_a_client_and_see_the_top_layer(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/sessions", json=session_request(label_holder=3), headers=admin()
    )
    assert_problem(response, 422, "validation-error", mentions="not a client")
    response = await client.post(
        "/v1/sessions",
        json=session_request(label_holder=0, agg_layers=[{"layer": 1, "width": 8}]),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="top layer")


async def exchange(
    client: httpx.AsyncClient, created: dict, pass_index: int, layer: int, shares: list
) -> np.ndarray:
    sid, tokens = created["session_id"], created["client_tokens"]
    for m, share in enumerate(shares):
        response = await client.put(
            f"{client_path(sid, m)}/passes/{pass_index}/layers/{layer}/embedding",
            content=share.astype("<f4").tobytes(),
            headers={**matrix_headers(*share.shape), **bearer(tokens[m])},
        )
        assert response.status_code == 201, response.text
    response = await client.get(
        f"{client_path(sid, 0)}/passes/{pass_index}/layers/{layer}/aggregate",
        params={"wait": 5},
        headers=bearer(tokens[0]),
    )
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content, "<f4").reshape(shares[0].shape)


async def test_the_gradient_exchange_completes_a_training_pass_only(
    client: httpx.AsyncClient,
) -> None:
    created = await create_session(client, label_holder=0)
    sid, tokens = created["session_id"], created["client_tokens"]
    passes = []
    for p in range(created["passes_total"]):
        info = await client.get(f"{client_path(sid, 0)}/passes/{p}", headers=bearer(tokens[0]))
        passes.append(info.json())
    train = next(p for p in passes if p["kind"] == "train")
    rows = len(train["output_nodes"])
    nodes = np.arange(10)
    for m in range(3):
        response = await client.put(
            f"{client_path(sid, m)}/passes/{train['pass']}/layers/1/nodes",
            content=nodes_body(nodes),
            headers={**node_headers(nodes), **bearer(tokens[m])},
        )
        assert response.status_code == 201
    await exchange(client, created, train["pass"], 1, [np.ones((10, 8))] * 3)
    await exchange(client, created, train["pass"], 3, [np.ones((rows, 4))] * 3)
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["current_pass"] == train["pass"]  # the gradient is still to come
    gradient = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 8
    zeros = np.zeros((rows, 4))
    total = await exchange(client, created, train["pass"], 4, [gradient, zeros, zeros])
    np.testing.assert_array_equal(total, gradient)  # every client gets the holder's gradient
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["current_pass"] == train["pass"] + 1
    response = await client.put(
        f"{client_path(sid, 0)}/passes/{train['pass'] + 1}/layers/4/nodes",
        content=nodes_body(nodes),
        headers={**node_headers(nodes), **bearer(tokens[0])},
    )
    assert_problem(response, 404, "wrong-layer", mentions="top layer")
    evaluation = next(p for p in passes if p["kind"] == "eval")
    response = await client.put(
        f"{client_path(sid, 0)}/passes/{evaluation['pass']}/layers/4/embedding",
        content=zeros.astype("<f4").tobytes(),
        headers={**matrix_headers(rows, 4), **bearer(tokens[0])},
    )
    assert_problem(response, 404, "wrong-layer", mentions="evaluation pass")
