"""Load on the aggregation service: many concurrent sessions over real HTTP on loopback.

Real ``glasu serve`` processes: one on SQLite (the default), or ``--replicas N`` on one
PostgreSQL database (``--backend postgresql``: a throwaway cluster, tests/support/postgres.py)
behind HAProxy (tests/support/replicas.py). S sessions of M clients each (default 20 x 3), every
client a thread that follows its session's passes: ``GET /passes/{p}``, ``PUT`` its share of the top
layer (rows x cols, default 200 x 128), long-poll ``GET`` the aggregate. Shares are encoded once
per client before the clock starts (the load is the service's, not the encoder's): float32 in
plaintext, CKKS ciphertexts with ``--ckks``. Reports passes per second over all sessions, p50 and
p99 latency of uploads and downloads, the service's CPU seconds and RSS (its ``glasu serve``
processes, not PostgreSQL's or HAProxy's), time-outs and every error. With ``--stage-seconds T``
every client stops after T seconds (a request over 60 s is a time-out and ends its client).

    python -m bench.load [--sessions 20] [--clients 3] [--rounds 10] [--ckks]
    python -m bench.load --backend postgresql --replicas 3 --sessions 60 --stage-seconds 60
    python -m bench.load --both        # plaintext, then CKKS; writes bench/results/load.json
    python -m bench.load --breaking-points   # one SQLite process vs three PostgreSQL replicas
                                             # at 60x3, 120x3, 10x16, 4x64; interleaved;
                                             # bench/results/load_backends.json, docs/results.md
    python -m bench.load --breaking-points --docs-only   # the docs section from that file
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

from bench.results_doc import add_results_arguments, rewrote_docs_only, write_json, write_section
from bench.startup import cpu_seconds, rss_mb
from clients.local.processes import start_serve
from secure.aggregation import PlainCodec
from secure.wire.headers import AUTHORIZATION_HEADER, ENCODING_HEADER, SHAPE_HEADER
from tests.support.replicas import HAProxy, start_replicas

ROOT = Path(__file__).resolve().parents[1]
#: the command-line arguments that are :func:`run`'s settings
RUN_ARGUMENTS = ("sessions", "clients", "rows", "cols", "rounds", "backend", "replicas",
                 "stage_seconds")  # fmt: skip

OUT = ROOT / "bench" / "results" / "load.json"
BACKENDS_OUT = ROOT / "bench" / "results" / "load_backends.json"
SECTION = "load-backends"

Backend = Literal["sqlite", "postgresql"]

#: The breaking points of one SQLite process (issue 26): sessions x clients per session.
BREAKING_POINTS = ((60, 3), (120, 3), (10, 16), (4, 64))
#: What each is run on: one SQLite process, then three PostgreSQL replicas behind HAProxy.
SETUPS: tuple[tuple[Backend, int], ...] = (("sqlite", 1), ("postgresql", 3))
#: 6 passes per session (5 rounds and the final evaluation) in a stage of 60 s: as measured in
#: the issue (60 x 3: 360 passes planned).
STAGE_ROUNDS, STAGE_SECONDS = 5, 60.0
#: The longest long poll a client asks for, and how long any request may take before it is a
#: time-out (which ends its client).
WAIT_SECONDS, REQUEST_TIMEOUT_SECONDS = 30.0, 60.0


@dataclass
class Timings:
    upload: list[float] = field(default_factory=list)
    download: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    timeouts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            getattr(self, kind).append(seconds)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def timeout(self) -> None:
        with self.lock:
            self.timeouts += 1


def session_body(*, clients: int, rows: int, cols: int, rounds: int, seed: int) -> dict[str, Any]:
    """A session whose only aggregation is the top layer: every pass is one upload and one
    download of rows x cols per client (rows = the batch size)."""
    return {
        "clients": clients,
        "layers": 1,
        "agg_layers": [{"layer": 1, "width": cols}],
        "stale": 1,
        "rounds": rounds,
        "eval_every": 0,
        "batch_size": rows,
        "fanout": 1,
        "num_nodes": 10 * rows,
        "train_nodes": list(range(5 * rows)),
        "eval_nodes": list(range(5 * rows, 5 * rows + rows)),
        "seed": seed,
        "encryption": "none",
        "privacy": None,
        "label": "bench/load.py",
    }


def follow(
    http: httpx.Client,
    base: str,
    payload: bytes,
    encoding: str,
    cols: int,
    timings: Timings,
    deadline: float = float("inf"),
) -> int:
    """One client through its session until it is done or ``time.monotonic()`` passes
    ``deadline``; returns the passes done."""
    passes = 0
    while time.monotonic() < deadline:
        got = http.get(f"{base}/passes/{passes}")
        if got.status_code != 200:
            timings.error(f"pass info {got.status_code}: {got.text[:200]}")
            return passes
        info = got.json()
        if info["kind"] == "done":
            return passes
        rows = len(info["output_nodes"])
        started = time.perf_counter()
        put = http.put(
            f"{base}/passes/{passes}/layers/1/embedding",
            content=payload,
            headers={
                "Content-Type": "application/octet-stream",
                SHAPE_HEADER: f"{rows},{cols}",
                ENCODING_HEADER: encoding,
            },
        )
        timings.add("upload", time.perf_counter() - started)
        if put.status_code not in (200, 201):
            timings.error(f"upload {put.status_code}: {put.text[:200]}")
            return passes
        started = time.perf_counter()
        while (left := deadline - time.monotonic()) > 0:
            wait = min(WAIT_SECONDS, left)
            got = http.get(f"{base}/passes/{passes}/layers/1/aggregate", params={"wait": wait})
            if got.status_code != 202:
                break
        if got.status_code == 202:
            return passes  # the stage ended while this client waited
        timings.add("download", time.perf_counter() - started)
        if got.status_code != 200:
            timings.error(f"download {got.status_code}: {got.text[:200]}")
            return passes
        passes += 1
    return passes


@contextmanager
def throwaway_postgres() -> Iterator[Any]:
    """A PostgreSQL cluster (tests/support/postgres.py) in a folder of its own: as root the server
    runs as ``postgres``, which must reach its folder."""
    from tests.support.postgres import PostgresCluster

    with (
        tempfile.TemporaryDirectory(prefix="glasu-load-pg-") as tmp,
        PostgresCluster.start(Path(tmp)) as cluster,
    ):
        yield cluster


@contextmanager
def serving(
    root: Path,
    *,
    backend: Backend,
    replicas: int,
    admin_token: str,
    extra_args: Sequence[str],
    database: str | None = None,
) -> Iterator[tuple[str, list[int]]]:
    """(URL, pids of the ``glasu serve`` processes): one process on SQLite in ``root``, or
    ``replicas`` on PostgreSQL database ``database`` (default: a throwaway cluster's), behind
    HAProxy when more than one."""
    with ExitStack() as stack:
        if backend == "sqlite":
            if replicas != 1:
                raise ValueError("SQLite is one process: --replicas needs --backend postgresql")
            served = start_serve(root, admin_token=admin_token, extra_args=extra_args, cwd=ROOT)
            stack.callback(served.stop, grace=30)
            served.wait_healthy()
            yield served.url, [served.process.pid]
            return
        if database is None:
            database = stack.enter_context(throwaway_postgres()).new_database("load")
        group = stack.enter_context(
            start_replicas(replicas, database, root, admin_token=admin_token, extra_args=extra_args)
        )
        pids = [served.process.pid for served in group.services]
        if replicas == 1:
            yield group.urls[0], pids
            return
        proxy = stack.enter_context(HAProxy.start(group.urls, root))
        yield proxy.url, pids


def run(
    *,
    sessions: int,
    clients: int,
    rows: int,
    cols: int,
    rounds: int,
    ckks: bool,
    backend: Backend = "sqlite",
    replicas: int = 1,
    stage_seconds: float | None = None,
    database: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="glasu-load-") as tmp:
        root = Path(tmp)
        admin_token = secrets.token_urlsafe(24)
        extra_args: list[str] = []
        codec: Any = PlainCodec()
        if ckks:
            from secure.ckks import CkksCodec, generate_keys

            secret, public = generate_keys(root / "keys")
            codec = CkksCodec.from_file(secret)
            extra_args += ["--public-context", str(public)]
        with serving(
            root,
            backend=backend,
            replicas=replicas,
            admin_token=admin_token,
            extra_args=extra_args,
            database=database,
        ) as (url, pids):
            jobs = create_sessions(
                url, admin_token, codec, encryption="ckks" if ckks else "none",
                sessions=sessions, clients=clients, rows=rows, cols=cols, rounds=rounds,
            )  # fmt: skip
            timings = Timings()
            done: list[int] = []
            cpu_before = sum(cpu_seconds(pid) for pid in pids)
            started = time.perf_counter()
            deadline = time.monotonic() + (stage_seconds or float("inf"))

            def client(job: tuple[str, int, str, bytes, str]) -> None:
                session_id, m, token, payload, encoding = job
                base = f"/v1/sessions/{session_id}/clients/{m}"
                with httpx.Client(
                    base_url=url,
                    headers={AUTHORIZATION_HEADER: f"Bearer {token}"},
                    timeout=REQUEST_TIMEOUT_SECONDS,
                ) as http:
                    try:
                        done.append(follow(http, base, payload, encoding, cols, timings, deadline))
                    except httpx.TimeoutException:
                        timings.timeout()
                    except Exception as exc:  # a thread's failure must count, not just print
                        timings.error(f"{type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=client, args=(job,)) for job in jobs]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_before
            rss = sum(rss_mb(pid) for pid in pids)
    passes = sum(done) / clients  # session passes (each client counts its session's)
    return {
        "backend": backend,
        "replicas": replicas,
        "encryption": "ckks" if ckks else "none",
        "sessions": sessions,
        "clients": clients,
        "share": [rows, cols],
        "passes_per_session": rounds + 1,
        "passes_done": passes,
        "stage_seconds": stage_seconds,
        "wall_seconds": round(wall, 2),
        "passes_per_second": round(passes / wall, 2),
        "upload_ms": _percentiles(timings.upload),
        "download_ms": _percentiles(timings.download),
        "service_cpu_seconds": round(cpu, 2),
        "service_cpu_per_pass_ms": round(1000 * cpu / max(passes, 1), 1),
        "service_rss_mb": round(rss, 1),
        "share_bytes": len(jobs[0][3]),
        "timeouts": timings.timeouts,
        "errors": timings.errors[:20],
        "error_count": len(timings.errors),
    }


def create_sessions(
    url: str,
    admin_token: str,
    codec: Any,
    *,
    encryption: str,
    sessions: int,
    clients: int,
    rows: int,
    cols: int,
    rounds: int,
) -> list[tuple[str, int, str, bytes, str]]:
    """(session id, client, token, encoded share, encoding) of every client of ``sessions``
    new sessions."""
    rng = np.random.default_rng(0)
    jobs = []
    with httpx.Client(
        base_url=url, headers={AUTHORIZATION_HEADER: f"Bearer {admin_token}"}, timeout=60
    ) as admin:
        for s in range(sessions):
            body = session_body(clients=clients, rows=rows, cols=cols, rounds=rounds, seed=s)
            body["encryption"] = encryption
            response = admin.post("/v1/sessions", json=body)
            if response.status_code != 201:
                raise RuntimeError(
                    f"session {s} refused: {response.status_code} {response.text[:300]}"
                )
            created = response.json()
            for m, token in enumerate(created["client_tokens"]):
                share = rng.normal(size=(rows, cols)).astype(np.float32)
                jobs.append((created["session_id"], m, token, codec.encode(share), codec.encoding))
    return jobs


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": round(1000 * statistics.median(ordered), 1), "p99": round(1000 * p99, 1)}


def breaking_points(*, repeats: int, rows: int, cols: int, ckks: bool) -> dict[str, Any]:
    """Every point of :data:`BREAKING_POINTS` on every setup of :data:`SETUPS`, one stage of
    :data:`STAGE_SECONDS` each, ``repeats`` times; the setups interleaved (which goes first
    alternates), each PostgreSQL stage on a fresh database of one cluster."""
    started = {"loadavg": os.getloadavg()[0], "time": time.strftime("%Y-%m-%d %H:%M")}
    runs = []
    with throwaway_postgres() as cluster:
        for repeat in range(repeats):
            for i, (sessions, clients) in enumerate(BREAKING_POINTS):
                order = SETUPS if (repeat + i) % 2 == 0 else SETUPS[::-1]
                for backend, replicas in order:
                    database = None
                    if backend == "postgresql":
                        database = cluster.new_database(f"load_{repeat}_{i}")
                    result = run(
                        sessions=sessions, clients=clients, rows=rows, cols=cols,
                        rounds=STAGE_ROUNDS, ckks=ckks, backend=backend,
                        replicas=replicas, stage_seconds=STAGE_SECONDS, database=database,
                    )  # fmt: skip
                    runs.append({**result, "repeat": repeat})
                    print(_one_line(result), file=sys.stderr, flush=True)
    machine = {
        "cpus": os.cpu_count(),
        "loadavg_start": round(started["loadavg"], 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
        "started": started["time"],
    }
    return {"machine": machine, "runs": runs}


def _one_line(result: dict[str, Any]) -> str:
    return (
        f"{result['sessions']}x{result['clients']} {result['backend']} x{result['replicas']}: "
        f"{result['passes_done']:.0f} passes, {result['passes_per_second']} /s, "
        f"p99 up {result['upload_ms']['p99']} ms, down {result['download_ms']['p99']} ms, "
        f"{result['timeouts']} time-outs, {result['error_count']} errors"
    )


def ratios(runs: list[dict[str, Any]], sessions: int, clients: int) -> dict[str, list[float]]:
    """Per repeat, three PostgreSQL replicas against one SQLite process at one point: passes
    per second (above 1: more) and p99 latencies (below 1: shorter)."""
    found: dict[str, list[float]] = {"passes_per_second": [], "upload_p99": [], "download_p99": []}
    at_point = [r for r in runs if (r["sessions"], r["clients"]) == (sessions, clients)]
    for repeat in sorted({r["repeat"] for r in at_point}):
        pair = {r["backend"]: r for r in at_point if r["repeat"] == repeat}
        if set(pair) != {"sqlite", "postgresql"}:
            continue
        sqlite, postgres = pair["sqlite"], pair["postgresql"]
        found["passes_per_second"].append(
            postgres["passes_per_second"] / max(sqlite["passes_per_second"], 1e-9)
        )
        for kind in ("upload", "download"):
            found[f"{kind}_p99"].append(
                postgres[f"{kind}_ms"]["p99"] / max(sqlite[f"{kind}_ms"]["p99"], 1e-9)
            )
    return found


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _setup_cell(runs: list[dict[str, Any]]) -> str:
    """Passes done of those planned, passes/s, p99 up / down, failures: median over repeats."""
    if not runs:
        return "-"
    planned = runs[0]["sessions"] * runs[0]["passes_per_session"]

    def median(key: Any) -> float:
        return statistics.median(key(r) for r in runs)

    return (
        f"{median(lambda r: r['passes_done']):.0f} of {planned}, "
        f"{median(lambda r: r['passes_per_second']):.1f}/s, "
        f"{median(lambda r: r['upload_ms']['p99']):.0f} / "
        f"{median(lambda r: r['download_ms']['p99']):.0f} ms, "
        f"{median(lambda r: r['timeouts'] + r['error_count']):.0f}, "
        f"{median(lambda r: r['service_cpu_per_pass_ms']):.0f} ms"
    )


def backends_markdown(payload: dict[str, Any]) -> str:
    runs, machine = payload["runs"], payload["machine"]
    repeats = len({r["repeat"] for r in runs})
    lines = [
        "## Load: one SQLite process against three PostgreSQL replicas (`bench/load.py`)",
        "",
        f"The breaking points of one `glasu serve` on SQLite (issue 26), each a stage of "
        f"{STAGE_SECONDS:.0f} s: every client a thread of one load-generator process that "
        f"follows its session ({STAGE_ROUNDS + 1} passes: `PUT` a 200 x 128 float32 share, "
        "long-poll the sum); a request over 60 s is a time-out and ends its client. Against it, "
        "three `glasu serve` replicas on one PostgreSQL database (a local cluster) behind "
        "HAProxy (round robin per request, tests/support/replicas.py). The two setups "
        f"interleaved, {repeats} time(s); ratios are PostgreSQL x3 over SQLite x1 per pair of "
        f"stages, median (min-max). {machine['cpus']} CPUs on one machine for the load generator, "
        f"the services, PostgreSQL and HAProxy; load average {machine['loadavg_start']} at the "
        f"start, {machine['loadavg_end']} at the end; run {machine['started']}.",
        "",
        "```",
        ".venv/bin/python -m bench.load --breaking-points",
        "```",
        "",
        "Each setup's cell: session passes done of those planned, passes/s, upload / download "
        "p99, time-outs and errors, and the service's CPU per pass (all its processes; "
        "PostgreSQL's own not counted). On one machine of 2 cores the replicas share the cores "
        "that one process already had, with the load generator: what they add is the loss of a "
        "replica without a stop (tests/e2e/test_replicas.py) and room on more cores or "
        "machines. One process uses at most one core (the GIL), so 1000 / (CPU ms per pass) is "
        "its ceiling in passes/s; R replicas, each on a core of its own, reach about "
        "1000 x R / (CPU ms per pass), PostgreSQL's CPU aside (a projection, not measured "
        "here).",
        "",
        "| sessions x clients | SQLite, 1 process | PostgreSQL, 3 replicas | passes/s ratio "
        "| upload p99 ratio | download p99 ratio |",
        "|---|---|---|---|---|---|",
    ]
    for sessions, clients in BREAKING_POINTS:
        at_point = [r for r in runs if (r["sessions"], r["clients"]) == (sessions, clients)]
        found = ratios(runs, sessions, clients)
        cells = [
            _setup_cell([r for r in at_point if r["backend"] == backend]) for backend, _ in SETUPS
        ]
        lines.append(
            f"| {sessions} x {clients} | {cells[0]} | {cells[1]} "
            f"| {_spread(found['passes_per_second'])} | {_spread(found['upload_p99'])} "
            f"| {_spread(found['download_p99'])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--cols", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ckks", action="store_true", help="CKKS ciphertexts instead of float32")
    parser.add_argument("--both", action="store_true", help="plaintext, then CKKS; write JSON")
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--replicas", type=int, default=1, help="glasu serve processes")
    parser.add_argument("--stage-seconds", type=float, default=None, help="stop clients after")
    parser.add_argument(
        "--breaking-points",
        action="store_true",
        help="SQLite x1 vs PostgreSQL x3 at 60x3, 120x3, 10x16, 4x64; write --out and docs",
    )
    parser.add_argument("--repeats", type=int, default=1, help="of --breaking-points")
    add_results_arguments(parser, BACKENDS_OUT)
    args = parser.parse_args()
    if args.backend == "sqlite" and args.replicas != 1:
        parser.error("SQLite is one process: --replicas needs --backend postgresql")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.breaking_points:
        if rewrote_docs_only(args, SECTION, backends_markdown):
            return 0
        payload = breaking_points(
            repeats=args.repeats, rows=args.rows, cols=args.cols, ckks=args.ckks
        )
        write_json(args.out, payload)
        write_section(SECTION, backends_markdown(payload))
        print(backends_markdown(payload))
        return 1 if any(r["error_count"] for r in payload["runs"]) else 0
    settings = {name: getattr(args, name) for name in RUN_ARGUMENTS}
    modes = (False, True) if args.both else (args.ckks,)
    results = [run(**settings, ckks=ckks) for ckks in modes]
    print(json.dumps(results, indent=2))
    if args.both:
        OUT.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any(r["error_count"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
