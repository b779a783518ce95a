"""Load on one aggregation service: many concurrent sessions over real HTTP on loopback.

A real ``glasu serve`` process; S sessions of M clients each (default 20 x 3), every client a
thread that follows its session's passes: ``GET /passes/{p}``, ``PUT`` its share of the top
layer (rows x cols, default 200 x 128), long-poll ``GET`` the aggregate. Shares are encoded once
per client before the clock starts (the load is the service's, not the encoder's): float32 in
plaintext, CKKS ciphertexts with ``--ckks``. Reports passes per second over all sessions, p50 and
p99 latency of uploads and downloads, the service's CPU seconds and RSS, and every error.

    python -m bench.load [--sessions 20] [--clients 3] [--rounds 10] [--ckks]
    python -m bench.load --both        # plaintext, then CKKS; writes bench/results/load.json
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.startup import cpu_seconds, rss_mb
from clients.local.processes import start_serve
from secure.aggregation import PlainCodec

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "bench" / "results" / "load.json"


@dataclass
class Timings:
    upload: list[float] = field(default_factory=list)
    download: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float) -> None:
        with self.lock:
            getattr(self, kind).append(seconds)

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


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
    http: httpx.Client, base: str, payload: bytes, encoding: str, cols: int, timings: Timings
) -> int:
    """One client through its session; returns the passes done."""
    passes = 0
    while True:
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
                "X-Glasu-Shape": f"{rows},{cols}",
                "X-Glasu-Encoding": encoding,
            },
        )
        timings.add("upload", time.perf_counter() - started)
        if put.status_code not in (200, 201):
            timings.error(f"upload {put.status_code}: {put.text[:200]}")
            return passes
        started = time.perf_counter()
        while True:
            got = http.get(f"{base}/passes/{passes}/layers/1/aggregate", params={"wait": 30})
            if got.status_code != 202:
                break
        timings.add("download", time.perf_counter() - started)
        if got.status_code != 200:
            timings.error(f"download {got.status_code}: {got.text[:200]}")
            return passes
        passes += 1


def run(
    *, sessions: int, clients: int, rows: int, cols: int, rounds: int, ckks: bool
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
        served = start_serve(root, admin_token=admin_token, extra_args=extra_args, cwd=ROOT)
        service, url = served.process, served.url
        try:
            served.wait_healthy()
            admin = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60
            )
            rng = np.random.default_rng(0)
            jobs = []
            for s in range(sessions):
                body = session_body(clients=clients, rows=rows, cols=cols, rounds=rounds, seed=s)
                body["encryption"] = "ckks" if ckks else "none"
                response = admin.post("/v1/sessions", json=body)
                if response.status_code != 201:
                    raise RuntimeError(
                        f"session {s} refused: {response.status_code} {response.text[:300]}"
                    )
                created = response.json()
                for m, token in enumerate(created["client_tokens"]):
                    share = rng.normal(size=(rows, cols)).astype(np.float32)
                    jobs.append(
                        (created["session_id"], m, token, codec.encode(share), codec.encoding)
                    )
            timings = Timings()
            done: list[int] = []
            cpu_before = cpu_seconds(service.pid)

            def client(job: tuple[str, int, str, bytes, str]) -> None:
                session_id, m, token, payload, encoding = job
                base = f"/v1/sessions/{session_id}/clients/{m}"
                with httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120
                ) as http:
                    try:
                        done.append(follow(http, base, payload, encoding, cols, timings))
                    except Exception as exc:  # a thread's failure must count, not just print
                        timings.error(f"{type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=client, args=(job,)) for job in jobs]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
            cpu = cpu_seconds(service.pid) - cpu_before
            rss = rss_mb(service.pid)
        finally:
            served.stop(grace=30)
    passes = sum(done) / clients  # session passes (each client counts its session's)
    return {
        "encryption": "ckks" if ckks else "none",
        "sessions": sessions,
        "clients": clients,
        "share": [rows, cols],
        "passes_per_session": rounds + 1,
        "passes_done": passes,
        "wall_seconds": round(wall, 2),
        "passes_per_second": round(passes / wall, 2),
        "upload_ms": _percentiles(timings.upload),
        "download_ms": _percentiles(timings.download),
        "service_cpu_seconds": round(cpu, 2),
        "service_cpu_per_pass_ms": round(1000 * cpu / max(passes, 1), 1),
        "service_rss_mb": round(rss, 1),
        "share_bytes": len(jobs[0][3]),
        "errors": timings.errors[:20],
        "error_count": len(timings.errors),
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"p50": round(1000 * statistics.median(ordered), 1), "p99": round(1000 * p99, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--cols", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--ckks", action="store_true", help="CKKS ciphertexts instead of float32")
    parser.add_argument("--both", action="store_true", help="plaintext, then CKKS; write JSON")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    settings = dict(
        sessions=args.sessions,
        clients=args.clients,
        rows=args.rows,
        cols=args.cols,
        rounds=args.rounds,
    )
    modes = (False, True) if args.both else (args.ckks,)
    results = [run(**settings, ckks=ckks) for ckks in modes]
    print(json.dumps(results, indent=2))
    if args.both:
        OUT.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any(r["error_count"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
