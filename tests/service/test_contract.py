"""The API holds its own contract: JSON bodies take JSON types only (no coercion), a JSON route
says 415 to another media type, 405 names every allowed method, and a client that disconnects in
the middle of a body is its own error (logged, counted 499), never a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"clients": True}, "clients"),
        ({"clients": "3"}, "clients"),
        ({"seed": False}, "seed"),
        ({"train_nodes": [True, 2]}, "train_nodes"),
        ({"rounds": 2.0}, "rounds"),
        ({"encryption": None}, "encryption"),
    ],
)
async def test_session_fields_are_not_coerced(
    make_app: Callable[..., FastAPI], patch: dict[str, Any], field: str
) -> None:
    async with http_client(make_app()) as http:
        response = await http.post("/v1/sessions", json=session_request(**patch), headers=admin())
    assert_problem(response, 422, "validation-error", mentions=field)


async def test_metrics_are_not_coerced(make_app: Callable[..., FastAPI]) -> None:
    async with http_client(make_app()) as http:
        created = await create_session(http)
        url = f"{client_path(created['session_id'], 0)}/passes/0/metrics"
        token = created["client_tokens"][0]
        for body in ({"loss": "1.5"}, {"val_accuracy": True}, {"test_accuracy": "0.5"}):
            response = await http.post(url, json=body, headers=bearer(token))
            assert_problem(response, 422, "validation-error", mentions="valid")


async def test_a_json_route_refuses_another_media_type(make_app: Callable[..., FastAPI]) -> None:
    async with http_client(make_app()) as http:
        response = await http.post(
            "/v1/sessions",
            content=b"clients=3",
            headers={**admin(), "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert_problem(response, 415, "unsupported-media-type", mentions="application/json")
        broken = await http.post(
            "/v1/sessions",
            content=b'{"clients": 3,',
            headers={**admin(), "Content-Type": "application/json"},
        )
        assert_problem(broken, 422, "validation-error", mentions="not valid JSON")


async def test_405_names_every_method_of_the_path(make_app: Callable[..., FastAPI]) -> None:
    async with http_client(make_app()) as http:
        response = await http.put("/v1/sessions", headers=admin())
        assert_problem(response, 405, "method-not-allowed")
        assert response.headers["allow"] == "GET, POST"
        created = await create_session(http)
        one = await http.post(f"/v1/sessions/{created['session_id']}", headers=admin())
        assert set(one.headers["allow"].split(", ")) == {"GET", "DELETE"}


async def test_a_client_that_disconnects_mid_body_is_not_a_server_error(
    make_app: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    async with http_client(app) as http:
        created = await create_session(http)
    path = f"{client_path(created['session_id'], 0)}/passes/0/layers/1/nodes"
    messages = iter(
        [
            {"type": "http.request", "body": b"\x00" * 8, "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    token = created["client_tokens"][0]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "server": ("glasu.test", 80),
        "client": ("127.0.0.1", 5000),
        "headers": [
            (b"host", b"glasu.test"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/octet-stream"),
            (b"content-length", b"16"),
            (b"x-glasu-shape", b"2"),
            (b"x-glasu-encoding", b"int64"),
        ],
    }
    with caplog.at_level("INFO", logger="glasu.service"):
        await app(scope, receive, send)
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [499]
    assert "client disconnected" in caplog.text and "unhandled" not in caplog.text
    async with http_client(app) as http:
        metrics = (await http.get("/metrics", headers=admin())).text
    assert 'status="499"' in metrics and 'status="500"' not in metrics


async def test_the_openapi_schema_marks_required_headers_and_error_responses(
    make_app: Callable[..., FastAPI],
) -> None:
    async with http_client(make_app()) as http:
        schema = (await http.get("/openapi.json")).json()
    upload = schema["paths"]["/v1/sessions/{sid}/clients/{m}/passes/{p}/layers/{l}/nodes"]["put"]
    headers = {p["name"]: p for p in upload["parameters"] if p["in"] == "header"}
    assert headers["X-Glasu-Shape"]["required"] and headers["X-Glasu-Encoding"]["required"]
    for status in ("400", "413", "415", "422"):
        assert status in upload["responses"], status
    create = schema["paths"]["/v1/sessions"]["post"]
    for status in ("413", "415", "422"):
        assert status in create["responses"], status


async def test_a_plaintext_share_whose_sum_could_overflow_is_refused(
    make_app: Callable[..., FastAPI],
) -> None:
    """Finite float32 shares near the float32 limit would sum to inf: the upload is refused."""
    async with http_client(make_app()) as http:
        created = await create_session(http, agg_layers=[{"layer": 3, "width": 4}])
        token = created["client_tokens"][0]
        base = client_path(created["session_id"], 0)
        rows = len(
            (await http.get(f"{base}/passes/0", headers=bearer(token))).json()["output_nodes"]
        )
        huge = np.full((rows, 4), 3.0e38, dtype="<f4")
        response = await http.put(
            f"{base}/passes/0/layers/3/embedding",
            content=huge.tobytes(),
            headers={**bearer(token), **matrix_headers(rows, 4)},
        )
        assert_problem(response, 422, "bad-payload", mentions="overflow")
        fine = np.full((rows, 4), 2.0**100, dtype="<f4")
        response = await http.put(
            f"{base}/passes/0/layers/3/embedding",
            content=fine.tobytes(),
            headers={**bearer(token), **matrix_headers(rows, 4)},
        )
        assert response.status_code == 201, response.text
