"""The straggler policy at the service: under "continue" a layer whose wait is over is formed from
the clients that arrived (2 at least), the late client is excluded from the rest of the pass and
takes part again in the next one, and the privacy ledger records whose shares each release
holds. Under "wait" (the default) nothing closes early. The straggler waits and the long polls
run on the service's clock, a ``LongPollClock`` the tests move on: none waits for real time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    LongPollClock,
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    private_session_request,
    session_request,
)

from clients.cli.session_cmd import describe
from service.app import service_context

pytestmark = pytest.mark.anyio

WAIT = 0.4  # straggler_wait_seconds of these sessions
CONTINUE = {"stragglers": "continue", "straggler_wait_seconds": WAIT}


@pytest.fixture
def clock() -> LongPollClock:
    return LongPollClock()


@pytest.fixture
async def client(
    make_app: Callable[..., FastAPI], clock: LongPollClock
) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(make_app(clock=clock)) as http:
        yield http


async def put(
    client: httpx.AsyncClient, created: dict, m: int, p: int, layer: int, body: np.ndarray
) -> httpx.Response:
    sid, token = created["session_id"], created["client_tokens"][m]
    if body.ndim == 1:
        kind, headers, content = "nodes", node_headers(body), nodes_body(body)
    else:
        kind, headers, content = "embedding", matrix_headers(*body.shape), body.astype("<f4")
        content = content.tobytes()
    return await client.put(
        f"{client_path(sid, m)}/passes/{p}/layers/{layer}/{kind}",
        content=content,
        headers={**headers, **bearer(token)},
    )


async def get(
    client: httpx.AsyncClient, created: dict, m: int, p: int, layer: int, what: str, wait: float
) -> httpx.Response:
    sid, token = created["session_id"], created["client_tokens"][m]
    return await client.get(
        f"{client_path(sid, m)}/passes/{p}/layers/{layer}/{what}",
        params={"wait": wait},
        headers=bearer(token),
    )


async def output_rows(client: httpx.AsyncClient, created: dict, p: int) -> int:
    sid, token = created["session_id"], created["client_tokens"][0]
    info = await client.get(f"{client_path(sid, 0)}/passes/{p}", headers=bearer(token))
    return len(info.json()["output_nodes"])


async def rejoin(client: httpx.AsyncClient, created: dict, m: int) -> int:
    sid, token = created["session_id"], created["client_tokens"][m]
    response = await client.post(f"{client_path(sid, m)}/rejoin", headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()["pass"]


async def finish_pass(client: httpx.AsyncClient, created: dict, p: int, clients: tuple) -> None:
    """Layer 1's shares and layer 3's (the top) from ``clients``, after the node union."""
    union = await get(client, created, clients[0], p, 1, "nodes", wait=5)
    rows = len(union.content) // 8
    for m in clients:
        assert (await put(client, created, m, p, 1, np.ones((rows, 8)))).status_code == 201
    top = await output_rows(client, created, p)
    for m in clients:
        assert (await put(client, created, m, p, 3, np.ones((top, 4)))).status_code == 201


async def test_continue_needs_three_clients_and_unshared_noise(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions", json=session_request(clients=2, **CONTINUE), headers=admin()
    )
    assert_problem(response, 422, "validation-error", mentions="3 clients or more")
    privacy = {"noise_multiplier": 1.0, "delta": 1e-5, "clip": 1.0, "shared_noise": True}
    response = await client.post(
        "/v1/sessions",
        json=private_session_request(privacy, encryption="none", **CONTINUE),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="unshared noise")
    created = await create_session(client)
    status = (await client.get(f"/v1/sessions/{created['session_id']}", headers=admin())).json()
    assert status["config"]["stragglers"] == "wait"


async def test_a_pass_goes_on_without_a_late_node_set_and_takes_the_client_back_next_pass(
    client: httpx.AsyncClient,
    clock: LongPollClock,
) -> None:
    created = await create_session(client, **CONTINUE)
    rng = np.random.default_rng(0)
    nodes = np.arange(10)
    for m in (0, 1):
        assert (await put(client, created, m, 0, 1, nodes + m)).status_code == 201
    started = clock.now()
    poll = await clock.waiting(get(client, created, 0, 0, 1, "nodes", wait=5))
    assert not poll.done()
    clock.advance(WAIT)
    union = await poll
    assert union.status_code == 200
    assert clock.now() - started >= WAIT * 0.5  # closed by the wait, not at once
    assert np.frombuffer(union.content, "<i8").tolist() == list(range(11))
    late = await put(client, created, 2, 0, 1, nodes)
    assert_problem(late, 409, "excluded", mentions="went on without client 2")
    # the rest of the pass waits for clients 0 and 1 only, and serves its sums to them only
    shares = {m: rng.normal(size=(11, 8)).astype(np.float32) for m in (0, 1)}
    for m, share in shares.items():
        receipt = await put(client, created, m, 0, 1, share)
        assert receipt.status_code == 201 and receipt.json()["missing"] == [m ^ 1] * (m == 0)
    total = await get(client, created, 1, 0, 1, "aggregate", wait=1)
    assert total.status_code == 200 and total.headers["x-glasu-count"] == "2"
    np.testing.assert_allclose(
        np.frombuffer(total.content, "<f4").reshape(11, 8), shares[0] + shares[1], rtol=1e-6
    )
    assert_problem(await get(client, created, 2, 0, 1, "aggregate", wait=0), 409, "excluded")
    rows = await output_rows(client, created, 0)
    for m in (0, 1):
        assert (await put(client, created, m, 0, 3, np.ones((rows, 4)))).status_code == 201
    sid = created["session_id"]
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["current_pass"] == 1 and status["progress"]["absent"] == [2]
    shown = describe(status)
    assert "going on without clients [2]" in shown
    assert "layer 1 node sets from [], missing [0, 1]" in shown
    # client 2 is absent from pass 1: it does not wait for it
    for m in (0, 1):
        assert (await put(client, created, m, 1, 1, nodes)).status_code == 201
    assert (await get(client, created, 0, 1, 1, "nodes", wait=0)).status_code == 200
    assert_problem(await put(client, created, 2, 1, 1, nodes), 409, "excluded")
    # until it asks to rejoin: pass 1 has gone on without it, so from pass 2
    assert await rejoin(client, created, 2) == 2
    await finish_pass(client, created, 1, (0, 1))
    # pass 2 evaluates: no node sets, its layer 1 shares have a row per node (num_nodes 60)
    share = np.ones((60, 8))
    for m in (0, 1):
        assert (await put(client, created, m, 2, 1, share)).status_code == 201
    waiting = await get(client, created, 0, 2, 1, "aggregate", wait=0)
    assert waiting.status_code == 202 and waiting.json()["missing"] == [2]
    assert (await put(client, created, 2, 2, 1, share)).status_code == 201
    assert (await get(client, created, 2, 2, 1, "aggregate", wait=1)).status_code == 200
    assert await rejoin(client, created, 0) == 2  # never left out: the current pass


async def test_a_late_share_is_left_out_of_the_sum_after_the_wait(
    client: httpx.AsyncClient,
    clock: LongPollClock,
) -> None:
    created = await create_session(client, **CONTINUE)
    nodes = np.arange(6)
    for m in range(3):
        await put(client, created, m, 0, 1, nodes)
    for m in (0, 2):
        await put(client, created, m, 0, 1, np.full((6, 8), m + 1.0))
    waiting = await get(client, created, 0, 0, 1, "aggregate", wait=0)
    assert waiting.status_code == 202 and waiting.json()["missing"] == [1]
    poll = await clock.waiting(get(client, created, 2, 0, 1, "aggregate", wait=5))
    clock.advance(WAIT)
    total = await poll
    assert total.status_code == 200 and total.headers["x-glasu-count"] == "2"
    assert np.frombuffer(total.content, "<f4").tolist() == [4.0] * 48  # 1 + 3
    assert_problem(await put(client, created, 1, 0, 1, np.ones((6, 8))), 409, "excluded")


async def test_one_share_alone_is_never_a_sum(
    client: httpx.AsyncClient, clock: LongPollClock
) -> None:
    """A sum of one share would hand that share to whoever fetches it."""
    created = await create_session(client, **CONTINUE)
    await put(client, created, 0, 0, 1, np.arange(6))
    clock.advance(WAIT + 0.1)
    poll = await clock.waiting(get(client, created, 0, 0, 1, "nodes", wait=1.2))
    clock.advance(1.2)
    answer = await poll
    assert answer.status_code == 202 and answer.json()["missing"] == [1, 2]


async def test_under_wait_a_slot_never_closes_early(
    client: httpx.AsyncClient, clock: LongPollClock
) -> None:
    created = await create_session(client, straggler_wait_seconds=WAIT)  # the policy is "wait"
    for m in (0, 1):
        await put(client, created, m, 0, 1, np.arange(6))
    poll = await clock.waiting(get(client, created, 0, 0, 1, "nodes", wait=1.2))
    clock.advance(1.2)
    answer = await poll
    assert answer.status_code == 202 and answer.json()["missing"] == [2]


async def test_the_ledger_counts_each_clients_own_releases(
    client: httpx.AsyncClient, clock: LongPollClock
) -> None:
    privacy = {"noise_multiplier": 1.0, "delta": 1e-5, "clip": 1.0}
    created = await create_session(
        client, **{**private_session_request(privacy), **CONTINUE, "encryption": "none"}
    )
    sid = created["session_id"]
    passes = [(0, 1), (0, 1, 2)]  # who arrives in passes 0 and 1
    for p, arriving in enumerate(passes):
        if p == 1:
            assert await rejoin(client, created, 2) == 1  # after pass 0 went on without it
        for m in arriving:
            await put(client, created, m, p, 1, np.arange(6))
        poll = await clock.waiting(get(client, created, 0, p, 1, "nodes", wait=5))
        clock.advance(WAIT)  # pass 0 goes on without client 2 once the wait is over
        assert (await poll).status_code == 200
        for m in arriving:
            await put(client, created, m, p, 1, np.zeros((6, 8)))
        answer = await get(client, created, arriving[0], p, 1, "aggregate", wait=5)
        assert answer.headers["x-glasu-count"] == str(len(arriving))
    report = (await client.get(f"/v1/sessions/{sid}/privacy", headers=admin())).json()
    assert [entry["clients"] for entry in report["ledger"]] == [[0, 1], [0, 1, 2]]
    assert [c["releases"] for c in report["by_client"]] == [2, 2, 1]
    by_client = {c["client"]: c["epsilon"] for c in report["by_client"]}
    assert by_client[0] == pytest.approx(report["epsilon"])
    assert 0 < by_client[2] < by_client[0]


@pytest.mark.parametrize(
    ("policy", "woken_after"),
    [({}, [False, False, True]), (CONTINUE, [True, True, True])],
    ids=["wait", "continue"],
)
async def test_only_an_upload_that_may_close_its_slot_wakes_the_long_polls(
    make_app: Callable[..., FastAPI],
    monkeypatch: pytest.MonkeyPatch,
    policy: dict,
    woken_after: list[bool],
) -> None:
    """Under "wait" the waiting downloads are checked again once per slot (M checks a layer, not
    M^2); under "continue" every upload may bring the early close forward."""
    app = make_app()
    notifier = service_context(app).notifier
    woken: list[str] = []
    notify = notifier.notify
    monkeypatch.setattr(notifier, "notify", lambda sid: (woken.append(sid), notify(sid)))
    async with http_client(app) as client:
        created = await create_session(client, **policy)
        seen = []
        for m in range(3):
            woken.clear()
            assert (await put(client, created, m, 0, 1, np.arange(4) + m)).status_code == 201
            seen.append(woken == [created["session_id"]])
        assert seen == woken_after
        union = await get(client, created, 0, 0, 1, "nodes", wait=0)
        assert union.status_code == 200
