"""Helpers shared by the service tests (imported by name; conftest puts this folder on sys.path).

A simulated federation runs the wire protocol through an in-process HTTP client
(``httpx.ASGITransport``, no sockets) with random node sets and float32 matrices.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI

from clients.local.processes import ServedService as ServedProcess
from clients.local.processes import glasu_command, without_glasu_settings
from clients.local.processes import start_serve as start_glasu_serve
from secure.protocol import part_count, part_span
from service.clock import ManualClock, Timer

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "admin-token-for-tests-0123456789"
INT64_LE = np.dtype("<i8")
FLOAT32_LE = np.dtype("<f4")
WOKEN_WITHIN = 60.0  # seconds: a bound on a failing test only, never reached by a passing one


def http_client(app: FastAPI, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, **kwargs), base_url="http://glasu.test"
    )


class LongPollClock(ManualClock):
    """A :class:`ManualClock` that tells a test when a long poll waits: a poll sets its
    deadline's timer right after its first check answered "not yet", just before it waits.
    Nothing here depends on how fast the machine is: the clock moves only by :meth:`advance`."""

    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[float] = []  # the time of every timer set, in order
        self._timer_set: asyncio.Event | None = None

    def call_at(self, at: float, callback: Callable[[], None]) -> Timer:
        timer = super().call_at(at, callback)
        self.deadlines.append(at)
        if self._timer_set is not None:
            self._timer_set.set()
        return timer

    async def waiting(self, request: Awaitable[httpx.Response]) -> asyncio.Future[httpx.Response]:
        """The long poll ``request``, started and waiting (or already answered)."""
        self._timer_set = timer_set = asyncio.Event()
        poll = asyncio.ensure_future(request)
        watch = asyncio.ensure_future(timer_set.wait())
        try:
            await asyncio.wait({poll, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            self._timer_set = None
        return poll


async def woken(poll: Awaitable[httpx.Response]) -> httpx.Response:
    """The answer of a waiting long poll that the test has woken (by what it did, or by advancing
    the clock); a poll nobody wakes fails the test after WOKEN_WITHIN real seconds."""
    async with asyncio.timeout(WOKEN_WITHIN):
        return await poll


def admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def session_request(**overrides: Any) -> dict[str, Any]:
    """A small plaintext session: M=3, L=3, aggregation after layers 1 and 3, 5 passes."""
    rng = np.random.default_rng(7)
    request: dict[str, Any] = {
        "clients": 3,
        "layers": 3,
        "agg_layers": [{"layer": 1, "width": 8}, {"layer": 3, "width": 4}],
        "stale": 2,
        "rounds": 3,
        "eval_every": 2,
        "batch_size": 5,
        "fanout": 2,
        "num_nodes": 60,
        "train_nodes": list(range(30)),
        "eval_nodes": [int(n) for n in rng.permutation(np.arange(40, 60))],
        "seed": 11,
        "encryption": "none",
    }
    request.update(overrides)
    return request


# A session with differential privacy aggregates at the private arrangement's release layer only
# (secure.privacy.RELEASE_LAYER); the service refuses any other aggregation layers.
PRIVATE_AGG_LAYERS: list[dict[str, int]] = [{"layer": 1, "width": 8}]


def private_session_request(privacy: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """:func:`session_request` with ``privacy`` and the private arrangement's one aggregation
    layer (M=3, L=3, 5 passes)."""
    return session_request(**{"agg_layers": PRIVATE_AGG_LAYERS, "privacy": privacy, **overrides})


async def create_session(http: httpx.AsyncClient, **overrides: Any) -> dict[str, Any]:
    response = await http.post("/v1/sessions", json=session_request(**overrides), headers=admin())
    assert response.status_code == 201, response.text
    return response.json()


def client_path(sid: str, m: int) -> str:
    return f"/v1/sessions/{sid}/clients/{m}"


def node_headers(nodes: np.ndarray) -> dict[str, str]:
    return {
        "Content-Type": "application/octet-stream",
        "X-Glasu-Shape": str(len(nodes)),
        "X-Glasu-Encoding": "int64",
    }


def matrix_headers(rows: int, cols: int, encoding: str = "float32") -> dict[str, str]:
    return {
        "Content-Type": "application/octet-stream",
        "X-Glasu-Shape": f"{rows},{cols}",
        "X-Glasu-Encoding": encoding,
    }


def nodes_body(nodes: list[int] | np.ndarray) -> bytes:
    return np.asarray(nodes, dtype=INT64_LE).tobytes()


def assert_problem(response: httpx.Response, status: int, slug: str, *, mentions: str = "") -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"].endswith("/" + slug), problem
    assert problem["status"] == status
    assert problem["detail"], problem
    assert mentions.lower() in problem["detail"].lower(), problem


def expected_sum(shares: dict[int, np.ndarray]) -> np.ndarray:
    """float32 sum in client order 0..M-1, starting from zeros, as the service computes it."""
    total = np.zeros_like(shares[0], dtype=np.float32)
    for m in sorted(shares):
        total += shares[m]
    return total


@dataclass
class PassRecord:
    """What every client sent and got back in one pass (per layer, per client)."""

    info: dict[str, Any]
    node_sets: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    unions: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    shares: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    sums: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    counts: dict[int, set[int]] = field(default_factory=dict)


class Federation:
    """M simulated clients following docs/protocol.md, each as its own asyncio task."""

    def __init__(
        self, http: httpx.AsyncClient, created: dict[str, Any], request: dict[str, Any]
    ) -> None:
        self.http = http
        self.sid: str = created["session_id"]
        self.tokens: list[str] = created["client_tokens"]
        self.request = request
        self.rng = np.random.default_rng(123)

    @property
    def node_layers(self) -> list[int]:
        """Aggregation layers below the top, top-down (the order of the node exchange)."""
        top = self.request["layers"]
        below = [a["layer"] for a in self.request["agg_layers"] if a["layer"] < top]
        return sorted(below, reverse=True)

    async def run_pass(self, p: int) -> PassRecord:
        clients = range(len(self.tokens))
        infos = await asyncio.gather(*(self.pass_info(m, p) for m in clients))
        assert all(info == infos[0] for info in infos)
        record = PassRecord(info=infos[0])
        if infos[0]["kind"] != "done":
            await asyncio.gather(*(self._client(m, p, record) for m in clients))
        return record

    async def pass_info(self, m: int, p: int) -> dict[str, Any]:
        response = await self.http.get(
            f"{client_path(self.sid, m)}/passes/{p}", headers=bearer(self.tokens[m])
        )
        assert response.status_code == 200, response.text
        return response.json()

    async def _client(self, m: int, p: int, record: PassRecord) -> None:
        base = f"{client_path(self.sid, m)}/passes/{p}/layers"
        auth = bearer(self.tokens[m])
        output = np.asarray(record.info["output_nodes"], dtype=np.int64)
        rows: dict[int, int] = {self.request["layers"]: len(output)}
        # an evaluation pass exchanges no node sets: every layer's rows are all the nodes
        evaluation = record.info["kind"] == "eval"
        for layer in [] if evaluation else self.node_layers:
            sampled = self.rng.choice(self.request["num_nodes"], size=6)
            nodes = np.unique(np.concatenate([output, sampled])).astype(np.int64)
            record.node_sets.setdefault(layer, {})[m] = nodes
            put = await self.http.put(
                f"{base}/{layer}/nodes",
                content=nodes_body(nodes),
                headers={**auth, **node_headers(nodes)},
            )
            assert put.status_code == 201, put.text
            union = await self.long_poll(f"{base}/{layer}/nodes", auth)
            assert union.headers["X-Glasu-Encoding"] == "int64"
            ids = np.frombuffer(union.content, dtype=INT64_LE)
            assert int(union.headers["X-Glasu-Shape"]) == len(ids)
            record.unions.setdefault(layer, {})[m] = ids
            rows[layer] = len(ids)
        for agg in self.request["agg_layers"]:
            layer, width = agg["layer"], agg["width"]
            layer_rows = self.request["num_nodes"] if evaluation else rows[layer]
            share = self.rng.standard_normal((layer_rows, width)).astype(np.float32)
            record.shares.setdefault(layer, {})[m] = share
            parts = part_count(layer_rows, width)
            summed = []
            for part in range(parts):  # upload part k, fetch its sum, then part k + 1
                start, stop = part_span(part, rows=layer_rows, cols=width)
                put = await self.http.put(
                    f"{base}/{layer}/embedding",
                    params={"part": part, "parts": parts},
                    content=share[start:stop].astype(FLOAT32_LE).tobytes(),
                    headers={**auth, **matrix_headers(stop - start, width)},
                )
                assert put.status_code == 201, put.text
                total = await self.long_poll(f"{base}/{layer}/aggregate", auth, part=part)
                assert total.headers["X-Glasu-Shape"] == f"{stop - start},{width}"
                assert total.headers["X-Glasu-Encoding"] == "float32"
                record.counts.setdefault(layer, set()).add(int(total.headers["X-Glasu-Count"]))
                summed.append(
                    np.frombuffer(total.content, dtype=FLOAT32_LE).reshape(stop - start, width)
                )
            record.sums.setdefault(layer, {})[m] = np.concatenate(summed)

    async def long_poll(self, path: str, auth: dict[str, str], *, part: int = 0) -> httpx.Response:
        params = {"wait": 5} if part == 0 else {"wait": 5, "part": part}
        for _ in range(100):
            response = await self.http.get(path, params=params, headers=auth)
            if response.status_code == 200:
                return response
            assert response.status_code == 202, response.text
        raise AssertionError(f"{path} never completed")


# The served process: `glasu serve` as deploy/Dockerfile.service runs it.


def start_serve(
    tmp_path: Path,
    database: Path,
    *,
    name: str = "serve",
    bootstrap: str | None = None,
    extra_args: tuple[str, ...] = (),
    tls_dir: Path | None = None,
) -> ServedProcess:
    """:func:`clients.local.processes.start_serve` with the test admin token, from the
    checkout, without the caller's GLASU_* variables. ``bootstrap``: run ``python -c
    <bootstrap> serve ...`` instead, Python code that prepares the process and then calls
    ``clients.cli.main.main(sys.argv[1:])`` itself."""
    command = glasu_command
    if bootstrap is not None:
        command = lambda *args: [sys.executable, "-c", bootstrap, *args]  # noqa: E731
    return start_glasu_serve(
        tmp_path, admin_token=ADMIN_TOKEN, database=database, name=name, extra_args=extra_args,
        tls_dir=tls_dir, command=command, cwd=ROOT, env=without_glasu_settings(),
    )  # fmt: skip


def database_sql(database: Path | str, *statements: str) -> list[list[tuple[Any, ...]]]:
    """Run ``statements`` on the service's database directly (SQLite file or PostgreSQL URL),
    in one committed transaction, as a crash or an operator would leave it; each one's rows."""
    if isinstance(database, Path):
        import sqlite3

        with sqlite3.connect(database) as db:
            results = [db.execute(s).fetchall() for s in statements]
        db.close()
        return results
    import psycopg

    with psycopg.connect(database) as pg:
        return [_rows(pg.execute(s)) for s in statements]  # type: ignore[arg-type]


def _rows(cursor: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def waits_on_a_lock(url: str) -> bool:
    """Whether a transaction of the service waits for a lock another one holds."""
    import psycopg

    with psycopg.connect(url) as pg:
        (waiting,) = pg.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'glasu' AND wait_event_type = 'Lock'"
        ).fetchone()  # type: ignore[misc]
    return bool(waiting)


def until_a_transaction_waits_on_a_lock(url: str) -> None:
    """Return once a transaction of the service waits for a lock another one holds: the order
    a test wants, seen in PostgreSQL rather than hoped for after a sleep."""
    deadline = time.monotonic() + WOKEN_WITHIN
    while not waits_on_a_lock(url):
        assert time.monotonic() < deadline, "no transaction waited on a lock"
