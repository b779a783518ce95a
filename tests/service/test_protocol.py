"""The wire protocol end to end with simulated clients: passes, batches, unions, sums, long poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    FLOAT32_LE,
    INT64_LE,
    Federation,
    LongPollClock,
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
    woken,
)

from secure.schedule import draw_output_batch, pass_schedule
from service import plan
from service.app import service_context

pytestmark = pytest.mark.anyio

Polled = tuple[httpx.AsyncClient, LongPollClock]


@pytest.fixture
async def polled(make_app: Callable[..., FastAPI]) -> AsyncIterator[Polled]:
    """A client of an app on a :class:`LongPollClock`: its long polls wait until the test
    advances the clock."""
    clock = LongPollClock()
    async with http_client(make_app(clock=clock)) as http:
        yield http, clock


@pytest.mark.parametrize(
    "agg_layers",
    [
        [{"layer": 1, "width": 8}, {"layer": 3, "width": 4}],  # top layer aggregated
        [{"layer": 1, "width": 6}, {"layer": 2, "width": 5}],  # top layer computed locally
    ],
    ids=["top-aggregated", "top-local"],
)
async def test_full_session_of_three_clients(
    client: httpx.AsyncClient, agg_layers: list[dict[str, int]]
) -> None:
    request = session_request(agg_layers=agg_layers)
    created = await create_session(client, agg_layers=agg_layers)
    schedule = pass_schedule(rounds=request["rounds"], eval_every=request["eval_every"])
    assert created["passes_total"] == len(schedule) == 5
    assert created["noise_multiplier"] is None
    federation = Federation(client, created, request)

    for spec in schedule:
        record = await federation.run_pass(spec.index)
        info = record.info
        assert (info["pass"], info["kind"], info["round"]) == (spec.index, spec.kind, spec.round)
        if spec.kind == "eval":
            assert info["output_nodes"] == sorted(request["eval_nodes"])
        else:
            batch = draw_output_batch(
                request["train_nodes"],
                batch_size=request["batch_size"],
                seed=request["seed"],
                pass_index=spec.index,
            )
            assert info["output_nodes"] == batch.tolist()
        for layer, node_sets in record.node_sets.items():
            union = np.unique(np.concatenate(list(node_sets.values())))
            for got in record.unions[layer].values():
                np.testing.assert_array_equal(got, union)
        for layer, shares in record.shares.items():
            assert record.counts[layer] == {3}
            for got in record.sums[layer].values():
                np.testing.assert_array_equal(got, expected_sum(shares))

        status = (await client.get(f"/v1/sessions/{federation.sid}", headers=admin())).json()
        assert status["current_pass"] == spec.index + 1

    status = (await client.get(f"/v1/sessions/{federation.sid}", headers=admin())).json()
    assert status["state"] == "finished"
    assert status["progress"] is None
    assert status["bytes_up"] > 0 and status["bytes_down"] > 0
    assert [t["client"] for t in status["traffic"]] == [0, 1, 2]
    done = await federation.pass_info(0, len(schedule))
    assert done == {
        "pass": len(schedule),
        "kind": "done",
        "round": None,
        "output_nodes": [],
        "reason": "finished",
    }
    beyond = await client.get(
        f"{client_path(federation.sid, 0)}/passes/{len(schedule) + 1}",
        headers=bearer(federation.tokens[0]),
    )
    assert beyond.status_code == 404


async def test_union_is_sorted_and_deduplicated(client: httpx.AsyncClient) -> None:
    created = await create_session(client, clients=2)
    sid, tokens = created["session_id"], created["client_tokens"]
    sets = [[3, 9, 17, 40], [1, 3, 17, 59]]
    for m, nodes in enumerate(sets):
        response = await client.put(
            f"{client_path(sid, m)}/passes/0/layers/1/nodes",
            content=nodes_body(nodes),
            headers={**bearer(tokens[m]), **node_headers(np.asarray(nodes))},
        )
        assert response.status_code == 201
        assert response.json()["received"] == list(range(m + 1))
    response = await client.get(
        f"{client_path(sid, 1)}/passes/0/layers/1/nodes", headers=bearer(tokens[1])
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    assert np.frombuffer(response.content, dtype=INT64_LE).tolist() == [1, 3, 9, 17, 40, 59]
    assert response.headers["X-Glasu-Shape"] == "6"


async def test_long_poll_waits_then_completes(polled: Polled) -> None:
    """A poll answers 202 when its wait runs out, and 200 as soon as the last node set is in:
    the clock never reaches its deadline, so only the uploads can have woken it."""
    client, clock = polled
    created = await create_session(client)
    sid, tokens = created["session_id"], created["client_tokens"]
    url = f"{client_path(sid, 0)}/passes/0/layers/1/nodes"

    async def upload(m: int) -> None:
        nodes = np.asarray([m, 10 + m], dtype=np.int64)
        response = await client.put(
            f"{client_path(sid, m)}/passes/0/layers/1/nodes",
            content=nodes_body(nodes),
            headers={**bearer(tokens[m]), **node_headers(nodes)},
        )
        assert response.status_code == 201

    await upload(0)
    short = await clock.waiting(client.get(url, params={"wait": 0.05}, headers=bearer(tokens[0])))
    clock.advance(0.05)
    waiting = await woken(short)
    assert waiting.status_code == 202
    assert waiting.json() == {
        "status": "waiting",
        "pass": 0,
        "layer": 1,
        "received": [0],
        "missing": [1, 2],
    }

    poll = await clock.waiting(client.get(url, params={"wait": 10}, headers=bearer(tokens[0])))
    assert not poll.done()
    await upload(1)
    await upload(2)
    answer = await woken(poll)
    assert answer.status_code == 200
    assert np.frombuffer(answer.content, dtype=INT64_LE).tolist() == [0, 1, 2, 10, 11, 12]


async def test_long_poll_of_the_sum(polled: Polled) -> None:
    client, clock = polled
    created = await create_session(client, agg_layers=[{"layer": 3, "width": 2}], clients=2)
    sid, tokens = created["session_id"], created["client_tokens"]
    rows = len(
        (await client.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[0]))).json()[
            "output_nodes"
        ]
    )
    shares = {m: np.full((rows, 2), m + 1.5, dtype=np.float32) for m in range(2)}

    async def upload(m: int) -> None:
        response = await client.put(
            f"{client_path(sid, m)}/passes/0/layers/3/embedding",
            content=shares[m].tobytes(),
            headers={**bearer(tokens[m]), **matrix_headers(rows, 2)},
        )
        assert response.status_code == 201

    waiting = await clock.waiting(
        client.get(
            f"{client_path(sid, 1)}/passes/0/layers/3/aggregate",
            params={"wait": 10},
            headers=bearer(tokens[1]),
        )
    )
    assert not waiting.done()
    await upload(0)
    await upload(1)
    poll = await woken(waiting)
    assert poll.status_code == 200
    assert poll.headers["X-Glasu-Count"] == "2"
    total = np.frombuffer(poll.content, dtype=FLOAT32_LE).reshape(rows, 2)
    np.testing.assert_array_equal(total, expected_sum(shares))
    # The pass is over: pass 1 is current, pass 0 can still be downloaded.
    status = (await client.get(f"/v1/sessions/{sid}", headers=bearer(tokens[0]))).json()
    assert status["current_pass"] == 1
    again = await client.get(
        f"{client_path(sid, 0)}/passes/0/layers/3/aggregate", headers=bearer(tokens[0])
    )
    assert again.content == poll.content


async def test_status_reports_progress_and_metrics(client: httpx.AsyncClient) -> None:
    created = await create_session(client, rounds=1, eval_every=0)
    sid, tokens = created["session_id"], created["client_tokens"]
    nodes = np.asarray([1, 2, 3], dtype=np.int64)
    await client.put(
        f"{client_path(sid, 2)}/passes/0/layers/1/nodes",
        content=nodes_body(nodes),
        headers={**bearer(tokens[2]), **node_headers(nodes)},
    )
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["state"] == "running"
    assert "train_nodes" not in status["config"]
    assert status["config"]["train_nodes_count"] == 30
    assert status["config"]["encoding"] == "float32"
    layer1, layer3 = status["progress"]["layers"]
    assert layer1 == {
        "layer": 1,
        "width": 8,
        "rows": None,
        "nodes_received": [2],
        "union_ready": False,
        "embeddings_received": [],
        "aggregated": False,
    }
    assert layer3["nodes_received"] is None and layer3["rows"] == 5 and layer3["union_ready"]

    for m, (loss, acc) in enumerate([(1.0, 0.5), (2.0, None), (3.0, 0.7)]):
        response = await client.post(
            f"{client_path(sid, m)}/passes/0/metrics",
            json={"loss": loss} | ({"val_accuracy": acc} if acc is not None else {}),
            headers=bearer(tokens[m]),
        )
        assert response.status_code == 204
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    (record,) = status["metrics"]
    assert record["pass"] == 0 and record["kind"] == "train" and record["reports"] == 3
    assert record["loss"] == pytest.approx(2.0)
    assert record["val_accuracy"] == pytest.approx(0.6)  # mean over the clients that reported it
    assert record["test_accuracy"] is None


async def test_sessions_are_listed_for_the_admin(client: httpx.AsyncClient) -> None:
    first = await create_session(client, label="first")
    second = await create_session(client)
    listing = (await client.get("/v1/sessions", headers=admin())).json()
    assert [s["session_id"] for s in listing] == [first["session_id"], second["session_id"]]
    assert listing[0]["label"] == "first" and listing[0]["passes_total"] == 5
    assert listing[0]["state"] == "running" and listing[0]["current_pass"] == 0


async def test_the_session_list_comes_in_pages(client: httpx.AsyncClient) -> None:
    created = [(await create_session(client, label=f"s{i}"))["session_id"] for i in range(5)]
    listed, url, sizes = [], "/v1/sessions?limit=2", []
    while url:
        page = await client.get(url, headers=admin())
        assert page.status_code == 200, page.text
        listed += [s["session_id"] for s in page.json()]
        sizes.append(len(page.json()))
        url = page.links.get("next", {}).get("url")
    assert listed == created and sizes == [2, 2, 1]  # oldest first, each once
    everything = await client.get("/v1/sessions", headers=admin())
    assert [
        s["session_id"] for s in everything.json()
    ] == created and "link" not in everything.headers
    assert_problem(
        await client.get("/v1/sessions?limit=1001", headers=admin()), 422, "validation-error"
    )
    assert_problem(
        await client.get("/v1/sessions?page=2", headers=admin()), 422, "validation-error"
    )
    unknown = await client.get("/v1/sessions?after=no-such-session", headers=admin())
    assert_problem(unknown, 404, "session-not-found", mentions="no-such-session")


async def test_a_listing_reads_plans_outside_the_store_lock(
    make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the rows are read under the store's lock (a worker's request in another session
    waits for nothing else), and no plan is built: the plans of running sessions stay cached."""
    async with http_client(make_app()) as http:
        created = [(await create_session(http, label=f"s{i}"))["session_id"] for i in range(3)]
    restarted = make_app()  # nothing cached
    store = service_context(restarted).store
    outlines: list[bool] = []
    built: list[str] = []
    read_outline = plan.PlanOutline.from_json
    build = plan.SessionPlan.build

    def outline_outside_the_lock(text: str) -> plan.PlanOutline:
        outlines.append(store.in_transaction)
        return read_outline(text)

    def recording_build(session_id: str, *args: Any, **kwargs: Any) -> plan.SessionPlan:
        built.append(session_id)
        return build(session_id, *args, **kwargs)

    monkeypatch.setattr(plan.PlanOutline, "from_json", outline_outside_the_lock)
    monkeypatch.setattr(plan.SessionPlan, "build", recording_build)
    async with http_client(restarted) as http:
        listing = (await http.get("/v1/sessions", headers=admin())).json()
    assert [(s["session_id"], s["label"]) for s in listing] == [
        (sid, f"s{i}") for i, sid in enumerate(created)
    ]
    assert built == [] and outlines == [False] * 3


async def test_concurrent_identical_uploads_store_once(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    sid, token = created["session_id"], created["client_tokens"][0]
    nodes = np.asarray([4, 8], dtype=np.int64)
    responses = await asyncio.gather(
        *(
            client.put(
                f"{client_path(sid, 0)}/passes/0/layers/1/nodes",
                content=nodes_body(nodes),
                headers={**bearer(token), **node_headers(nodes)},
            )
            for _ in range(4)
        )
    )
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 201]


async def test_closing_wakes_long_polls(polled: Polled) -> None:
    client, clock = polled
    created = await create_session(client)
    sid, token = created["session_id"], created["client_tokens"][0]
    poll = await clock.waiting(
        client.get(
            f"{client_path(sid, 0)}/passes/0/layers/1/nodes",
            params={"wait": 20},
            headers=bearer(token),
        )
    )
    assert not poll.done()
    closed = await client.delete(f"/v1/sessions/{sid}", headers=admin())
    assert closed.status_code == 200
    answer = await woken(poll)
    assert answer.status_code == 409 and answer.json()["type"].endswith("/session-closed")


async def test_wait_is_bounded(make_app: Callable[..., FastAPI]) -> None:
    clock = LongPollClock()
    async with http_client(make_app(long_poll_seconds=0.1, clock=clock)) as http:
        created = await create_session(http)
        sid, token = created["session_id"], created["client_tokens"][0]
        url = f"{client_path(sid, 0)}/passes/0/layers/3/aggregate"
        too_long = await http.get(url, params={"wait": 61}, headers=bearer(token))
        assert too_long.status_code == 422
        assert "query.wait" in too_long.json()["detail"]
        poll = await clock.waiting(http.get(url, params={"wait": 60}, headers=bearer(token)))
        # capped by GLASU_LONG_POLL_SECONDS=0.1
        assert clock.deadlines == [clock.now() + 0.1]
        clock.advance(0.1)
        capped = await woken(poll)
        assert capped.status_code == 202
