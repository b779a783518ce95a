"""Garbage from a broken or malicious peer: always a 4xx problem document, never a 500, and the
round is not corrupted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    expected_sum,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    session_request,
)

pytestmark = pytest.mark.anyio


class OneClient:
    """Client 0 of a fresh 2-client session (aggregation at layers 1 and 3, L=3)."""

    def __init__(self, http: httpx.AsyncClient, created: dict[str, Any]) -> None:
        self.http = http
        self.sid = created["session_id"]
        self.tokens = created["client_tokens"]

    def url(self, tail: str, m: int = 0) -> str:
        return f"{client_path(self.sid, m)}/{tail}"

    async def put_nodes(
        self, nodes: list[int], *, p: int = 0, layer: int = 1, m: int = 0, **headers: str
    ) -> httpx.Response:
        return await self.http.put(
            self.url(f"passes/{p}/layers/{layer}/nodes", m),
            content=nodes_body(nodes),
            headers={**bearer(self.tokens[m]), **node_headers(np.asarray(nodes)), **headers},
        )

    async def put_matrix(
        self,
        body: bytes,
        shape: str,
        *,
        p: int = 0,
        layer: int = 1,
        m: int = 0,
        encoding: str = "float32",
    ) -> httpx.Response:
        headers = {**bearer(self.tokens[m]), **matrix_headers(0, 0, encoding)}
        headers["X-Glasu-Shape"] = shape
        return await self.http.put(
            self.url(f"passes/{p}/layers/{layer}/embedding", m), content=body, headers=headers
        )

    async def complete_union(self) -> int:
        """Both clients upload node sets for layer 1; returns the union size."""
        await self.put_nodes([1, 2, 3], m=0)
        await self.put_nodes([2, 5], m=1)
        return 4


@pytest.fixture
async def one(client: httpx.AsyncClient) -> AsyncIterator[OneClient]:
    yield OneClient(client, await create_session(client, clients=2))


async def test_node_set_must_be_sorted_unique_and_in_range(one: OneClient) -> None:
    assert_problem(await one.put_nodes([3, 1]), 422, "bad-payload", mentions="sorted")
    assert_problem(await one.put_nodes([1, 1]), 422, "bad-payload", mentions="unique")
    assert_problem(await one.put_nodes([0, 60]), 422, "bad-payload", mentions="num_nodes=60")
    assert_problem(await one.put_nodes([-1, 4]), 422, "bad-payload", mentions="[0, num_nodes")
    # int64 wrap-around must not make an unsorted, out-of-range set look ascending
    assert_problem(
        await one.put_nodes([0, 2**63 - 1, -(2**62), 5]), 422, "bad-payload", mentions="num_nodes"
    )
    # the slot is still free after all of that
    assert (await one.put_nodes([1, 2])).status_code == 201


async def test_node_headers_are_checked(one: OneClient) -> None:
    missing = await one.http.put(
        one.url("passes/0/layers/1/nodes"),
        content=nodes_body([1, 2]),
        headers={**bearer(one.tokens[0]), "Content-Type": "application/octet-stream"},
    )
    assert_problem(missing, 400, "bad-header", mentions="X-Glasu-Shape")
    garbled = await one.put_nodes([1, 2], **{"X-Glasu-Shape": "two"})
    assert_problem(garbled, 400, "bad-header", mentions="'two'")
    wrong_encoding = await one.put_nodes([1, 2], **{"X-Glasu-Encoding": "float32"})
    assert_problem(wrong_encoding, 400, "bad-header", mentions="int64")
    no_encoding = await one.http.put(
        one.url("passes/0/layers/1/nodes"),
        content=nodes_body([1, 2]),
        headers={**bearer(one.tokens[0]), "X-Glasu-Shape": "2"},
    )
    assert_problem(no_encoding, 400, "bad-header", mentions="X-Glasu-Encoding")
    truncated = await one.put_nodes([1, 2], **{"X-Glasu-Shape": "3"})
    assert_problem(truncated, 422, "bad-payload", mentions="needs 24")
    too_many = await one.put_nodes([1, 2], **{"X-Glasu-Shape": "61"})
    assert_problem(too_many, 422, "wrong-shape", mentions="at most num_nodes=60")
    json_body = await one.http.put(
        one.url("passes/0/layers/1/nodes"),
        json=[1, 2],
        headers={**bearer(one.tokens[0]), "X-Glasu-Shape": "2", "X-Glasu-Encoding": "int64"},
    )
    assert_problem(json_body, 415, "unsupported-media-type", mentions="octet-stream")


async def test_embedding_shape_encoding_and_payload(one: OneClient) -> None:
    rows = await one.complete_union()
    good = np.ones((rows, 8), dtype=np.float32)
    assert_problem(
        await one.put_matrix(good.tobytes(), f"{rows + 1},8"),
        422,
        "wrong-shape",
        mentions=f"expects shape {rows},8",
    )
    assert_problem(
        await one.put_matrix(good.tobytes(), f"{rows},9"), 422, "wrong-shape", mentions="width"
    )
    assert_problem(
        await one.put_matrix(good.tobytes()[:-4], f"{rows},8"),
        422,
        "bad-payload",
        mentions="does not match shape",
    )
    nan = good.copy()
    nan[0, 0] = np.nan
    assert_problem(
        await one.put_matrix(nan.tobytes(), f"{rows},8"), 422, "bad-payload", mentions="NaN"
    )
    assert_problem(
        await one.put_matrix(good.tobytes(), f"{rows},8", encoding="ckks"),
        422,
        "wrong-encoding",
        mentions="'float32'",
    )
    assert_problem(
        await one.put_matrix(good.tobytes(), f"{rows}x8"), 400, "bad-header", mentions="rows,cols"
    )
    assert_problem(
        await one.put_matrix(good.tobytes(), f"{rows},8", encoding="rot13"),
        400,
        "bad-header",
        mentions="X-Glasu-Encoding",
    )
    assert (await one.put_matrix(good.tobytes(), f"{rows},8")).status_code == 201


async def test_embedding_before_union_or_lower_layer_is_not_ready(one: OneClient) -> None:
    await one.put_nodes([1, 2, 3])
    early = await one.put_matrix(np.ones((3, 8), np.float32).tobytes(), "3,8")
    assert_problem(early, 409, "not-ready", mentions="node union of pass 0 layer 1")
    rows = len(
        (await one.http.get(one.url("passes/0"), headers=bearer(one.tokens[0]))).json()[
            "output_nodes"
        ]
    )
    top = await one.put_matrix(np.ones((rows, 4), np.float32).tobytes(), f"{rows},4", layer=3)
    assert_problem(top, 409, "not-ready", mentions="sum of layer 1")


async def test_wrong_pass_and_wrong_layer(one: OneClient) -> None:
    assert_problem(await one.put_nodes([1], p=1), 409, "wrong-pass", mentions="current pass 0")
    assert_problem(await one.put_nodes([1], p=99), 404, "wrong-pass", mentions="schedule")
    assert_problem(await one.put_nodes([1], layer=2), 404, "wrong-layer", mentions="[1, 3]")
    assert_problem(await one.put_nodes([1], layer=3), 404, "wrong-layer", mentions="top layer")
    assert_problem(
        await one.put_matrix(b"", "0,8", layer=2), 404, "wrong-layer", mentions="not an aggregation"
    )
    future = await one.http.get(one.url("passes/1/layers/1/nodes"), headers=bearer(one.tokens[0]))
    assert_problem(future, 409, "wrong-pass", mentions="has not started")
    negative = await one.http.get(one.url("passes/-1"), headers=bearer(one.tokens[0]))
    assert_problem(negative, 422, "validation-error", mentions="path.p")
    not_int = await one.http.get(one.url("passes/abc"), headers=bearer(one.tokens[0]))
    assert_problem(not_int, 422, "validation-error", mentions="integer")
    metrics = await one.http.post(
        one.url("passes/3/metrics"), json={"loss": 1.0}, headers=bearer(one.tokens[0])
    )
    assert_problem(metrics, 409, "wrong-pass", mentions="has not started")


async def test_duplicate_upload_is_harmless_and_a_different_body_conflicts(one: OneClient) -> None:
    first = await one.put_nodes([1, 2, 3])
    assert first.status_code == 201 and first.json()["status"] == "created"
    again = await one.put_nodes([1, 2, 3])
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert again.json()["received"] == [0] and again.json()["missing"] == [1]
    assert_problem(await one.put_nodes([1, 2, 4]), 409, "conflict", mentions="different")

    await one.put_nodes([2, 5], m=1)
    share = np.arange(32, dtype=np.float32).reshape(4, 8)
    assert (await one.put_matrix(share.tobytes(), "4,8")).status_code == 201
    assert (await one.put_matrix(share.tobytes(), "4,8")).status_code == 200
    assert_problem(await one.put_matrix((share + 1).tobytes(), "4,8"), 409, "conflict")
    other = np.ones((4, 8), dtype=np.float32)
    assert (await one.put_matrix(other.tobytes(), "4,8", m=1)).status_code == 201
    total = await one.http.get(
        one.url("passes/0/layers/1/aggregate"), headers=bearer(one.tokens[0])
    )
    assert (
        np.frombuffer(total.content, np.float32).reshape(4, 8).tolist()
        == expected_sum({0: share, 1: other}).tolist()
    )


async def test_bad_session_requests_say_which_field(client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"clients": 0}, "body.clients"),
        ({"clients": 65}, "body.clients"),
        ({"layers": 17}, "body.layers"),
        ({"agg_layers": []}, "body.agg_layers"),
        ({"agg_layers": [{"layer": 3, "width": 4}, {"layer": 1, "width": 4}]}, "ascending"),
        ({"agg_layers": [{"layer": 1, "width": 4}, {"layer": 4, "width": 4}]}, "above the top"),
        ({"agg_layers": [{"layer": 1, "width": 5000}]}, "body.agg_layers.0.width"),
        ({"stale": 0}, "body.stale"),
        ({"rounds": 0}, "body.rounds"),
        ({"eval_every": -1}, "body.eval_every"),
        ({"batch_size": 0}, "body.batch_size"),
        ({"train_nodes": []}, "body.train_nodes"),
        ({"train_nodes": [1, 1]}, "distinct"),
        ({"train_nodes": [1, 60]}, "train_nodes must lie in [0, num_nodes=60)"),
        ({"eval_nodes": []}, "body.eval_nodes"),
        ({"eval_nodes": [-1]}, "eval_nodes must lie"),
        ({"seed": -1}, "body.seed"),
        ({"encryption": "rsa"}, "body.encryption"),
        ({"surprise": 1}, "body.surprise"),
        ({"privacy": {"delta": 1e-5, "clip": 1}}, "noise_multiplier"),
        ({"privacy": {"noise_multiplier": 1, "delta": 2, "clip": 1}}, "delta"),
    ]
    for overrides, mentions in cases:
        response = await client.post(
            "/v1/sessions", json=session_request(**overrides), headers=admin()
        )
        assert_problem(response, 422, "validation-error", mentions=mentions)
        assert response.json()["errors"], response.json()
    garbled = await client.post(
        "/v1/sessions",
        content=b"{not json",
        headers={**admin(), "Content-Type": "application/json"},
    )
    assert_problem(garbled, 422, "validation-error", mentions="json")


async def test_bad_metrics_are_rejected(one: OneClient) -> None:
    for body, mentions in [
        ({"val_accuracy": 1.5}, "val_accuracy"),
        (b'{"loss": NaN}', "finite"),  # Python's json writes NaN; it is not a number here
        (b'{"loss": 1e999}', "finite"),
        ({"loss": "1.5"}, "valid number"),  # no coercion from strings: the contract is JSON types
        ({"unknown": 1}, "unknown"),
    ]:
        response = await one.http.post(
            one.url("passes/0/metrics"),
            **({"content": body} if isinstance(body, bytes) else {"json": body}),
            headers={**bearer(one.tokens[0]), "Content-Type": "application/json"},
        )
        assert_problem(response, 422, "validation-error", mentions=mentions)
    empty = await one.http.post(one.url("passes/0/metrics"), json={}, headers=bearer(one.tokens[0]))
    assert empty.status_code == 204


async def test_unknown_route_and_method_are_problems(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v2/nothing"), 404, "not-found", mentions="/v2/nothing")
    assert_problem(await client.patch("/v1/sessions", headers=admin()), 405, "method-not-allowed")


async def test_last_resort_handler_still_answers_problem_json(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app()

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("bug")

    async with http_client(app, raise_app_exceptions=False) as http:
        response = await http.get("/boom")
    assert_problem(response, 500, "internal-error", mentions="logged")
    assert "bug" not in response.text


async def test_a_nul_in_an_id_or_a_label_gets_the_same_answer_on_both_databases(
    client: httpx.AsyncClient,
) -> None:
    """PostgreSQL's text cannot hold NUL: an id holding one names nothing (404, as on SQLite),
    and a label holding one is refused (422), on both databases."""
    session = await create_session(client)
    sid, token = session["session_id"], session["client_tokens"][0]
    aligned = await client.post("/v1/alignments", json={"parties": 2}, headers=admin())
    aid, party_token = aligned.json()["alignment_id"], aligned.json()["party_tokens"][0]
    sid_nul, aid_nul = f"{sid}%00", f"{aid[:8]}%00{aid[8:]}"
    session_missing = [
        await client.get(f"/v1/sessions/{sid_nul}", headers=admin()),
        await client.get(f"/v1/sessions/{sid_nul}/privacy", headers=bearer(token)),
        await client.delete(f"/v1/sessions/{sid_nul}", headers=admin()),
        await client.get(f"/v1/sessions?after={sid_nul}", headers=admin()),
        await client.get("/v1/sessions?after=%00", headers=admin()),
        await client.get(f"{client_path(sid_nul, 0)}/passes/0", headers=bearer(token)),
    ]
    for response in session_missing:
        assert_problem(response, 404, "session-not-found")
    alignment_missing = [
        await client.get(f"/v1/alignments/{aid_nul}", headers=admin()),
        await client.get(f"/v1/alignments/{aid_nul}", headers=bearer(party_token)),
        await client.get(
            f"/v1/alignments/{aid_nul}/parties/0/positions", headers=bearer(party_token)
        ),
    ]
    for response in alignment_missing:
        assert_problem(response, 404, "alignment-not-found")
    labelled_alignment = await client.post(
        "/v1/alignments", json={"parties": 2, "label": "bank\x00insurer"}, headers=admin()
    )
    assert_problem(labelled_alignment, 422, "validation-error", mentions="label")
    labelled_session = await client.post(
        "/v1/sessions", json=session_request(label="cora\x00demo"), headers=admin()
    )
    assert_problem(labelled_session, 422, "validation-error", mentions="label")
