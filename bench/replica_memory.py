"""The service's memory under large shares: one SQLite process against three PostgreSQL
replicas behind HAProxy (issue 35: "after 16 clients uploaded 16 MiB shares, the replicas'
summed RSS went from 850 MiB to 2.3 GiB and stayed near 2.0 GiB").

One session of ``--clients`` clients (default 16), one pass whose only aggregation layer is a
``--rows`` x ``--cols`` float32 share per client (default 4096 x 1024: 16 MiB, four parts of
4 MiB); every client uploads its parts, then long-polls every part's sum; then the admin closes
the session. The summed RSS of the ``glasu serve`` processes (not PostgreSQL's, not
HAProxy's) is sampled from /proc every 50 ms: idle before the session, its peak, once every
client has its sums, and after the close (``--settle`` seconds later). Figures are ratios to
the idle RSS of the same set-up in the same run.

    python -m bench.replica_memory [--clients 16] [--rows 4096] [--cols 1024] [--repeats 1]
    python -m bench.replica_memory --json bench/results/replica_memory.json
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.load import Backend, serving, session_body
from bench.startup import rss_mb
from secure.protocol import part_count, part_span
from secure.wire.headers import AUTHORIZATION_HEADER, ENCODING_HEADER, SHAPE_HEADER

SAMPLE_SECONDS = 0.05
TIMEOUT_SECONDS = 120.0


class RssSampler:
    """The summed RSS (MiB) of some processes, sampled in a thread until stopped."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> float:
        return sum(rss_mb(pid) for pid in self.pids)

    def __enter__(self) -> RssSampler:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, self.now())


def one_run(
    backend: Backend, replicas: int, *, clients: int, rows: int, cols: int, settle: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="glasu-memory-") as tmp:
        admin_token = secrets.token_urlsafe(24)
        extra = ["--max-body-bytes", str(2 * rows * cols * 4)]
        with serving(
            Path(tmp), backend=backend, replicas=replicas, admin_token=admin_token,
            extra_args=extra,
        ) as (url, pids):  # fmt: skip
            sampler = RssSampler(pids)
            idle = sampler.now()
            admin = {AUTHORIZATION_HEADER: f"Bearer {admin_token}"}
            body = session_body(clients=clients, rows=rows, cols=cols, rounds=1, seed=0)
            body["eval_every"] = 0
            with httpx.Client(base_url=url, headers=admin, timeout=TIMEOUT_SECONDS) as http:
                created = http.post("/v1/sessions", json=body)
                created.raise_for_status()
                sid = created.json()["session_id"]
                tokens = created.json()["client_tokens"]
                with sampler:
                    started = time.perf_counter()
                    with ThreadPoolExecutor(clients) as pool:
                        list(
                            pool.map(
                                lambda m: _client(url, sid, m, tokens[m], cols), range(clients)
                            )
                        )
                    wall = time.perf_counter() - started
                    after_pass = sampler.now()
                    http.delete(f"/v1/sessions/{sid}").raise_for_status()
                    time.sleep(settle)
                    after_close = sampler.now()
                peak = sampler.peak
    return {
        "backend": backend,
        "replicas": replicas,
        "idle_mb": round(idle, 1),
        "peak_mb": round(peak, 1),
        "after_pass_mb": round(after_pass, 1),
        "after_close_mb": round(after_close, 1),
        "peak_over_idle": round(peak / idle, 2),
        "after_close_over_idle": round(after_close / idle, 2),
        "pass_seconds": round(wall, 2),
    }


def _client(url: str, sid: str, m: int, token: str, cols: int) -> None:
    base = f"/v1/sessions/{sid}/clients/{m}"
    headers = {AUTHORIZATION_HEADER: f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=TIMEOUT_SECONDS) as http:
        info = http.get(f"{base}/passes/0")
        info.raise_for_status()
        rows = len(info.json()["output_nodes"])
        parts = part_count(rows, cols)
        share = np.random.default_rng(m).normal(size=(rows, cols)).astype(np.float32)
        for part in range(parts):
            start, stop = part_span(part, rows=rows, cols=cols)
            put = http.put(
                f"{base}/passes/0/layers/1/embedding",
                params={"part": part, "parts": parts},
                content=share[start:stop].tobytes(),
                headers={
                    "Content-Type": "application/octet-stream",
                    SHAPE_HEADER: f"{stop - start},{cols}",
                    ENCODING_HEADER: "float32",
                },
            )
            if put.status_code not in (200, 201):
                raise RuntimeError(f"client {m} part {part}: {put.status_code} {put.text[:200]}")
        del share
        for part in range(parts):
            while True:
                got = http.get(
                    f"{base}/passes/0/layers/1/aggregate",
                    params={"part": part, "wait": 30},
                )
                if got.status_code != 202:
                    break
            if got.status_code != 200:
                raise RuntimeError(f"client {m} sum {part}: {got.status_code} {got.text[:200]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the close")
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args()
    setups: list[tuple[Backend, int]] = [("sqlite", 1), ("postgresql", 3)]
    if args.backend != "both":
        setups = [s for s in setups if s[0] == args.backend]
    runs = []
    for _ in range(args.repeats):
        for backend, replicas in setups:
            result = one_run(
                backend, replicas, clients=args.clients, rows=args.rows, cols=args.cols,
                settle=args.settle,
            )  # fmt: skip
            print(json.dumps(result), flush=True)
            runs.append(result)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
