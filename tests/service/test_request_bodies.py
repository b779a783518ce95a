"""Request bodies under hostile traffic: no byte is read before the caller is authenticated (and
allowed on the route), each route bounds its body and JSON nesting, JSON is parsed off the event
loop, and large bodies share a byte budget."""

from __future__ import annotations

import asyncio
import json
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
    http_client,
    matrix_headers,
    node_headers,
    session_request,
)
from starlette.types import Message, Receive, Scope, Send

from service.app import service_context

pytestmark = pytest.mark.anyio

BIG = 8 * 2**20


class CountingBodyReads:
    """The app, counting the body messages it receives before its answer starts."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.reads = 0
        self.answered = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            self.reads += message["type"] == "http.request" and not self.answered
            return message

        async def answer(message: Message) -> None:
            self.answered = self.answered or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted, answer)


def _body_routes(sid: str, aid: str) -> list[tuple[str, str, dict[str, str]]]:
    """Every route that takes a body, with the headers its body would come with."""
    json_type = {"Content-Type": "application/json"}
    octets = {"Content-Type": "application/octet-stream"}
    return [
        ("POST", "/v1/sessions", json_type),
        ("POST", "/v1/alignments", json_type),
        ("POST", f"{client_path(sid, 0)}/passes/0/metrics", json_type),
        ("PUT", f"{client_path(sid, 0)}/passes/0/layers/1/nodes", node_headers(np.arange(3))),
        ("PUT", f"{client_path(sid, 0)}/passes/0/layers/1/embedding", matrix_headers(3, 8)),
        ("PUT", f"/v1/alignments/{aid}/parties/0/sets/0/hops/0", octets),
    ]


async def test_a_refused_caller_never_has_its_body_read(make_app: Callable[..., FastAPI]) -> None:
    """401 (no token, an unknown one) and 403 (a token not allowed there) before the first
    body byte is read, and the connection is closed (once the rest of the body is discarded:
    test_haproxy.py)."""
    app = make_app()
    counting = CountingBodyReads(app)
    async with http_client(counting) as http:  # type: ignore[arg-type]
        created, other = await create_session(http), await create_session(http)
        alignments = [
            (await http.post("/v1/alignments", json={"parties": 2}, headers=admin())).json()
            for _ in range(2)
        ]
        sid, aid = created["session_id"], alignments[0]["alignment_id"]
        for method, url, headers in _body_routes(sid, aid):
            # a token of this kind, of another session or alignment
            elsewhere = other["client_tokens"][0]
            if url.startswith("/v1/alignments/"):
                elsewhere = alignments[1]["party_tokens"][0]
            refusals = [
                ({}, 401),
                (bearer("not-a-token-0123456789"), 401),
                (bearer(elsewhere), 403),
            ]
            for auth, status in refusals:
                counting.reads, counting.answered = 0, False
                response = await http.request(
                    method, url, content=b"[" * BIG, headers={**headers, **auth}
                )
                assert response.status_code == status, (method, url, response.text)
                assert counting.reads == 0, (method, url, auth)
                assert response.headers["connection"] == "close", (method, url)


async def test_json_bodies_are_bounded_per_route(make_app: Callable[..., FastAPI]) -> None:
    async with http_client(make_app(max_json_bytes=2**20)) as http:
        created = await create_session(http)
        token = created["client_tokens"][0]
        padding = "x" * 70_000  # over the 64 KiB of a control route
        alignment = await http.post(
            "/v1/alignments", json={"parties": 2, "label": padding}, headers=admin()
        )
        assert_problem(alignment, 413, "payload-too-large", mentions="65536 bytes")
        metrics = await http.post(
            f"{client_path(created['session_id'], 0)}/passes/0/metrics",
            json={"loss": 1.0, "padding": padding},
            headers=bearer(token),
        )
        assert_problem(metrics, 413, "payload-too-large", mentions="65536 bytes")
        # a session's node lists may take GLASU_MAX_JSON_BYTES
        many = session_request(num_nodes=200_000, train_nodes=list(range(100_000, 200_000)))
        assert len(json.dumps(many)) > 600_000
        assert (await http.post("/v1/sessions", json=many, headers=admin())).status_code == 201
        more = session_request(num_nodes=400_000, train_nodes=list(range(200_000, 400_000)))
        refused = await http.post("/v1/sessions", json=more, headers=admin())
        assert_problem(refused, 413, "payload-too-large", mentions="GLASU_MAX_JSON_BYTES")


async def test_json_nested_too_deep_is_refused_before_parsing(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, **kw: (parsed.append(1), loads(text, **kw))[1])
    nested = {"clients": [[[[[[[[[3]]]]]]]]]}  # 10 levels
    response = await client.post("/v1/sessions", json=nested, headers=admin())
    assert parsed == []  # (reading the answer below parses it)
    assert_problem(response, 413, "payload-too-large", mentions="nests 10 levels")
    # brackets inside strings do not count
    parsed.clear()
    label = '[[[[[[[[[[ {{{{{{{{{{ \\" ]]'
    created = await client.post("/v1/sessions", json=session_request(label=label), headers=admin())
    assert created.status_code == 201 and parsed == [1]  # parsed once checked


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"", 0),
        (b"3", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": [[]]}]}', 5),
        (b'["[[[[", "]]"]', 1),
        (b'["\\"[[[", "\\\\", [["\\\\\\"]"]]]', 3),  # escaped quotes and backslashes
    ],
)
def test_json_depth_skips_strings(text: bytes, depth: int) -> None:
    from service.api.body import json_depth

    assert json_depth(text) == depth


def test_json_depth_matches_the_parser_across_blocks() -> None:
    """A document longer than one block of the scan, strings crossing the boundaries."""
    from service.api.body import json_depth

    rng = np.random.default_rng(3)
    for _ in range(5):
        depth = int(rng.integers(1, 12))
        leaf = ['x"\\[{' * int(rng.integers(1, 4)), [1, 2], {"k": "]}"}]
        document: Any = leaf
        for _ in range(depth - 1):
            document = {"a": ["[" * 40_000, document]} if rng.random() < 0.5 else [document]
        text = json.dumps(document).encode()
        assert json_depth(text) == _depth(json.loads(text)), depth


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# -- the byte budget ----------------------------------------------------------------------------

ROWS, WIDTH = 5, 4096  # a share of 80 KiB: a large body
SHARE = np.ones((ROWS, WIDTH), dtype="<f4").tobytes()


class StalledBody:
    """A body whose first chunk comes at once and the rest when released."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.body[:1024]
        self.started.set()
        await self.release.wait()
        yield self.body[1024:]


async def _upload(http: httpx.AsyncClient, created: dict[str, Any], m: int, body: Any) -> Any:
    return await http.put(
        f"{client_path(created['session_id'], m)}/passes/0/layers/1/embedding",
        content=body,
        headers={
            **bearer(created["client_tokens"][m]),
            **matrix_headers(ROWS, WIDTH),
            "Content-Length": str(len(SHARE)),
        },
    )


async def _wide_session(http: httpx.AsyncClient) -> dict[str, Any]:
    return await create_session(
        http, layers=1, agg_layers=[{"layer": 1, "width": WIDTH}], batch_size=ROWS
    )


async def test_large_bodies_beyond_the_budget_are_refused_with_retry_after(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app(max_inflight_body_bytes=len(SHARE) * 3 // 2, body_queue_seconds=0)
    async with http_client(app) as http:
        created = await _wide_session(http)
        stalled = StalledBody(SHARE)
        first = asyncio.ensure_future(_upload(http, created, 0, stalled))
        await stalled.started.wait()  # its body is being read: it holds its share of the budget
        refused = await _upload(http, created, 1, SHARE)
        assert_problem(refused, 503, "unavailable", mentions="GLASU_MAX_INFLIGHT_BODY_BYTES")
        assert refused.headers["retry-after"] == "1"
        small = await http.post(  # a small body does not count against the budget
            f"{client_path(created['session_id'], 2)}/passes/0/metrics",
            json={"loss": 1.0},
            headers=bearer(created["client_tokens"][2]),
        )
        assert small.status_code == 204
        stalled.release.set()
        assert (await first).status_code == 201
        assert (await _upload(http, created, 1, SHARE)).status_code == 201
    assert service_context(app).body_budget.held == 0


async def test_a_large_body_waits_its_turn_for_the_budget(
    make_app: Callable[..., FastAPI],
) -> None:
    app = make_app(max_inflight_body_bytes=len(SHARE) * 3 // 2, body_queue_seconds=60)
    budget = service_context(app).body_budget
    async with http_client(app) as http:
        created = await _wide_session(http)
        stalled = StalledBody(SHARE)
        first = asyncio.ensure_future(_upload(http, created, 0, stalled))
        await stalled.started.wait()
        second = asyncio.ensure_future(_upload(http, created, 1, SHARE))
        while budget.waiting == 0:  # until the second is queued
            await asyncio.sleep(0)
        assert not second.done()
        stalled.release.set()
        assert [(await first).status_code, (await second).status_code] == [201, 201]
    assert budget.held == 0 and budget.waiting == 0


async def test_a_party_posting_to_a_slot_of_another_is_refused_before_its_body_is_read(
    make_app: Callable[..., FastAPI],
) -> None:
    """The ring decides who posts each (owner, hop): a party's own valid token, a signed set,
    another party's slot -> 403 on the head, as a 401 is."""
    counting = CountingBodyReads(make_app())
    async with http_client(counting) as http:  # type: ignore[arg-type]
        created = await http.post("/v1/alignments", json={"parties": 3}, headers=admin())
        aid, tokens = created.json()["alignment_id"], created.json()["party_tokens"]
        set_head = {
            "Content-Type": "application/octet-stream",
            "X-Glasu-Shape": "4096",
            "X-Glasu-Encoding": "ristretto255",
            "X-Glasu-Signature": "ab" * 64,
        }
        for party, owner, hop in ((0, 1, 0), (0, 0, 1), (2, 0, 1)):
            counting.reads, counting.answered = 0, False
            response = await http.put(
                f"/v1/alignments/{aid}/parties/{party}/sets/{owner}/hops/{hop}",
                content=bytes(32 * 4096),
                headers={**set_head, **bearer(tokens[party])},
            )
            assert_problem(response, 403, "forbidden", mentions="blinds it there")
            assert counting.reads == 0, (party, owner, hop)
