"""The operator's AdminClient against the real service app, in process (no sockets), and its
two failures: the service refused (one sentence), the service cannot be reached."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clients.admin import AdminClient, ServiceError, ServiceUnavailable
from clients.local.asgi import InProcessTransport
from clients.service_http import RetryPolicy
from service.app import create_app, service_context
from service.settings import ServiceSettings

ADMIN_TOKEN = secrets.token_urlsafe(24)
URL = "http://glasu.test"


def session_body(**changes: Any) -> dict[str, Any]:
    """A small, valid ``POST /v1/sessions`` body: plaintext, no differential privacy."""
    body: dict[str, Any] = {
        "clients": 2,
        "layers": 2,
        "agg_layers": [{"layer": 2, "width": 4}],
        "stale": 1,
        "rounds": 2,
        "eval_every": 0,
        "batch_size": 2,
        "fanout": 2,
        "num_nodes": 10,
        "train_nodes": [0, 1, 2, 3, 4],
        "eval_nodes": [5, 6, 7, 8, 9],
        "seed": 0,
        "encryption": "none",
        "privacy": None,
        "label": "admin client test",
    }
    body.update(changes)
    return body


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[InProcessTransport]:
    app = create_app(
        ServiceSettings(database=tmp_path / "service.sqlite3", admin_token=ADMIN_TOKEN)
    )
    transport = InProcessTransport(app)
    yield transport
    transport.shutdown()
    service_context(app).close()


@pytest.fixture
def admin(transport: InProcessTransport) -> Iterator[AdminClient]:
    with AdminClient(base_url=URL, token=ADMIN_TOKEN, transport=transport) as client:
        yield client


def test_create_status_privacy_close(admin: AdminClient) -> None:
    assert admin.healthy()
    created = admin.create_session(session_body())
    sid = created["session_id"]
    assert len(created["client_tokens"]) == 2 and created["passes_total"] == 3
    status = admin.session(sid)
    assert status["state"] == "running" and status["label"] == "admin client test"
    assert admin.privacy(sid)["enabled"] is False
    assert admin.close_session(sid)["state"] == "closed"
    assert admin.session(sid)["state"] == "closed"


def test_a_client_token_reads_the_privacy_budget(
    admin: AdminClient, transport: InProcessTransport
) -> None:
    created = admin.create_session(session_body())
    token = created["client_tokens"][1]
    with AdminClient(base_url=URL, token=token, transport=transport) as client:
        assert client.privacy(created["session_id"])["enabled"] is False


def test_a_refused_session_is_one_sentence_naming_the_fields(admin: AdminClient) -> None:
    with pytest.raises(ServiceError) as refused:
        admin.create_session(session_body(clients=65, seed=-1))
    assert refused.value.status == 422 and refused.value.slug == "validation-error"
    assert refused.value.describe() == (
        "the service refused to create the session (422 validation-error): clients: Input "
        "should be less than or equal to 64; seed: Input should be greater than or equal to 0"
    )


def test_unknown_session_and_wrong_token(admin: AdminClient, transport: InProcessTransport) -> None:
    with pytest.raises(ServiceError) as missing:
        admin.session("0000")
    assert missing.value.describe().startswith(
        "the service refused to show session '0000' (404 session-not-found): "
    )
    stranger = AdminClient(base_url=URL, token="not-the-token", transport=transport)
    with stranger, pytest.raises(ServiceError) as refused:
        stranger.close_session("0000")
    assert refused.value.describe() == (
        "the service refused to close session '0000' (401 unauthorized): "
        "the bearer token is not valid"
    )


def test_an_unreachable_service_is_named_by_its_url() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    waits: list[float] = []
    with AdminClient(
        base_url="http://127.0.0.1:9/",
        token="t",
        transport=httpx.MockTransport(refuse),
        sleep=waits.append,
    ) as admin:
        assert not admin.healthy()
        with pytest.raises(ServiceUnavailable) as unreachable:
            admin.privacy("s")
        assert str(unreachable.value) == (
            "cannot reach the service at http://127.0.0.1:9: ConnectError: [Errno 111] "
            "Connection refused"
        )
        assert waits == [0.2, 0.4]  # three quick attempts
        waits.clear()
        with pytest.raises(ServiceUnavailable):
            admin.create_session(session_body())
        assert waits == []  # a POST is sent once: a retry could create a second session


def test_a_failing_service_and_a_server_that_is_not_glasu() -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": "database is locked"})

    admin = AdminClient(
        base_url=URL,
        token="t",
        transport=httpx.MockTransport(failing),
        retry=RetryPolicy(attempts=2, first_delay=0.0),
    )
    with admin, pytest.raises(ServiceUnavailable) as failed:
        admin.session("s")
    assert str(failed.value) == (
        "the service at http://glasu.test kept failing to show session 's': 503 database is locked"
    )

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>welcome</html>")

    admin = AdminClient(base_url=URL, token="t", transport=httpx.MockTransport(html))
    with admin, pytest.raises(ServiceUnavailable) as not_glasu:
        admin.session("s")
    assert "does not answer like a glasu service" in str(not_glasu.value)
