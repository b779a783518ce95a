"""Shares and sums in parts: a layer's rows travel in parts of ``part_rows(cols)`` rows (query
parameters ``part`` and ``parts``), the service checks each part against ``part_span`` and sums
part by part (a part's sum is served as soon as every client's part is in, while the layer's
other parts are still missing); evaluation passes exchange no node sets and have a row per
aligned node at every layer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    Federation,
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    session_request,
)

from secure import ckks
from secure.protocol import part_count, part_span

pytestmark = pytest.mark.anyio

NUM_NODES = 300
WIDTH = 4096  # part_rows(4096) = 256: an evaluation pass's layer 1 travels in 2 parts
# one aggregation layer; pass 0 trains, pass 1 evaluates
WIDE = {
    "agg_layers": [{"layer": 1, "width": WIDTH}],
    "num_nodes": NUM_NODES,
    "rounds": 1,
    "eval_every": 0,
}


async def put_share(
    http: httpx.AsyncClient,
    created: dict[str, Any],
    m: int,
    p: int,
    layer: int,
    body: bytes,
    shape: tuple[int, int],
    *,
    encoding: str = "float32",
    **query: int,
) -> httpx.Response:
    return await http.put(
        f"{client_path(created['session_id'], m)}/passes/{p}/layers/{layer}/embedding",
        params=query,
        content=body,
        headers={**bearer(created["client_tokens"][m]), **matrix_headers(*shape, encoding)},
    )


async def get_sum(
    http: httpx.AsyncClient, created: dict[str, Any], m: int, p: int, layer: int, **query: float
) -> httpx.Response:
    return await http.get(
        f"{client_path(created['session_id'], m)}/passes/{p}/layers/{layer}/aggregate",
        params={"wait": 0, **query},
        headers=bearer(created["client_tokens"][m]),
    )


async def train_first_pass(
    http: httpx.AsyncClient, created: dict[str, Any], share: bytes | None = None, **encoding: str
) -> None:
    """Pass 0 (training): node sets, then one-part shares of the union's 4 rows (``share``;
    float32 zeros if None)."""
    clients = range(len(created["client_tokens"]))
    nodes = np.arange(4)
    for m in clients:
        response = await http.put(
            f"{client_path(created['session_id'], m)}/passes/0/layers/1/nodes",
            content=nodes_body(nodes),
            headers={**bearer(created["client_tokens"][m]), **node_headers(nodes)},
        )
        assert response.status_code == 201, response.text
    if share is None:
        share = np.zeros((4, WIDTH), dtype="<f4").tobytes()
    for m in clients:
        response = await put_share(http, created, m, 0, 1, share, (4, WIDTH), **encoding)
        assert response.status_code == 201, response.text


async def put_part(
    http: httpx.AsyncClient,
    created: dict[str, Any],
    shares: list[np.ndarray],
    spans: list[tuple[int, int]],
    part: int,
) -> None:
    """Every client's part ``part`` of its share of pass 1, layer 1."""
    start, stop = spans[part]
    for m, share in enumerate(shares):
        receipt = await put_share(
            http, created, m, 1, 1, share[start:stop].tobytes(), (stop - start, WIDTH),
            part=part, parts=len(spans),
        )  # fmt: skip
        assert receipt.status_code == 201, receipt.text


async def test_a_layer_of_two_parts_is_summed_part_by_part(
    make_app: Callable[..., FastAPI],
) -> None:
    async with http_client(make_app()) as http:
        created = await create_session(http, **WIDE)
        await train_first_pass(http, created)
        rng = np.random.default_rng(5)
        shares = [rng.standard_normal((NUM_NODES, WIDTH)).astype("<f4") for _ in range(3)]
        parts = part_count(NUM_NODES, WIDTH)
        assert parts == 2
        spans = [part_span(k, rows=NUM_NODES, cols=WIDTH) for k in range(parts)]
        assert spans == [(0, 256), (256, NUM_NODES)]
        await put_part(http, created, shares, spans, 0)
        # part 0 is summed at once, while nobody has sent part 1 yet
        first = await get_sum(http, created, 0, 1, 1, part=0)
        assert first.status_code == 200, first.text
        assert first.headers["X-Glasu-Shape"] == f"256,{WIDTH}"
        assert first.headers["X-Glasu-Count"] == "3"
        waiting = await get_sum(http, created, 0, 1, 1, part=1)
        assert waiting.status_code == 202 and waiting.json()["missing"] == [0, 1, 2]
        sid = created["session_id"]
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        (layer,) = status["progress"]["layers"]
        assert status["current_pass"] == 1 and status["progress"]["kind"] == "eval"
        assert layer["rows"] == NUM_NODES and layer["nodes_received"] is None
        assert layer["embeddings_received"] == [] and not layer["aggregated"]
        await put_part(http, created, shares, spans, 1)
        second = await get_sum(http, created, 2, 1, 1, part=1)
        assert second.status_code == 200 and second.headers["X-Glasu-Shape"] == f"44,{WIDTH}"
        summed = np.concatenate(
            [np.frombuffer(r.content, "<f4").reshape(-1, WIDTH) for r in (first, second)]
        )
        np.testing.assert_allclose(summed, sum(shares), rtol=1e-5, atol=1e-5)
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["state"] == "finished" and status["current_pass"] == 2


async def test_a_part_that_does_not_fit_its_layer_is_refused(
    make_app: Callable[..., FastAPI],
) -> None:
    async with http_client(make_app()) as http:
        created = await create_session(http, **WIDE)
        # an evaluation pass exchanges no node sets
        await train_first_pass(http, created)
        nodes = np.arange(3)
        eval_nodes = await http.put(
            f"{client_path(created['session_id'], 0)}/passes/1/layers/1/nodes",
            content=nodes_body(nodes),
            headers={**bearer(created["client_tokens"][0]), **node_headers(nodes)},
        )
        assert_problem(eval_nodes, 404, "wrong-layer", mentions="exchanges no node sets")
        part = np.zeros((256, WIDTH), dtype="<f4").tobytes()
        whole = np.zeros((NUM_NODES, WIDTH), dtype="<f4").tobytes()
        as_one = await put_share(http, created, 0, 1, 1, whole, (NUM_NODES, WIDTH))
        assert_problem(as_one, 422, "wrong-part", mentions="travels in 2 part(s)")
        wrong_count = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=0, parts=3)
        assert_problem(wrong_count, 422, "wrong-part", mentions="parts=3")
        past_end = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=2, parts=2)
        assert_problem(past_end, 422, "wrong-part", mentions="parts 0..1, not part 2")
        # part 1 holds rows 256..299: 44 rows, not 256
        wrong_rows = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=1, parts=2)
        assert_problem(wrong_rows, 422, "wrong-shape", mentions="rows 256..299 (part 1)")
        negative = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=-1, parts=2)
        assert_problem(negative, 422, "validation-error")
        no_parts = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=0, parts=0)
        assert_problem(no_parts, 422, "validation-error")
        assert_problem(await get_sum(http, created, 0, 1, 1, part=2), 422, "wrong-part")
        # a part is a slot of its own: written once, repeated identically
        first = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=0, parts=2)
        again = await put_share(http, created, 0, 1, 1, part, (256, WIDTH), part=0, parts=2)
        assert (first.status_code, again.status_code) == (201, 200)
        other = np.ones((256, WIDTH), dtype="<f4").tobytes()
        conflict = await put_share(http, created, 0, 1, 1, other, (256, WIDTH), part=0, parts=2)
        assert_problem(conflict, 409, "conflict")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ckks.generate_keys(tmp_path_factory.mktemp("keys"))


async def test_an_encrypted_layer_larger_than_the_body_limit_travels_in_parts(
    make_app: Callable[..., FastAPI], keys: tuple[Path, Path]
) -> None:
    """Real CKKS: each client's layer (300 x 4096 values, 7.3 MiB encrypted) is more than the
    service takes in one body here (7 MiB); the session's parts, which the service sized to
    that limit and states in its description, are not, and their sums decrypt to the sum of
    the shares."""
    secret, public = keys
    limit = 7 * 2**20
    app = make_app(public_context=public, max_body_bytes=limit)
    codec = ckks.CkksCodec.from_file(secret)
    async with http_client(app) as http:
        created = await create_session(http, clients=2, encryption="ckks", **WIDE)
        described = await http.get(f"/v1/sessions/{created['session_id']}", headers=admin())
        assert described.json()["max_body_bytes"] == limit
        part_values = described.json()["config"]["part_values"]
        assert part_count(NUM_NODES, WIDTH, part_values) == 2
        small = codec.encode(np.zeros((4, WIDTH)))
        await train_first_pass(http, created, small, encoding="ckks")
        rng = np.random.default_rng(3)
        shares = [rng.uniform(-1, 1, size=(NUM_NODES, WIDTH)) for _ in range(2)]
        whole = codec.encode(shares[0])
        assert len(whole) > limit
        too_large = await put_share(
            http, created, 0, 1, 1, whole, (NUM_NODES, WIDTH), encoding="ckks"
        )
        assert_problem(too_large, 413, "payload-too-large")
        summed = []
        for part in range(2):
            start, stop = part_span(part, rows=NUM_NODES, cols=WIDTH, part_values=part_values)
            for m, share in enumerate(shares):
                body = codec.encode(share[start:stop])
                assert len(body) < limit
                response = await put_share(
                    http, created, m, 1, 1, body, (stop - start, WIDTH), encoding="ckks",
                    part=part, parts=2,
                )  # fmt: skip
                assert response.status_code == 201, response.text
            total = await get_sum(http, created, 1, 1, 1, part=part)
            assert total.status_code == 200, total.text
            summed.append(codec.decode_sum(total.content, rows=stop - start, cols=WIDTH))
        np.testing.assert_allclose(np.concatenate(summed), shares[0] + shares[1], atol=1e-3)


async def test_the_federation_runs_an_evaluation_pass_in_parts(
    make_app: Callable[..., FastAPI],
) -> None:
    """The simulated clients of the other tests, through a session whose evaluation passes'
    layer 1 needs two parts: every client gets the sum of all shares, part by part."""
    request = session_request(**WIDE)
    async with http_client(make_app()) as http:
        created = await create_session(http, **WIDE)
        federation = Federation(http, created, request)
        await federation.run_pass(0)
        record = await federation.run_pass(1)
        assert record.info["kind"] == "eval" and not record.node_sets
        total = sum(record.shares[1].values())
        for m in range(3):
            np.testing.assert_allclose(record.sums[1][m], total, rtol=1e-5, atol=1e-5)
        assert record.counts[1] == {3}
