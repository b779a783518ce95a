"""Two replicas (two apps, two Store objects) on one database: a long poll on one is woken by a
change committed through the other (PostgreSQL LISTEN/NOTIFY, service/notify_postgres.py); a
slot's sum is computed once, by whichever replica completes the slot under the slot's database
lock, and a replica that dies mid-sum leaves nothing that the next request does not redo
(service/rounds/sums.py).

The sums run on PostgreSQL, and on one SQLite file shared by two stores that behave as a shared
store (their ``BEGIN IMMEDIATE`` serialises them where PostgreSQL takes ``lock_slot``). Races
are ordered with events and waits end by notification, never with sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    admin,
    bearer,
    client_path,
    create_session,
    expected_sum,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    waits_on_a_lock,
)

from service.app import service_context
from service.clock import ManualClock
from service.context import database_url
from service.rounds import Caller, Payload
from service.rounds.recent_sums import RecentSums
from service.rounds.sums import RECENT_SUM_BYTES_PER_REPLICA
from service.settings import ServiceSettings
from service.store import Slot
from service.store.sessions import SessionQueries

pytestmark = pytest.mark.anyio

FAIL_AFTER = 20.0  # seconds: only a broken test waits this long
ROWS, COLS = 5, 2
SHARES = {m: np.full((ROWS, COLS), m + 0.5, dtype=np.float32) for m in range(2)}
SLOT = (0, 3)  # pass, layer


@pytest.fixture
def replicas(
    make_app: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> tuple[FastAPI, FastAPI]:
    """Two apps on the test's database (an SQLite file or a PostgreSQL database, see
    conftest.py), on clocks that nobody advances. The SQLite stores act as shared ones."""
    apps = make_app(clock=ManualClock()), make_app(clock=ManualClock())
    store_type = type(service_context(apps[0]).store)
    if not service_context(apps[0]).store.shared:
        monkeypatch.setattr(store_type, "shared", True)
    return apps


@pytest.fixture
def postgres_replicas(
    make_app: Callable[..., FastAPI], make_settings: Callable[..., ServiceSettings]
) -> tuple[FastAPI, FastAPI]:
    """Two apps on the test's PostgreSQL database (LISTEN/NOTIFY), on clocks that nobody
    advances; skipped on SQLite."""
    if database_url(make_settings()) is None:
        pytest.skip("replicas are woken through PostgreSQL only")
    apps = make_app(clock=ManualClock()), make_app(clock=ManualClock())
    assert all(service_context(app).store.shared for app in apps)
    return apps


async def test_a_long_poll_on_one_replica_is_woken_by_an_upload_through_the_other(
    postgres_replicas: tuple[FastAPI, FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = postgres_replicas
    loop = asyncio.get_running_loop()
    checked = asyncio.Event()
    downloads = service_context(first).engine.downloads
    get = downloads.get

    def signalled_get(*args: Any) -> Any:
        answer = get(*args)
        loop.call_soon_threadsafe(checked.set)
        return answer

    monkeypatch.setattr(downloads, "get", signalled_get)
    async with http_client(first) as http_a, http_client(second) as http_b:
        created = await create_session(http_a)
        sid, tokens = created["session_id"], created["client_tokens"]
        for m, http in ((0, http_a), (1, http_b)):
            await put_nodes(http, sid, tokens[m], m)
        poll = asyncio.create_task(
            http_a.get(
                f"{client_path(sid, 0)}/passes/0/layers/1/nodes",
                params={"wait": 60},
                headers=bearer(tokens[0]),
            )
        )
        await asyncio.wait_for(checked.wait(), FAIL_AFTER)  # A checked: waiting for client 2
        checked.clear()
        await put_nodes(http_b, sid, tokens[2], 2)
        union = await asyncio.wait_for(poll, FAIL_AFTER)
    assert union.status_code == 200, union.text
    assert np.frombuffer(union.content, dtype="<i8").tolist() == list(range(7))


async def put_nodes(http: httpx.AsyncClient, sid: str, token: str, m: int) -> None:
    nodes = np.arange(5) + m
    response = await http.put(
        f"{client_path(sid, m)}/passes/0/layers/1/nodes",
        content=nodes_body(nodes),
        headers={**bearer(token), **node_headers(nodes)},
    )
    assert response.status_code == 201, response.text


async def shares_in_no_sum(
    replicas: tuple[FastAPI, FastAPI], monkeypatch: pytest.MonkeyPatch
) -> str:
    """A session whose two shares went one to each replica and whose sum nobody stored (the
    uploads' completion is switched off); its id."""
    with monkeypatch.context() as patch:
        for app in replicas:
            patch.setattr(service_context(app).engine.sums, "complete", lambda *a, **k: False)
        async with http_client(replicas[0]) as first:
            created = await create_session(
                first, clients=2, agg_layers=[{"layer": 3, "width": COLS}]
            )
        sid, tokens = created["session_id"], created["client_tokens"]
        for m, app in enumerate(replicas):
            async with http_client(app) as http:
                put = await http.put(
                    f"{client_path(sid, m)}/passes/{SLOT[0]}/layers/{SLOT[1]}/embedding",
                    content=SHARES[m].tobytes(),
                    headers={**bearer(tokens[m]), **matrix_headers(ROWS, COLS)},
                )
            assert put.status_code == 201, put.text
    assert stored_sum(replicas[1], sid) is None
    return sid


def stored_sum(app: FastAPI, sid: str) -> Any:
    with service_context(app).store.transaction() as tx:
        return tx.result(sid, *SLOT, "sum")


def served_sum(app: FastAPI, sid: str) -> np.ndarray:
    total = service_context(app).engine.downloads.get("sum", Caller(sid, 0), *SLOT)
    assert isinstance(total, Payload) and total.count == 2
    return np.frombuffer(total.body, dtype="<f4").reshape(ROWS, COLS)


class Ordered:
    """Named events, set and awaited from the replicas' threads."""

    def __init__(self) -> None:
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def _event(self, name: str) -> threading.Event:
        with self._lock:
            return self._events.setdefault(name, threading.Event())

    def set(self, name: str) -> None:
        self._event(name).set()

    def wait(self, name: str) -> None:
        if not self._event(name).wait(FAIL_AFTER):
            raise TimeoutError(f"never happened: {name}")


def run_threads(*targets: Callable[[], bool]) -> list[bool]:
    results: list[Any] = [None] * len(targets)

    def run(i: int) -> None:
        try:
            results[i] = targets[i]()
        except BaseException as exc:  # handed to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FAIL_AFTER)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def test_a_sum_both_replicas_find_due_is_stored_once(
    replicas: tuple[FastAPI, FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both replicas find the sum due (no row yet); A stores it; B, getting the slot's lock
    after, finds the row and does nothing: one sum, the shares read once."""
    sid = await shares_in_no_sum(replicas, monkeypatch)
    order = Ordered()
    reads: list[str] = []
    for name, other, app in (("A", "B", replicas[0]), ("B", "A", replicas[1])):
        sums = service_context(app).engine.sums
        monkeypatch.setattr(
            sums, "_due_sum_plan", _found_due(sums._due_sum_plan, order, name, other)
        )
        read_share = sums.bodies.read_share
        monkeypatch.setattr(
            sums.bodies,
            "read_share",
            lambda *a, _read=read_share, _name=name, **k: (reads.append(_name), _read(*a, **k))[1],
        )

    def complete_on_a() -> bool:
        stored = service_context(replicas[0]).engine.sums.complete(Slot(sid, *SLOT), wait=False)
        order.set("A stored it")
        return stored

    def complete_on_b() -> bool:
        return service_context(replicas[1]).engine.sums.complete(Slot(sid, *SLOT), wait=False)

    assert run_threads(complete_on_a, complete_on_b) == [True, False]
    assert reads == ["A", "A"]
    for app in replicas:
        np.testing.assert_array_equal(served_sum(app, sid), expected_sum(SHARES))


def _found_due(
    due_sum_plan: Callable[..., Any], order: Ordered, name: str, other: str
) -> Callable[..., Any]:
    """``ShareSums._due_sum_plan`` of replica ``name``: both replicas find the sum due before
    either takes the lock, and B takes it only once A has stored the sum."""

    def found_due(*args: Any) -> Any:
        plan = due_sum_plan(*args)
        assert plan is not None
        order.set(f"{name} found it due")
        order.wait(f"{other} found it due")
        if name == "B":
            order.wait("A stored it")
        return plan

    return found_due


async def test_a_replica_killed_mid_sum_leaves_no_sum_and_the_next_request_stores_it(
    replicas: tuple[FastAPI, FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await shares_in_no_sum(replicas, monkeypatch)
    first, second = service_context(replicas[0]), service_context(replicas[1])
    write_sum = first.engine.sums.bodies.write_sum

    def dies_after_writing(*args: Any, **kwargs: Any) -> None:
        write_sum(*args, **kwargs)
        raise SystemExit("replica A killed mid-sum")

    monkeypatch.setattr(first.engine.sums.bodies, "write_sum", dies_after_writing)
    with pytest.raises(SystemExit):
        first.engine.sums.complete(Slot(sid, *SLOT), wait=True)
    assert stored_sum(replicas[1], sid) is None
    # The next download, on the other replica, finds every share in and no sum: it stores it.
    np.testing.assert_array_equal(served_sum(replicas[1], sid), expected_sum(SHARES))
    with second.store.transaction() as tx:
        session = tx.session(sid)
    assert session is not None and session.current_pass == 1  # the pass's last sum


async def test_a_follower_of_the_session_list_misses_no_session_committed_out_of_order(
    postgres_replicas: tuple[FastAPI, FastAPI],
    make_settings: Callable[..., ServiceSettings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Creator A (replica 1) inserts its session and holds its transaction open; creator B
    (replica 2) creates one meanwhile; a follower pages with ``after`` in between and after
    both commit. Every session must reach the follower: B may not be listed before A is."""
    first, second = postgres_replicas
    url = database_url(make_settings())
    assert url is not None
    a_inserted, release_a = threading.Event(), threading.Event()
    insert_session = SessionQueries.insert_session

    def held_insert(self: SessionQueries, session_id: str, *args: Any) -> None:
        insert_session(self, session_id, *args)
        if not a_inserted.is_set():  # creator A: the first insert
            a_inserted.set()
            assert release_a.wait(FAIL_AFTER)

    monkeypatch.setattr(SessionQueries, "insert_session", held_insert)
    async with http_client(first) as http_a, http_client(second) as http_b:
        creating_a = asyncio.create_task(create_session(http_a))
        assert await asyncio.to_thread(a_inserted.wait, FAIL_AFTER)
        creating_b = asyncio.create_task(create_session(http_b))
        # B either commits (the follower then sees it before A) or waits on A's lock
        async with asyncio.timeout(FAIL_AFTER):
            while not creating_b.done() and not await asyncio.to_thread(waits_on_a_lock, url):
                await asyncio.sleep(0.01)
        seen, last = await follow_sessions(http_a, after=None)
        release_a.set()
        created = {(await creating_a)["session_id"], (await creating_b)["session_id"]}
        later, _ = await follow_sessions(http_a, after=last)
    assert set(seen + later) == created, f"the follower missed {created - set(seen + later)}"


async def follow_sessions(
    http: httpx.AsyncClient, *, after: str | None
) -> tuple[list[str], str | None]:
    """The ids a follower reads from ``after`` on, four a page, and the last one it saw."""
    seen: list[str] = []
    while True:
        params: dict[str, Any] = {"limit": 4} if after is None else {"limit": 4, "after": after}
        page = await http.get("/v1/sessions", params=params, headers=admin())
        assert page.status_code == 200, page.text
        ids = [s["session_id"] for s in page.json()]
        seen += ids
        after = ids[-1] if ids else after
        if "Link" not in page.headers:
            return seen, after


async def test_each_replica_keeps_a_bounded_cache_of_sums(
    postgres_replicas: tuple[FastAPI, FastAPI],
) -> None:
    """Every replica caches the sums it serves: a budget per replica, smaller than one
    process's, that no body passes (one larger than the whole budget is not kept)."""
    for app in postgres_replicas:
        assert service_context(app).engine.sums.recent.budget == RECENT_SUM_BYTES_PER_REPLICA
    recent = RecentSums(100)
    for pass_index in range(5):
        recent.put(Slot("s", pass_index, 1), bytes(60))
        assert recent.held_bytes <= 100
    assert recent.get(Slot("s", 4, 1)) == bytes(60)
    recent.put(Slot("s", 9, 1), bytes(150))
    assert recent.get(Slot("s", 9, 1)) is None
    assert recent.held_bytes == 60
