"""Authentication, authorisation and body-size limits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

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
    nodes_body,
)

pytestmark = pytest.mark.anyio


async def test_no_or_bad_token_is_401(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    sid = created["session_id"]
    for headers in (
        {},
        bearer("not-a-token"),
        {"Authorization": f"Basic {created['client_tokens'][0]}"},
    ):
        for method, url in [
            ("POST", "/v1/sessions"),
            ("GET", "/v1/sessions"),
            ("GET", f"/v1/sessions/{sid}"),
            ("GET", f"/v1/sessions/{sid}/privacy"),
            ("DELETE", f"/v1/sessions/{sid}"),
            ("GET", f"{client_path(sid, 0)}/passes/0"),
            ("PUT", f"{client_path(sid, 0)}/passes/0/layers/1/nodes"),
            ("GET", f"{client_path(sid, 0)}/passes/0/layers/1/aggregate"),
        ]:
            response = await client.request(method, url, headers=headers)
            assert_problem(response, 401, "unauthorized")
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    # an unknown session does not tell an unauthenticated caller whether it exists
    assert_problem(await client.get(f"{client_path('nope', 0)}/passes/0"), 401, "unauthorized")


async def test_client_tokens_are_bound_to_session_and_index(client: httpx.AsyncClient) -> None:
    first = await create_session(client)
    second = await create_session(client)
    sid, tokens = first["session_id"], first["client_tokens"]
    assert len(set(tokens)) == 3 and all(len(t) >= 43 for t in tokens)

    as_other_client = await client.get(f"{client_path(sid, 1)}/passes/0", headers=bearer(tokens[0]))
    assert_problem(as_other_client, 403, "forbidden", mentions="client 0")
    upload = await client.put(
        f"{client_path(sid, 2)}/passes/0/layers/1/nodes",
        content=nodes_body([1]),
        headers={**bearer(tokens[0]), **node_headers(np.asarray([1]))},
    )
    assert_problem(upload, 403, "forbidden", mentions="cannot act as client 2")
    out_of_range = await client.get(f"{client_path(sid, 7)}/passes/0", headers=bearer(tokens[0]))
    assert_problem(out_of_range, 403, "forbidden")
    other_session = await client.get(
        f"{client_path(second['session_id'], 0)}/passes/0", headers=bearer(tokens[0])
    )
    assert_problem(other_session, 403, "forbidden", mentions="another session")
    other_status = await client.get(
        f"/v1/sessions/{second['session_id']}", headers=bearer(tokens[0])
    )
    assert_problem(other_status, 403, "forbidden", mentions="another session")


async def test_admin_and_client_routes_are_separate(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    sid, token = created["session_id"], created["client_tokens"][0]
    admin_as_client = await client.get(f"{client_path(sid, 0)}/passes/0", headers=admin())
    assert_problem(admin_as_client, 403, "forbidden", mentions="admin token")
    for method, url in [
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions"),
        ("DELETE", f"/v1/sessions/{sid}"),
    ]:
        response = await client.request(method, url, headers=bearer(token), json={})
        assert_problem(response, 403, "forbidden", mentions="client token")
    # read-only routes accept any client of the session
    assert (await client.get(f"/v1/sessions/{sid}", headers=bearer(token))).status_code == 200
    privacy = await client.get(f"/v1/sessions/{sid}/privacy", headers=bearer(token))
    assert privacy.status_code == 200


async def test_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    token = created["client_tokens"][0]
    assert_problem(await client.get("/v1/sessions/0000", headers=admin()), 404, "session-not-found")
    assert_problem(
        await client.get("/v1/sessions/0000/privacy", headers=admin()), 404, "session-not-found"
    )
    assert_problem(
        await client.delete("/v1/sessions/0000", headers=admin()), 404, "session-not-found"
    )
    assert_problem(
        await client.get(f"{client_path('0000', 0)}/passes/0", headers=bearer(token)),
        404,
        "session-not-found",
    )


async def test_closed_session_refuses_clients(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    sid, tokens = created["session_id"], created["client_tokens"]
    closed = await client.delete(f"/v1/sessions/{sid}", headers=admin())
    assert closed.status_code == 200 and closed.json()["state"] == "closed"
    assert (await client.delete(f"/v1/sessions/{sid}", headers=admin())).status_code == 200
    upload = await client.put(
        f"{client_path(sid, 0)}/passes/0/layers/1/nodes",
        content=nodes_body([1]),
        headers={**bearer(tokens[0]), **node_headers(np.asarray([1]))},
    )
    assert_problem(upload, 409, "session-closed")
    download = await client.get(
        f"{client_path(sid, 0)}/passes/0/layers/1/nodes", headers=bearer(tokens[0])
    )
    assert_problem(download, 409, "session-closed")
    info = await client.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[0]))
    assert info.json() == {
        "pass": 0,
        "kind": "done",
        "round": None,
        "output_nodes": [],
        "reason": "closed",
    }
    status = await client.get(f"/v1/sessions/{sid}", headers=admin())
    assert status.json()["state"] == "closed"


@pytest.fixture
async def small_limit_client(make_app: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(make_app(max_body_bytes=1024)) as http:
        yield http


async def test_oversized_bodies_are_413(small_limit_client: httpx.AsyncClient) -> None:
    client = small_limit_client
    created = await create_session(client, clients=2)
    sid, token = created["session_id"], created["client_tokens"][0]
    url = f"{client_path(sid, 0)}/passes/0/layers/1/nodes"
    headers = {**bearer(token), **node_headers(np.arange(200))}
    declared = await client.put(url, content=nodes_body(np.arange(200)), headers=headers)
    assert_problem(declared, 413, "payload-too-large", mentions="1024 bytes")

    async def chunks():  # no Content-Length: the streaming guard has to catch it
        for _ in range(20):
            yield b"\0" * 100

    streamed = await client.put(url, content=chunks(), headers=headers)
    assert "content-length" not in streamed.request.headers
    assert_problem(streamed, 413, "payload-too-large")
    embedding = await client.put(
        f"{client_path(sid, 0)}/passes/0/layers/3/embedding",
        content=chunks(),
        headers={**bearer(token), **matrix_headers(5, 4)},
    )
    assert_problem(embedding, 413, "payload-too-large")

    big_json = await client.post(
        "/v1/sessions",
        content=b'{"label": "' + b"x" * 2000 + b'"}',
        headers={**admin(), "Content-Type": "application/json"},
    )
    assert_problem(big_json, 413, "payload-too-large")

    async def json_chunks():
        yield b'{"label": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'"}'

    streamed_json = await client.post(
        "/v1/sessions",
        content=json_chunks(),
        headers={**admin(), "Content-Type": "application/json"},
    )
    assert_problem(streamed_json, 413, "payload-too-large")
    # the slot is untouched
    ok = await client.put(
        url,
        content=nodes_body([1, 2]),
        headers={**bearer(token), **node_headers(np.asarray([1, 2]))},
    )
    assert ok.status_code == 201


async def test_garbled_content_length_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions", content=b"{}", headers={**admin(), "Content-Length": "abc"}
    )
    assert_problem(response, 400, "bad-header", mentions="Content-Length")
