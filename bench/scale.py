"""Scale: what one party's size N costs, from its own tables to a secure training over HTTP.

Per size N (nodes per party): one synthetic CSBM graph (models/data/csbm.py: 5 balanced classes,
homophily 0.6, 300 Gaussian features) split over 3 parties as a user would bring it: party m holds
features 100m..100m+99 and its own uniform sample of 80% of the undirected edges (``glasu
train``'s ``--edge-fraction`` default; the graph has degree 12.5, so each party's has about 10),
every party holds every node under its own text ids in its own row order, and party 0 brings the
labels. Each party's tables are written as CSV or Parquet (``--format``; ``mixed``: parties 0 and
2 CSV, party 1 Parquet), then, each command a process of its own, measured from outside by GNU
time (its peak RSS, the largest of it and its children's; user + system CPU seconds, its
children included; and wall seconds):

1. ``glasu prepare`` per party, one after the other (as each organisation would, on its machine);
2. ``glasu align``: a ``glasu serve``, ``glasu align create`` and the three parties' ``glasu align
   run`` at once (the private set intersection; ``--workers auto``);
3. ``glasu train --party P0 --party P1 --party P2 --rounds R --eval-every 0 --model-dir D``:
   docs/data.md's "On one machine", with every default (CKKS encryption and differential privacy
   on): it aligns the folders again in its own process, then runs the service and one ``glasu
   worker`` per party. Every process of its tree is sampled from /proc (peak RSS as VmHWM, CPU as
   utime + stime), and the session's current pass is polled through the service's admin API (its
   port and token file are on the service's command line), which splits each process's CPU into
   start-up and the first round, the other training rounds (per round) and the evaluation pass (the
   last pass; its nodes are the split's validation and test nodes, 40% of N). Bytes are the
   report's (request and response bodies of every worker): training passes and the evaluation. The
   training keeps its models (``--model-dir``);
4. ``glasu score --party ... --model-dir``: every shared node scored with those models (it aligns
   the tables again, starts its own service and workers), its tree sampled the same way.

A command that fails (a 413, out of memory, a time-out: ``--timeout`` seconds each) is recorded
with the last lines of its output, and the sizes after it still run: the point is where the code
breaks. Ratios are to the smallest size that succeeded, per node (1.0: linear in N); the
projection to 10M and 100M is a straight line through the two largest sizes, per process.

    python -m bench.scale --sizes 10000 100000      # bench/results/scale.json, docs/results.md
    python -m bench.scale --quick                   # 1,500 nodes, a smoke test; writes nothing
    python -m bench.scale --docs-only               # the docs section from the results file
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.results_doc import add_results_arguments, rewrote_docs_only, write_json, write_section
from clients.local.processes import (
    glasu_command,
    log_tail,
    start_serve,
    without_glasu_settings,
)
from models.node_arrays import SPILL_BYTES
from secure.wire.headers import AUTHORIZATION_HEADER

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "scale.json"
SECTION = "scale"

PARTIES, FEATURES_PER_PARTY, CLASSES = 3, 100, 5
#: The graph's degree, so that each party's sample of 80% of its edges has degree 10.
EDGE_FRACTION, GRAPH_DEGREE = 0.8, 12.5
ROUNDS = 4
QUICK_SIZES = (1500,)
#: How often the process tree of ``glasu train`` is sampled.
SAMPLE_SECONDS = 0.2
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROJECTED = (10_000_000, 100_000_000)


# --- the parties' tables ---------------------------------------------------------------------


def party_formats(choice: str) -> list[str]:
    if choice == "mixed":
        return ["parquet" if m % 2 else "csv" for m in range(PARTIES)]
    return [choice] * PARTIES


def write_party_tables(nodes: int, folder: Path, formats: Sequence[str], *, seed: int) -> dict:
    """Each party's node, edge and (party 0) label tables under ``folder/raw-<m>``; what was
    written (files, sizes, edges)."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    from models.data.csbm import csbm
    from models.data.partition import sample_edges

    graph = csbm(
        nodes=nodes, classes=CLASSES, degree=GRAPH_DEGREE,
        features=PARTIES * FEATURES_PER_PARTY, seed=seed,
    )  # fmt: skip
    features = graph.features.numpy()
    labels = graph.labels.numpy()
    ids = np.array([f"c{i:09d}" for i in range(nodes)], dtype=object)

    def write(table: pa.Table, path: Path) -> None:
        if path.suffix == ".parquet":
            pq.write_table(table, path)
        else:
            pa_csv.write_csv(table, path)

    parties = []
    for m, fmt in enumerate(formats):
        rng = np.random.default_rng([seed, 7, m])
        raw = folder / f"raw-{m}"
        raw.mkdir(parents=True)
        order = rng.permutation(nodes)  # each party's own row order
        columns = {"id": pa.array(ids[order], type=pa.string())}
        block = features[order, m * FEATURES_PER_PARTY : (m + 1) * FEATURES_PER_PARTY]
        for j in range(FEATURES_PER_PARTY):
            columns[f"f{j}"] = pa.array(block[:, j])
        files = {"nodes": raw / f"nodes.{fmt}", "edges": raw / f"edges.{fmt}"}
        write(pa.table(columns), files["nodes"])
        del columns, block
        pairs = sample_edges(graph.edge_index, fraction=EDGE_FRACTION, rng=rng).numpy()
        pairs = pairs[:, pairs[0] < pairs[1]]  # one row per undirected edge
        write(pa.table({"source": ids[pairs[0]], "target": ids[pairs[1]]}), files["edges"])
        if m == 0:
            files["labels"] = raw / f"labels.{fmt}"
            write(pa.table({"id": ids[order], "label": labels[order]}), files["labels"])
        parties.append(
            {
                "format": fmt,
                "files": {k: str(v) for k, v in files.items()},
                "undirected_edges": int(pairs.shape[1]),
                "input_mb": round(sum(p.stat().st_size for p in files.values()) / 2**20, 1),
            }
        )
    return {"parties": parties}


# --- processes, measured ---------------------------------------------------------------------


@dataclass
class Measured:
    """One command's end: exit code, wall seconds, CPU seconds of it and its waited-for
    children, the peak RSS of the largest of them, and its output's last lines if it failed."""

    name: str
    returncode: int | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    timed_out: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "returncode": self.returncode, "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2), "peak_rss_mb": round(self.peak_rss_mb, 1),
            "timed_out": self.timed_out, "error": self.error,
        }  # fmt: skip


#: GNU time measures each command from its own small fork: the ``wait4`` rusage of a child of
#: this process would count, as its peak RSS, this process's own (the fork before the exec).
GNU_TIME = "/usr/bin/time"


def run_measured(
    commands: Mapping[str, Sequence[str]],
    logs: Path,
    *,
    timeout: float,
    tick: Callable[[list[int]], None] | None = None,
) -> dict[str, Measured]:
    """Run ``commands`` (name: argv) at once under GNU time, each in a process group of its
    own with its output in ``logs/<name>.log``; wait for all of them (``tick(pids still
    running)`` between polls), killing every group still running after ``timeout`` seconds."""
    if not Path(GNU_TIME).exists():
        raise RuntimeError(f"{GNU_TIME} (GNU time) is needed: apt-get install time")
    logs.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    running: dict[int, tuple[subprocess.Popen, Measured, Path, Path]] = {}
    for name, argv in commands.items():
        safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
        log, timing = logs / f"{safe}.log", logs / f"{safe}.time"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [GNU_TIME, "-f", "%M %e %U %S", "-o", str(timing), *argv], stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                env=without_glasu_settings(), start_new_session=True,
            )  # fmt: skip
        running[process.pid] = (process, Measured(name), log, timing)
    done: dict[str, Measured] = {}
    killed_at: float | None = None
    while running:
        for pid in list(running):
            if running[pid][0].poll() is None:
                continue
            process, measured, log, timing = running.pop(pid)
            measured.returncode = process.returncode
            measured.wall_s = time.perf_counter() - started
            measured.timed_out = killed_at is not None
            try:
                peak_kb, _, user, system = timing.read_text().split("\n")[-2].split()
                measured.peak_rss_mb = int(peak_kb) / 1024
                measured.cpu_s = float(user) + float(system)
            except (OSError, ValueError, IndexError):
                pass
            if measured.returncode != 0:
                measured.error = log_tail(log, 12)[-3000:]
            done[measured.name] = measured
        if not running:
            break
        elapsed = time.perf_counter() - started
        if elapsed > timeout and killed_at is None:
            killed_at = elapsed
            for pid in running:
                with _gone():
                    os.killpg(pid, signal.SIGTERM)
        elif killed_at is not None and elapsed > killed_at + 20:
            for pid in running:
                with _gone():
                    os.killpg(pid, signal.SIGKILL)
        if tick is not None:
            tick(list(running))
        time.sleep(SAMPLE_SECONDS)
    return {name: done[name] for name in commands}


class _gone:
    """Ignore a process (group) that has already exited."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)


def proc_status(pid: int) -> tuple[float, float, float] | None:
    """(CPU seconds, VmHWM in MB, RssAnon in MB) of ``pid``, None once it is gone. VmHWM counts
    file pages too (the memory-mapped features, an evaluation pass's arrays in files:
    models/node_arrays.py), which the kernel drops under pressure; RssAnon is what must stay
    in memory."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    hwm = re.search(r"^VmHWM:\s+(\d+)", status, re.MULTILINE)
    anon = re.search(r"^RssAnon:\s+(\d+)", status, re.MULTILINE)
    return cpu, *(int(m.group(1)) / 1024 if m else 0.0 for m in (hwm, anon))


def descendants(root: int) -> dict[int, str]:
    """pid: command line of every process below ``root`` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                found[child] = " ".join(a.decode(errors="replace") for a in argv if a)
                frontier.append(child)
    return found


def role(cmdline: str) -> str:
    """``glasu train``, ``service``, ``worker <m>``, or ``other`` (a helper process:
    multiprocessing's)."""
    words = cmdline.split()
    if "clients.cli.main" in words and "train" in words:
        return "glasu train"
    if "clients.cli.main" in words and "score" in words:
        return "glasu score"
    if "clients.cli.main" in words and "serve" in words:
        return "service"
    if "clients.cli.main" in words and "worker" in words and "--client" in words:
        return f"worker {words[words.index('--client') + 1]}"
    return "other"


@dataclass
class TreeSampler:
    """The process tree of one ``glasu train``, sampled: per process its last CPU seconds and
    peak RSS, and a timeline of (the session's current pass, every process's CPU seconds)."""

    root: int
    processes: dict[int, dict[str, Any]] = field(default_factory=dict)
    timeline: list[tuple[float, int | None, dict[int, float]]] = field(default_factory=list)
    _admin: httpx.Client | None = None
    _session: str | None = None

    def tick(self) -> None:
        if len(self.timeline) % 5 == 0:  # new processes: once a second is soon enough
            for pid, cmdline in descendants(self.root).items():
                self.processes.setdefault(pid, {"role": role(cmdline), "cmdline": cmdline[:300]})
        cpu: dict[int, float] = {}
        for pid, info in self.processes.items():
            if (found := proc_status(pid)) is not None and not info.get("gone"):
                # a zombie (exited, not yet reaped) keeps its CPU times but has no VmHWM
                info["cpu_s"] = found[0]
                info["peak_rss_mb"] = max(info.get("peak_rss_mb", 0.0), found[1])
                info["peak_anon_mb"] = max(info.get("peak_anon_mb", 0.0), found[2])
                cpu[pid] = found[0]
            else:
                info["gone"] = True
        self.timeline.append((time.perf_counter(), self._current_pass(), cpu))

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()

    def _current_pass(self) -> int | None:
        """The session's current pass, from the service's admin API (None until it answers)."""
        try:
            if self._admin is None:
                service = next(
                    (info for info in self.processes.values() if info["role"] == "service"), None
                )
                if service is None:
                    return None
                words = service["cmdline"].split()
                port = words[words.index("--port") + 1]
                token = Path(words[words.index("--admin-token-file") + 1]).read_text().strip()
                self._admin = httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={AUTHORIZATION_HEADER: f"Bearer {token}"},
                    timeout=1.0,
                )
            if self._session is None:
                listed = self._admin.get("/v1/sessions").json()
                if not listed:
                    return None
                self._session = listed[0]["session_id"]
            return int(self._admin.get(f"/v1/sessions/{self._session}").json()["current_pass"])
        except (httpx.HTTPError, OSError, ValueError, KeyError, IndexError, StopIteration):
            return None

    def by_role(self) -> dict[str, dict[str, float]]:
        """Per role: peak RSS (the largest of its processes) and CPU seconds (their sum)."""
        roles: dict[str, dict[str, float]] = {}
        for info in self.processes.values():
            if "cpu_s" not in info:
                continue
            entry = roles.setdefault(
                info["role"], {"peak_rss_mb": 0.0, "peak_anon_mb": 0.0, "cpu_s": 0.0}
            )
            for peak in ("peak_rss_mb", "peak_anon_mb"):
                entry[peak] = round(max(entry[peak], info.get(peak, 0.0)), 1)
            entry["cpu_s"] = round(entry["cpu_s"] + info["cpu_s"], 2)
        return dict(sorted(roles.items()))

    def phases(self, rounds: int) -> dict[str, Any]:
        """Per role, CPU seconds: until pass 1 starts (start-up and round 1), per training round
        over rounds 2..R, and in the evaluation pass (pass R to the end)."""
        first_at: dict[int, int] = {}
        for i, (_, current, _) in enumerate(self.timeline):
            if current is not None:
                for p in range(current + 1):
                    first_at.setdefault(p, i)
        if 1 not in first_at or rounds not in first_at:
            return {"note": "the session's passes were not seen (too fast or unreachable)"}

        def role_cpu(sample: int) -> dict[str, float]:
            totals: dict[str, float] = {}
            for pid, seconds in self.timeline[sample][2].items():
                name = self.processes[pid]["role"]
                totals[name] = totals.get(name, 0.0) + seconds
            return totals

        at_round_2, at_eval = role_cpu(first_at[1]), role_cpu(first_at[rounds])
        final = {name: entry["cpu_s"] for name, entry in self.by_role().items()}
        out: dict[str, Any] = {}
        for name in sorted(final):
            if name == "other":
                continue
            out[name] = {
                "startup_and_round_1_cpu_s": round(at_round_2.get(name, 0.0), 2),
                "cpu_s_per_round": round(
                    (at_eval.get(name, 0.0) - at_round_2.get(name, 0.0)) / max(rounds - 1, 1), 3
                ),
                "evaluation_cpu_s": round(final[name] - at_eval.get(name, 0.0), 2),
            }
        times = [t for t, _, _ in self.timeline]
        out["evaluation_wall_s"] = round(times[-1] - times[first_at[rounds]], 1)
        out["rounds_2_to_R_wall_s"] = round(times[first_at[rounds]] - times[first_at[1]], 1)
        return out


# --- one size --------------------------------------------------------------------------------


def prepare(folder: Path, tables: dict, *, timeout: float) -> list[dict[str, Any]]:
    found = []
    for m, party in enumerate(tables["parties"]):
        files = party["files"]
        argv = glasu_command(
            "prepare", "--nodes", files["nodes"], "--edges", files["edges"],
            "--id-column", "id", "--edge-columns", "source,target",
            "--out", str(folder / f"party-{m}"), "--quiet",
        )  # fmt: skip
        if "labels" in files:
            argv += ["--labels", files["labels"], "--label-column", "label"]
        measured = run_measured({f"prepare-{m}": argv}, folder / "logs", timeout=timeout)
        row = {"party": m, "format": party["format"], **measured[f"prepare-{m}"].as_dict()}
        out = folder / f"party-{m}"
        if (out / "meta.json").exists():  # renamed into place complete: usable
            row["output_mb"] = round(sum(p.stat().st_size for p in out.iterdir()) / 2**20, 1)
            if row["returncode"] != 0:
                row["note"] = "failed after writing its complete folder: the steps after go on"
        found.append(row)
    return found


def align(folder: Path, *, timeout: float) -> dict[str, Any]:
    """A ``glasu serve`` of its own, ``glasu align create``, the parties' ``glasu align run``."""
    from bench.startup import cpu_seconds

    service_root = folder / "align-service"
    service_root.mkdir()
    served = start_serve(service_root, admin_token=os.urandom(24).hex(), cwd=ROOT)
    try:
        served.wait_healthy()
        created = folder / "alignment"
        create = glasu_command(
            "align", "create", "--server", served.url, "--admin-token-file",
            str(served.admin_token_file), "--parties", str(PARTIES), "--out", str(created),
        )  # fmt: skip
        made = run_measured({"align-create": create}, folder / "logs", timeout=120)["align-create"]
        if made.returncode != 0:
            return {"create": made.as_dict(), "error": made.error}
        alignment = (created / "alignment.id").read_text().strip()
        runs = {}
        for m in range(PARTIES):
            runs[f"align-run-{m}"] = glasu_command(
                "align", "run", "--server", served.url, "--alignment", alignment,
                "--party", str(m), "--token-file", str(created / f"party-{m}.token"),
                "--data", str(folder / f"party-{m}"), "--quiet",
            )  # fmt: skip
        started = time.perf_counter()
        service_cpu = cpu_seconds(served.process.pid)
        measured = run_measured(runs, folder / "logs", timeout=timeout)
        wall = time.perf_counter() - started
        service = proc_status(served.process.pid) or (0.0, 0.0, 0.0)
    finally:
        served.stop()
    result: dict[str, Any] = {
        "wall_s": round(wall, 2),
        "parties": [m.as_dict() for m in measured.values()],
        "service": {
            "cpu_s": round(service[0] - service_cpu, 2),
            "peak_rss_mb": round(service[1], 1),
        },
    }
    meta = folder / "party-0" / "alignment.json"
    if meta.exists():
        about = json.loads(meta.read_text())
        result["aligned_nodes"] = about["aligned_nodes"]
    failed = [m for m in measured.values() if m.returncode != 0]
    if failed:
        result["error"] = f"{failed[0].name}: {failed[0].error}"
    return result


def party_arguments(folder: Path) -> list[str]:
    return [word for m in range(PARTIES) for word in ("--party", str(folder / f"party-{m}"))]


def run_sampled(
    name: str, argv: list[str], folder: Path, *, timeout: float
) -> tuple[Measured, TreeSampler | None]:
    """``argv`` measured by GNU time, its process tree sampled from /proc."""
    holder: list[TreeSampler] = []

    def tick(pids: list[int]) -> None:
        if not holder:
            holder.append(TreeSampler(pids[0]))
        holder[0].tick()

    try:
        measured = run_measured({name: argv}, folder / "logs", timeout=timeout, tick=tick)
    finally:
        for found in holder:
            found.close()
    return measured[name], (holder[0] if holder else None)


def train(folder: Path, *, rounds: int, timeout: float) -> dict[str, Any]:
    report = folder / "report.json"
    argv = glasu_command("train", *party_arguments(folder))
    argv += ["--rounds", str(rounds), "--eval-every", "0", "--report", str(report), "--quiet"]
    argv += ["--model-dir", str(folder / "models")]
    measured, sampler = run_sampled("train", argv, folder, timeout=timeout)
    result: dict[str, Any] = {"command": "glasu train --party ... " + " ".join(argv[-9:-3])}
    result.update(measured.as_dict())
    if sampler is not None:
        result["processes"] = sampler.by_role()
        result["phases"] = sampler.phases(rounds)
    if report.exists():
        data = json.loads(report.read_text())
        last = data["history"][-1] if data.get("history") else {}
        total = data["bytes_up"] + data["bytes_down"]
        training = last.get("training_bytes", 0)
        result["report"] = {
            "wall_seconds": data["wall_seconds"],
            "test_accuracy": data["final_test_accuracy"],
            "bytes_total": total,
            "bytes_training": training,
            "bytes_evaluation": total - training,
            "epsilon": (data.get("privacy") or {}).get("epsilon"),
        }
    return result


def score(folder: Path, *, timeout: float) -> dict[str, Any]:
    """``glasu score`` of every shared node with the models the training kept."""
    out = folder / "predictions"
    argv = glasu_command(
        "score", *party_arguments(folder), "--model-dir", str(folder / "models"),
        "--out", str(out), "--format", "parquet", "--quiet",
    )  # fmt: skip
    measured, sampler = run_sampled("score", argv, folder, timeout=timeout)
    result: dict[str, Any] = measured.as_dict()
    if sampler is not None:
        result["processes"] = sampler.by_role()
    written = sorted(out.glob("*.parquet")) if out.is_dir() else []
    if written:
        import pyarrow.parquet as pq

        result["predictions"] = {p.name: pq.read_metadata(p).num_rows for p in written}
    return result


def measure_size(
    nodes: int, work: Path, *, formats: Sequence[str], rounds: int, timeout: float, seed: int
) -> dict[str, Any]:
    folder = work / f"n{nodes}"
    folder.mkdir(parents=True)
    row: dict[str, Any] = {"nodes": nodes, "formats": list(formats)}
    started = time.perf_counter()
    row["tables"] = write_party_tables(nodes, folder, formats, seed=seed)
    row["tables"]["write_wall_s"] = round(time.perf_counter() - started, 1)
    say(f"{nodes}: tables written in {row['tables']['write_wall_s']} s")
    row["prepare"] = prepare(folder, row["tables"], timeout=timeout)
    if any("output_mb" not in p for p in row["prepare"]):
        row["failed"] = "prepare"
        return row
    say(f"{nodes}: prepared " + ", ".join(f"{p['wall_s']} s" for p in row["prepare"]))
    row["align"] = align(folder, timeout=timeout)
    say(f"{nodes}: aligned in {row['align'].get('wall_s')} s {row['align'].get('error') or ''}")
    row["train"] = train(folder, rounds=rounds, timeout=timeout)
    say(f"{nodes}: trained in {row['train']['wall_s']} s, exit code {row['train']['returncode']}")
    if row["train"]["returncode"] != 0:
        row["failed"] = "train"
        return row
    row["score"] = score(folder, timeout=timeout)
    say(f"{nodes}: scored in {row['score']['wall_s']} s, exit code {row['score']['returncode']}")
    if row["score"]["returncode"] != 0:
        row["failed"] = "score"
    elif row["align"].get("error"):
        row["failed"] = "align"
    return row


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    memory = re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())
    import torch

    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(int(memory.group(1)) / 2**20, 1) if memory else None,
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_start": round(os.getloadavg()[0], 2),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _cpu_model() -> str:
    found = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
    return found.group(1).strip() if found else platform.processor()


# --- the docs --------------------------------------------------------------------------------


def _processes(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    return row.get("train", {}).get("processes", {})


def _workers(
    row: dict[str, Any], key: str, *, phase: bool = False, step: str = "train"
) -> list[float]:
    if phase:
        source = row.get(step, {}).get("phases", {})
    else:
        source = row.get(step, {}).get("processes", {})
    return [v[key] for name, v in source.items() if name.startswith("worker") and key in v]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def metrics(row: dict[str, Any]) -> dict[str, float | None]:
    """The figures compared across sizes, each for one party (one ``glasu prepare``, one
    ``glasu align run``, one worker: the largest peak, the mean CPU) or one process."""
    prepare = row.get("prepare", [])
    align = row.get("align", {})
    parties = align.get("parties", [])
    report = row.get("train", {}).get("report", {})
    service = row.get("train", {}).get("phases", {}).get("service", {})
    return {
        "prepare: peak RSS (MB)": max((p["peak_rss_mb"] for p in prepare), default=None),
        "prepare: CPU (s)": _mean([p["cpu_s"] for p in prepare]),
        "align run: CPU per party (s)": _mean([p["cpu_s"] for p in parties]),
        "align run: peak RSS (MB)": max((p["peak_rss_mb"] for p in parties), default=None),
        "align: wall (s)": align.get("wall_s"),
        "train: worker peak RSS (MB)": max(_workers(row, "peak_rss_mb"), default=None),
        "train: worker peak anonymous RSS, sampled (MB)": max(
            _workers(row, "peak_anon_mb"), default=None
        ),
        "train: service peak RSS (MB)": _processes(row).get("service", {}).get("peak_rss_mb"),
        "train: `glasu train` process peak RSS (MB)": (
            _processes(row).get("glasu train", {}).get("peak_rss_mb")
        ),
        "train: `glasu train` process CPU (s)": (
            _processes(row).get("glasu train", {}).get("cpu_s")
        ),
        "train: `glasu train` blinding processes CPU (s)": (
            _processes(row).get("other", {}).get("cpu_s")
        ),
        "train: worker CPU, start-up and round 1 (s)": _mean(
            _workers(row, "startup_and_round_1_cpu_s", phase=True)
        ),
        "train: worker CPU per training round (s)": _mean(
            _workers(row, "cpu_s_per_round", phase=True)
        ),
        "train: worker CPU per evaluation pass (s)": _mean(
            _workers(row, "evaluation_cpu_s", phase=True)
        ),
        "train: service CPU per evaluation pass (s)": service.get("evaluation_cpu_s"),
        "train: evaluation pass wall (s)": row.get("train", {})
        .get("phases", {})
        .get("evaluation_wall_s"),
        "train: bytes per training round per party (MB)": (
            report["bytes_training"] / PARTIES / _rounds(row) / 2**20 if report else None
        ),
        "train: evaluation bytes per party (MB)": (
            report["bytes_evaluation"] / PARTIES / 2**20 if report else None
        ),
        "score: worker peak RSS (MB)": max(
            _workers(row, "peak_rss_mb", step="score"), default=None
        ),
        "score: worker peak anonymous RSS, sampled (MB)": max(
            _workers(row, "peak_anon_mb", step="score"), default=None
        ),
        "score: worker CPU (s)": _mean(_workers(row, "cpu_s", step="score")),
        "score: wall, its alignment included (s)": row.get("score", {}).get("wall_s"),
    }


def _rounds(row: dict[str, Any]) -> int:
    return int(row.get("rounds", ROUNDS))


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:,.{digits}f}"


def _reason(message: str | None) -> str:
    """The line of a failure's output that says what went wrong (else its last)."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    pattern = re.compile(r"error|413|memory|killed|exit code|timed? ?out", re.IGNORECASE)
    found = next((line for line in reversed(lines) if pattern.search(line)), None)
    return (found or (lines[-1] if lines else "no output")).replace("`", "'")[:400]


def markdown(payload: dict[str, Any]) -> str:
    rows, about = payload["rows"], payload["machine"]
    sizes = [r["nodes"] for r in rows]
    lines = [
        "## Scale: one party's size, from its tables to a secure training (`bench/scale.py`)",
        "",
        f"Synthetic CSBM graphs (5 classes, homophily 0.6) of N nodes per party, brought in as a "
        f"user would: {PARTIES} parties, each with {FEATURES_PER_PARTY} features of every node "
        f"and its own 80% sample of the edges (degree about 10), its own text ids and row "
        f"order; party 0 brings the labels. Tables: {', '.join(rows[0]['formats'])} (parties "
        f"0-{PARTIES - 1}). Per size: `glasu prepare` per party, `glasu align` (a service and "
        "the three `glasu align run` at once), then `glasu train --party ... --rounds "
        f"{payload['rounds']} --eval-every 0 --model-dir ...` with every default (CKKS and DP on; "
        "batch 16, fanout 3, evaluation fanout 10 over 4 layers, layer by layer over every node, "
        "scored on the 40% validation and test nodes), then `glasu score` of every shared node "
        "with the kept models (it aligns the tables again: that is in its wall time). "
        "Each command a process of its own; peak RSS and CPU from GNU time for the commands and "
        "from /proc (VmHWM, RssAnon, utime + stime, sampled every 0.2 s) for each process of the "
        "training and scoring. A worker's VmHWM counts the file pages it maps (the features, "
        "and the evaluation pass's node arrays, in unlinked temporary files: "
        f"models/node_arrays.py, for arrays over {SPILL_BYTES >> 20} MiB: from about "
        f"{SPILL_BYTES // (128 * 4):,} nodes at width 128), "
        "which the kernel writes out and drops when memory runs short; its anonymous RSS is "
        "what must stay in memory. "
        "The CPU of a round is that of rounds 2..R (round 1 holds the start-up); "
        f"bytes are the workers' bodies. Machine: {about['cpus']} CPUs ({about['cpu_model']}), "
        f"{about['memory_gib']} GiB, shared with the benchmark's own process; Python "
        f"{about['python']}, torch {about['torch']}; load average {about['loadavg_start']} at "
        f"the start; run {about['started']}. `glasu train --party` aligns the folders again in "
        "its own process (the blinding in processes it spawns: secure/psi.py); the test accuracy "
        f"after {payload['rounds']} rounds is not the point.",
        "",
        "```",
        f".venv/bin/python -m bench.scale --sizes {' '.join(map(str, sizes))}",
        "```",
        "",
        "| N per party | " + " | ".join(f"{n:,}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    table = [metrics(r) for r in rows]
    for key in table[0]:
        lines.append(f"| {key} | " + " | ".join(_fmt(t[key]) for t in table) + " |")
    walls = []
    for r in rows:
        steps = [max((p["wall_s"] for p in r.get("prepare", [])), default=0.0)]
        steps += [r.get("align", {}).get("wall_s") or 0.0, r.get("train", {}).get("wall_s", 0.0)]
        steps.append(r.get("score", {}).get("wall_s", 0.0))
        walls.append(sum(steps))
    lines.append("| wall, all steps (s) | " + " | ".join(_fmt(w) for w in walls) + " |")
    failures = [r for r in rows if r.get("failed")]
    lines.append(
        "| outcome | "
        + " | ".join(f"failed in {r['failed']}" if r.get("failed") else "ok" for r in rows)
        + " |"
    )
    for r in failures:
        step = r[r["failed"]]
        if isinstance(step, list):
            step = next((p for p in step if p.get("error")), {})
        why = _reason(step.get("error"))
        if step.get("timed_out"):
            why = f"timed out (--timeout); {why}"
        lines += ["", f"At {r['nodes']:,} nodes `{r['failed']}` failed: `{why}`"]
    aborted = [p for r in rows for p in r.get("prepare", []) if p.get("note")]
    if aborted:
        codes = sorted({p["returncode"] for p in aborted})
        runs = sum(len(r.get("prepare", [])) for r in rows)
        lines += [
            "",
            f"`glasu prepare` exited with code {', '.join(map(str, codes))} after writing its "
            f"complete folder in {len(aborted)} of {runs} runs (`terminate called without an "
            "active exception` at interpreter exit: pyarrow's readers still alive then, "
            "apache/arrow#34314); the steps after used the folder.",
        ]
    good = [(r, t) for r, t in zip(rows, table, strict=True) if not r.get("failed")]
    if len(good) >= 2:
        base_row, base = good[0]
        lines += [
            "",
            f"Ratios per node to {base_row['nodes']:,} nodes (1.0: linear in N; below 1: "
            "less than linear, e.g. a fixed cost):",
            "",
            "| N per party | " + " | ".join(f"{r['nodes']:,}" for r, _ in good[1:]) + " |",
            "|---|" + "---|" * (len(good) - 1),
        ]
        for key in base:
            cells = []
            for r, t in good[1:]:
                if base[key] and t[key] is not None:
                    cells.append(f"{(t[key] / r['nodes']) / (base[key] / base_row['nodes']):.2f}")
                else:
                    cells.append("-")
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        (n1, t1), (n2, t2) = (
            (good[-2][0]["nodes"], good[-2][1]),
            (good[-1][0]["nodes"], good[-1][1]),
        )
        lines += [
            "",
            f"Projection (not measured): a straight line through {n1:,} and {n2:,} nodes, "
            "per process, as the code is now; it says nothing of the limits that would stop a "
            "run before (the machine's memory; bodies travel in parts, so no body limit grows "
            "with N).",
            "",
            "| projected | " + " | ".join(f"{n:,}" for n in PROJECTED) + " | slope per node |",
            "|---|" + "---|" * (len(PROJECTED) + 1),
        ]
        for key in t2:
            if t1[key] is None or t2[key] is None or "wall" in key or "per training" in key:
                continue
            slope = (t2[key] - t1[key]) / (n2 - n1)
            at = [t2[key] + slope * (n - n2) for n in PROJECTED]
            per_node = f"{slope * 2**20:,.0f} B" if "MB" in key else f"{slope * 1000:.3f} ms"
            lines.append(f"| {key} | " + " | ".join(_fmt(v) for v in at) + f" | {per_node} |")
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="1,500 nodes; writes nothing")
    parser.add_argument("--format", choices=["csv", "parquet", "mixed"], default="mixed")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="training rounds (>= 2)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=None, help="kept (default: a temp dir)")
    parser.add_argument(
        "--add", action="store_true", help="keep --out's rows of the sizes not run now"
    )
    add_results_arguments(parser, OUT)
    args = parser.parse_args()
    if rewrote_docs_only(args, SECTION, markdown):
        return 0
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 holds the start-up)")
    sizes = list(QUICK_SIZES) if args.quick else sorted(args.sizes)
    payload: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "rows": []}
    if args.add and args.out.exists():
        earlier = json.loads(args.out.read_text())
        payload["machine"] = earlier["machine"]
        payload["rows"] = [r for r in earlier["rows"] if r["nodes"] not in sizes]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="glasu-scale-"))
    try:
        for nodes in sizes:
            try:
                row = measure_size(
                    nodes, work, formats=party_formats(args.format), rounds=args.rounds,
                    timeout=args.timeout, seed=args.seed,
                )  # fmt: skip
            except (MemoryError, OSError, RuntimeError) as exc:  # the bench's own failure
                error = {"error": f"{type(exc).__name__}: {exc}"}
                row = {"nodes": nodes, "formats": party_formats(args.format)}
                row.update(failed="benchmark", benchmark=error)
            row.update(rounds=args.rounds, loadavg=round(os.getloadavg()[0], 2))
            row["finished"] = time.strftime("%H:%M UTC", time.gmtime())
            payload["rows"] = sorted([*payload["rows"], row], key=lambda r: r["nodes"])
            if args.work_dir is None:
                shutil.rmtree(work / f"n{nodes}", ignore_errors=True)
            if not args.quick:
                write_json(args.out, payload)  # what is done so far survives a later failure
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    payload["machine"]["loadavg_end"] = round(os.getloadavg()[0], 2)
    text = markdown(payload)
    if not args.quick:
        write_json(args.out, payload)
        write_section(SECTION, text)
    print(text)
    return 1 if args.quick and any(r.get("failed") for r in payload["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
