"""Start-up cost of the aggregation service: ``glasu serve`` as the container runs it.

Per run, a fresh ``python -m clients.cli.main serve`` (the ``glasu`` entrypoint of
deploy/Dockerfile.service) on a temporary database and admin token file, measured from outside:

- start-up: CPU seconds of the process (utime + stime from /proc/<pid>/stat) and wall seconds from
  spawning it until ``GET /healthz`` answers 200;
- idle RSS (/proc/<pid>/status VmRSS) one second after that, and whether torch is mapped then;
- the first session with differential privacy: CPU and wall seconds of its ``POST /v1/sessions``
  (the privacy accountant is loaded on first use) and the RSS after it.

Each source is run N times; with several sources the runs are interleaved (A B A B ...), so a
change in machine load hits all of them alike. Prints median and spread (max - min) per metric
and writes one labelled entry per source into bench/results/startup.json, replacing an entry of
the same label and keeping the others.

    python -m bench.startup --source /tmp/glasu-before --label before
    python -m bench.startup --label after                  # this checkout
    python -m bench.startup --source A --label a --source B --label b -n 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from clients.local.processes import start_serve, without_glasu_settings
from secure.wire.headers import AUTHORIZATION_HEADER

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "startup.json"
ADMIN_TOKEN = "startup-bench-admin-token-0123456789"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TORCH_MARKERS = ("libtorch", "/torch/", "/torch_geometric/")
METRICS = (
    "startup_cpu_seconds",
    "startup_wall_seconds",
    "idle_rss_mb",
    "dp_session_cpu_seconds",
    "dp_session_wall_seconds",
    "rss_after_dp_session_mb",
)

# A small session with differential privacy and no encryption (as in tests/service). Its privacy
# settings in the current schema first, then as older checkouts want them (a posted sensitivity).
DP_SESSION: dict[str, Any] = {
    "clients": 3,
    "layers": 3,
    "agg_layers": [{"layer": 1, "width": 8}],
    "stale": 2,
    "rounds": 3,
    "eval_every": 2,
    "batch_size": 5,
    "fanout": 2,
    "num_nodes": 60,
    "train_nodes": list(range(30)),
    "eval_nodes": list(range(40, 60)),
    "seed": 11,
    "encryption": "none",
}
DP_SETTINGS: tuple[dict[str, Any], ...] = (
    {"delta": 1e-5, "clip": 1.0, "occurrence_cap": 0, "noise_multiplier": 2.0},
    {"delta": 1e-5, "clip": 1.0, "sensitivity": 2.0, "noise_multiplier": 2.0},
)


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (the fields after the parenthesised command name)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def torch_mapped(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return any(marker in maps for marker in TORCH_MARKERS)


def request(url: str, *, body: dict[str, Any] | None = None, timeout: float = 60) -> int:
    """The status of one admin request (``POST`` with ``body``, else ``GET``)."""
    headers = {AUTHORIZATION_HEADER: f"Bearer {ADMIN_TOKEN}"}
    if body is None:
        return httpx.get(url, headers=headers, timeout=timeout).status_code
    return httpx.post(url, json=body, headers=headers, timeout=timeout).status_code


def create_dp_session(pid: int, base: str, timeout: float) -> dict[str, float]:
    """CPU and wall seconds of the first successful ``POST /v1/sessions`` with privacy on (a
    refused schema variant is rejected by validation, before any privacy code runs)."""
    for privacy in DP_SETTINGS:
        cpu_before, wall_before = cpu_seconds(pid), time.perf_counter()
        status = request(
            f"{base}/v1/sessions", body={**DP_SESSION, "privacy": privacy}, timeout=timeout
        )
        if status == 201:
            return {
                "dp_session_wall_seconds": time.perf_counter() - wall_before,
                "dp_session_cpu_seconds": cpu_seconds(pid) - cpu_before,
            }
        if status != 422:
            break
    raise RuntimeError(f"creating the DP session answered {status}")


def measure_once(source: Path, python: str, *, settle: float, timeout: float) -> dict[str, Any]:
    pythonpath = os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])
    env = without_glasu_settings(PYTHONPATH=pythonpath.rstrip(os.pathsep))
    with tempfile.TemporaryDirectory(prefix="glasu-startup-") as tmp:
        started = time.perf_counter()
        served = start_serve(
            Path(tmp), admin_token=ADMIN_TOKEN, cwd=source, env=env,
            command=lambda *args: [python, "-m", "clients.cli.main", *args],
        )  # fmt: skip
        pid = served.process.pid
        try:
            served.wait_healthy(timeout, poll_seconds=0.005)
            run: dict[str, Any] = {
                "startup_wall_seconds": time.perf_counter() - started,
                "startup_cpu_seconds": cpu_seconds(pid),
            }
            time.sleep(settle)
            run["idle_rss_mb"] = rss_mb(pid)
            run["torch_mapped_idle"] = torch_mapped(pid)
            run.update(create_dp_session(pid, served.url, timeout))
            run["rss_after_dp_session_mb"] = rss_mb(pid)
            run["torch_mapped_after_dp_session"] = torch_mapped(pid)
            return run
        except Exception:
            sys.stderr.write(served.log_text())
            raise
        finally:
            served.stop()


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for metric in METRICS:
        values = [run[metric] for run in runs]
        summary[metric] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "spread": max(values) - min(values),
        }
    for flag in ("torch_mapped_idle", "torch_mapped_after_dp_session"):
        summary[f"{flag}_runs"] = sum(bool(run[flag]) for run in runs)
    return summary


def git_state(source: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, check=False
        )
        return result.stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def environment(python: str) -> dict[str, Any]:
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return {
        "python": version,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "timestamp_unix": int(time.time()),
    }


def write_entries(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Add or replace the given labelled entries; others stay as they are."""
    document: dict[str, Any] = {"description": __doc__.splitlines()[0], "entries": {}}
    if path.exists():
        document = json.loads(path.read_text())
    document.setdefault("entries", {}).update(entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        action="append",
        type=Path,
        help="checkout to run (repeatable; default: this one); run with PYTHONPATH and cwd = it",
    )
    parser.add_argument(
        "--label",
        action="append",
        help="name of each source's entry in the results (one per --source; default 'current')",
    )
    parser.add_argument("-n", "--repetitions", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before idle RSS")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    sources = [s.resolve() for s in args.source or [ROOT]]
    labels = args.label or ["current"]
    if len(labels) != len(sources):
        parser.error("give one --label per --source")

    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    for repetition in range(args.repetitions):
        for label, source in zip(labels, sources, strict=True):
            run = measure_once(source, args.python, settle=args.settle, timeout=args.timeout)
            runs[label].append(run)
            print(f"{label} #{repetition + 1}: " + json.dumps(run), flush=True)

    entries = {}
    for label, source in zip(labels, sources, strict=True):
        summary = summarize(runs[label])
        entries[label] = {
            "source": str(source),
            **git_state(source),
            "repetitions": args.repetitions,
            "environment": environment(args.python),
            "summary": summary,
            "runs": runs[label],
        }
        print(f"\n{label} ({source}), median [min .. max] over {args.repetitions} runs:")
        for metric in METRICS:
            s = summary[metric]
            print(
                f"  {metric:26s} {s['median']:8.3f}  [{s['min']:.3f} .. {s['max']:.3f}]"
                f"  spread {s['spread']:.3f}"
            )
    if not args.no_write:
        write_entries(args.output, entries)
        print(f"\nwrote {', '.join(entries)} to {args.output}")


if __name__ == "__main__":
    main()
