"""Odd but possible requests, each answered as the API guide says: a label that holds HTML in the
report page's embedded JSON, the admin token on a client route of an unknown session, a
Content-Length that is not a number over a real socket, a scoring session that names no
finished training session; and the payload folders of an SQLite store, private like the files
in them."""

from __future__ import annotations

import json
import re
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from service_testkit import (
    Federation,
    ServedProcess,
    admin,
    assert_problem,
    client_path,
    create_session,
    http_client,
    session_request,
    start_serve,
)

from secure.report_html import DATA_ELEMENT
from secure.wire.node_lists import encode_nodes

pytestmark = pytest.mark.anyio

HOSTILE_LABEL = 'branch <!-- A & B --> </script><script>alert("x")</script>'


async def test_the_report_page_embeds_json_that_parses_back_whatever_the_label_holds(
    client: httpx.AsyncClient,
) -> None:
    created = await create_session(client, label=HOSTILE_LABEL)
    page = await client.get(f"/v1/sessions/{created['session_id']}/report", headers=admin())
    assert page.status_code == 200
    blocks = re.findall(
        rf'<script type="application/json" id="{DATA_ELEMENT}">(.*?)</script>', page.text, re.S
    )
    assert len(blocks) == 1  # nothing in the label ended the element early
    assert "<" not in blocks[0] and ">" not in blocks[0]  # nor opened a comment in it
    content = json.loads(blocks[0])
    assert content["sessions"][0]["label"] == HOSTILE_LABEL
    assert content["title"].endswith(HOSTILE_LABEL)


async def test_the_admin_token_on_a_client_route_of_an_unknown_session_is_404(
    client: httpx.AsyncClient,
) -> None:
    """docs/api.md's order: unknown token 401, unknown session 404, token not allowed 403."""
    unknown = await client.get(f"{client_path('0' * 32, 0)}/passes/0", headers=admin())
    assert_problem(unknown, 404, "session-not-found")
    created = await create_session(client)
    known = await client.get(f"{client_path(created['session_id'], 0)}/passes/0", headers=admin())
    assert_problem(known, 403, "forbidden", mentions="admin token cannot act as a client")
    party = await client.get(f"/v1/alignments/{'0' * 32}/parties/0/positions", headers=admin())
    assert_problem(party, 404, "alignment-not-found")


def scoring_of(training: dict[str, Any], model_session: str | None, **changes: Any) -> dict:
    """A scoring session with the models of ``model_session`` (trained as ``training``)."""
    body = {
        **training,
        "kind": "scoring",
        "model_session": model_session,
        "eval_nodes": encode_nodes(list(range(training["num_nodes"]))),
        "train_nodes": [],
    }
    return {**body, **changes}


async def test_a_scoring_session_needs_a_finished_training_session_of_this_service(
    make_app: Callable[..., FastAPI],
) -> None:
    training = session_request(rounds=1, eval_every=0)
    async with http_client(make_app()) as http:
        created = await create_session(http, rounds=1, eval_every=0)
        sid = created["session_id"]

        async def refused(body: dict[str, Any], mentions: str) -> None:
            response = await http.post("/v1/sessions", json=body, headers=admin())
            assert_problem(response, 422, "validation-error", mentions=mentions)

        await refused(scoring_of(training, None), "model_session")
        await refused(scoring_of(training, "f" * 32), "not a session of this service")
        await refused(scoring_of(training, sid), "still training")
        federation = Federation(http, created, training)
        for p in range(created["passes_total"]):
            await federation.run_pass(p)
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["state"] == "finished"
        await refused(scoring_of(training, sid, clients=2), "clients differs")
        await refused(
            scoring_of(training, sid, agg_layers=[{"layer": 1, "width": 8}]), "agg_layers differs"
        )
        await refused({**training, "model_session": sid}, "scoring sessions only")
        scoring = await http.post("/v1/sessions", json=scoring_of(training, sid), headers=admin())
        assert scoring.status_code == 201, scoring.text
        await refused(
            scoring_of(training, scoring.json()["session_id"]), "a scoring session, not a training"
        )
    # the one-machine `glasu score`: a fresh service, for models trained on another
    async with http_client(make_app(score_foreign_models=True)) as http:
        foreign = scoring_of(training, "f" * 32)
        scoring = await http.post("/v1/sessions", json=foreign, headers=admin())
        assert scoring.status_code == 201, scoring.text
        response = await http.post("/v1/sessions", json=scoring_of(training, None), headers=admin())
        assert_problem(response, 422, "validation-error", mentions="model_session")


@pytest.mark.sqlite_only  # the files of an SQLite store
async def test_the_payload_folders_are_the_services_alone_even_those_made_before(
    make_app: Callable[..., FastAPI], database: Path
) -> None:
    root = database.parent / f"{database.name}-payloads"
    old_pass = root / "an-old-session" / "3"
    old_pass.mkdir(parents=True, mode=0o755)
    for folder in (root, old_pass.parent, old_pass):
        folder.chmod(0o755)  # as an earlier version left them
    async with http_client(make_app()) as http:
        created = await create_session(http)
        await Federation(http, created, session_request()).run_pass(0)
    folders = [root, *(p for p in root.rglob("*") if p.is_dir())]
    assert old_pass in folders and len(folders) >= 5  # the new session's and pass's too
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {oct(0o700)}
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files and {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {oct(0o600)}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedProcess]:
    root = tmp_path_factory.mktemp("served")
    process = start_serve(root, root / "service.sqlite3")
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


@pytest.mark.parametrize("length", ["abc", "-5", "1e3"])
def test_a_content_length_that_is_not_a_number_gets_a_problem(
    served: ServedProcess, length: str
) -> None:
    """Over a real socket: uvicorn's parser refuses the head before the app sees a request;
    the answer is a problem document all the same, and the connection is closed."""
    port = int(served.url.rsplit(":", 1)[1])
    head = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n{{}}"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line == b"HTTP/1.1 400 Bad Request", answer[:300]
    assert b"content-type: application/problem+json" in headers.lower()
    assert b"connection: close" in headers.lower()
    problem = json.loads(body)
    assert problem["status"] == 400 and problem["type"].endswith("/bad-request")
    assert "Content-Length" in problem["detail"]
    assert httpx.get(f"{served.url}/healthz").status_code == 200
