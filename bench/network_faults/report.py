"""The results file and the "network-faults" section of docs/results.md."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench.network_faults.proxy import Faults
from bench.network_faults.scenario import SCENARIOS


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each run against the clean run of its own repetition (interleaved: the same load)."""
    for result in results:
        clean = next(
            (
                r
                for r in results
                if r["scenario"] == "clean" and r["completed"] and r["run"] == result["run"]
            ),
            None,
        )
        for key in ("wall_seconds", "training_seconds"):
            ratio = None
            if clean and clean[key] and result[key] is not None:
                ratio = round(result[key] / clean[key], 2)
            result[key.replace("_seconds", "_ratio_vs_clean")] = ratio


def outcome_text(result: dict[str, Any]) -> str:
    if result["completed"]:
        retries = sum(w["retries"] for w in result["workers"])
        gave_up = [
            f"worker {e['worker']} exited {e['exit_code']} at {e['at']:.0f} s "
            f"({short(e['message']) or 'no message'}) and was started again"
            for e in result["events"]
            if e.get("exit_code")
        ]
        return "; ".join([f"completed ({retries} retried requests)", *gave_up])
    failed = [
        f"worker {m} exit {w['exit_code']}: {short(w['message']) or 'no message'}"
        for m, w in enumerate(result["workers"])
        if w["exit_code"] != 0
    ]
    prefix = {"timeout": "timed out; ", "abandoned": "stopped by the bench; "}.get(
        result["ending"], ""
    )
    return "FAILED: " + prefix + "; ".join(failed)


def short(message: str) -> str:
    """A worker's message without the session id."""
    message = re.sub(r"/v1/sessions/[0-9a-f]+/clients/\d+/", "…/", message)
    return re.sub(r"session [0-9a-f]{32}", "session …", message)


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| scenario | run | outcome | wall (s) | ratio vs clean | training phase (s) "
        "| ratio vs clean | CPU (s: service, session create, workers) |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (SCENARIOS.index(r["scenario"]), r["run"])):
        rows.append(
            f"| {r['scenario']} | {r['run'] + 1} | {outcome_text(r)} | {r['wall_seconds']:.1f} | "
            f"{number(r['wall_ratio_vs_clean'])} | {number(r['training_seconds'], digits=1)} | "
            f"{number(r['training_ratio_vs_clean'])} | {r['cpu_seconds_children']:.0f} |"
        )
    return "\n".join(rows)


def medians(results: list[dict[str, Any]]) -> str:
    """Per scenario: the median over runs of the training phase, and its ratio to the clean
    runs' median."""
    by_scenario: dict[str, list[float]] = {}
    for r in results:
        if r["training_seconds"] is not None:
            by_scenario.setdefault(r["scenario"], []).append(r["training_seconds"])
    clean = statistics.median(by_scenario["clean"]) if "clean" in by_scenario else None
    rows = [
        "| scenario | runs completed | training phase, median (s) | ratio to clean median |",
        "|---|---:|---:|---:|",
    ]
    for name in SCENARIOS:
        runs = [r for r in results if r["scenario"] == name]
        if not runs or name not in by_scenario:
            continue
        median = statistics.median(by_scenario[name])
        ratio = median / clean if clean else None
        done = sum(r["completed"] for r in runs)
        rows.append(f"| {name} | {done} of {len(runs)} | {median:.1f} | {number(ratio)} |")
    return "\n".join(rows)


def number(value: float | None, *, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def progress_line(result: dict[str, Any]) -> str:
    return (
        f"{result['scenario']}: {outcome_text(result)}, {result['wall_seconds']:.1f} s wall, "
        f"{result['cpu_seconds_children']:.0f} s CPU"
    )


def write_results(payload: dict[str, Any], *, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "kernel": platform.release(),
        "load_average_at_start": os.getloadavg(),
        "timestamp_unix": int(time.time()),
    }


def retry_budget() -> tuple[int, float]:
    """The workers' retry policy (clients/service_http.py): attempts and seconds of back-off."""
    from clients.service_http import RetryPolicy

    policy, delay, total = RetryPolicy(), RetryPolicy().first_delay, 0.0
    for _ in range(policy.attempts - 1):
        total, delay = total + delay, min(delay * 2, policy.max_delay)
    return policy.attempts, total


def setup_text(payload: dict[str, Any]) -> str:
    st, env = payload["settings"], payload["environment"]
    passes = next((r["passes_total"] for r in payload["results"] if r["passes_total"]), "?")
    startups = [
        r["wall_seconds"] - r["training_seconds"]
        for r in payload["results"]
        if r["training_seconds"] is not None
    ]
    startup = f"{min(startups):.0f}-{max(startups):.0f}" if startups else "?"
    return (
        f"A secure training (CKKS on, DP on at the default epsilon 4, Cora, 3 workers, "
        f"`--rounds {st['rounds']} --eval-every {st['eval_every']} --hidden {st['hidden']}`: "
        f"{passes} passes) with `glasu serve`, `glasu session create` and three `glasu worker` "
        f"processes on one machine ({env['cpu_count']} cores, busy: load average "
        f"{env['load_average_at_start'][0]:.1f} at the start; Python {env['python']}, kernel "
        f"{env['kernel']}). Each worker reaches the service through its own asyncio TCP proxy on "
        "loopback (`bench/network_faults/`); the operator's calls go direct. "
        f"{st['repeat']} run(s) of every scenario, interleaved (each run of the four in the "
        "table's order; each ratio is against the clean run of the same round): the machine's "
        "load moves single numbers by several seconds. *wall*: from starting the workers to "
        f"the last exit (includes {startup} s of start-up on this machine, which no fault "
        "touches); *training phase*: from the last worker's first "
        "pass request to the last exit."
    )


def model_text(payload: dict[str, Any]) -> str:
    st = payload["settings"]
    faults = Faults(delay=st["delay"], loss=st["loss"])
    return "\n".join(
        [
            "What the proxy emulates (`tc netem` is not available here: `sch_netem` is an unknown "
            "qdisc on this kernel):",
            "",
            f"- **delay**: every chunk it forwards (one `read()` of up to 64 KiB), in both "
            f"directions, is held {1000 * faults.delay:.0f} ms, in order and pipelined (latency "
            f"only); a new connection's first request waits one more round trip (the handshake).",
            f"- **loss, modelled as stalls**: with probability {faults.loss:.0%} a new connection "
            f"stalls {faults.syn_stall:.1f} s (a lost SYN: the initial retransmission timeout, "
            f"RFC 6298) and, independently, each chunk stalls {faults.chunk_stall:.1f} s (one "
            "retransmission timeout of a lost segment: Linux's SRTT + max(4 RTTVAR, 200 ms) at the "
            "emulated 200 ms round trip), holding the chunks behind it (in-order delivery).",
            f"- **partition** of worker 1 for {st['partition_seconds']:.0f} s, starting when the "
            "session reaches half of its passes. `hold`: its proxy forwards nothing and connects "
            "nothing upstream, the connections stay open and their bytes are delivered when it "
            "ends, as TCP's retransmissions would deliver them. `refuse`: its proxy stops "
            "listening and resets its open connections, so every request fails at once "
            "(a dead middlebox, or RST / connection refused), and the worker's retry policy "
            "decides; a worker that gives up (exit code 4) is started again with the same command "
            'once the partition is over, as the section "Crashes and resuming" of '
            "docs/deploy.md says to.",
            "",
            "What it cannot emulate: real packet loss (no segment is dropped, so no "
            "retransmission, fast retransmit or congestion-window collapse; a stalled chunk of up"
            " to 64 KiB stands for a lost 1448-byte segment, so the multi-megabyte CKKS payloads "
            "see far fewer stalls than 5% packet loss would cause, each costing a full timeout), "
            "reordering, duplication, corruption, bandwidth limits or queueing (bytes cross "
            "loopback at loopback speed), and in a `hold` partition the timeouts of new "
            "connections (the kernel completes their handshake; a real partition would leave "
            "`connect` to time out after httpx's 10 s) and the backed-off retransmission timer "
            "after it heals (the bytes go at once; real TCP could wait up to the outage's length "
            "again). Only the workers' links are faulted, never the service's own.",
        ]
    )


def event_text(event: dict[str, Any], *, started: float) -> str:
    if event.get("restarted"):
        return f"started again at {event['at']:.1f} s"
    if event["exit_code"] == 0:
        return f"finished at {event['at']:.1f} s"
    text = f"exited {event['exit_code']} at {event['at']:.1f} s ({event['at'] - started:.1f} s "
    text += "into the partition)"
    return text + (f": `{short(event['message'])}`" if event["message"] else "")


def partition_note(result: dict[str, Any]) -> str:
    part, worker = result["partition"], result["workers"][1]
    events = [e for e in result["events"] if e.get("worker") == 1]
    happened = [event_text(e, started=part["started_at"]) for e in events]
    examples = "; ".join(f"`{short(x.split(': ', 1)[-1])}`" for x in worker["retry_examples"][:2])
    return (
        f"- **{result['scenario']}**, run {result['run'] + 1}: worker 1 cut ({part['mode']}) from "
        f"{part['started_at']:.1f} s to {part['ended_at'] or 0:.1f} s, the session then at pass "
        f"{part['at_pass']}; half-way through, `glasu session status` said: "
        f"`{short(part['status_during']) or '-'}`. "
        f"Worker 1 retried {worker['retries']} request(s)"
        + (f" ({examples})" if examples else "")
        + "; "
        + ", ".join(happened)
        + (
            f"; resumed from its checkpoint at pass(es) {worker['resumed_from']}."
            if worker["resumed_from"]
            else "; never stopped (no resume)."
        )
    )


def notes(payload: dict[str, Any]) -> str:
    attempts, backoff = retry_budget()
    lines = [
        f"The workers' retry policy (`RetryPolicy` in clients/service_http.py): {attempts} "
        f"attempts of one request, {backoff:.1f} s of back-off between them in all; an answered "
        "request may take up to the HTTP read timeout of 120 s (`ConnectionOptions` in "
        "clients/service_http.py); a worker "
        "waits for missing peers up to `--peer-wait-seconds` (900 s), long-polling every "
        "`--poll-seconds` (30 s). So a request held on an open connection (a `hold` partition) "
        "rides through any outage shorter than the read timeout without a retry, while requests "
        "that fail at once (a `refuse` partition) ride through only an outage shorter than the "
        "back-off; after that the worker exits with code 4 and must be started again (it resumes "
        "from its checkpoint). The service closes a connection idle for 5 s (uvicorn's "
        "`timeout_keep_alive`), so a request held in the proxy past that can meet a closed "
        "connection when the partition ends and is retried ('Server disconnected without "
        "sending a response').",
        "",
    ]
    for result in payload["results"]:
        stalls = sum(p["stalled_chunks"] for p in result["proxies"])
        chunks = sum(p["chunks"] for p in result["proxies"])
        conns = sum(p["connections"] for p in result["proxies"])
        if result["faults"]["loss"]:
            lines.append(
                f"- **{result['scenario']}**, run {result['run'] + 1}: {stalls} of {chunks} chunks "
                "stalled, "
                f"{sum(p['stalled_connections'] for p in result['proxies'])} of {conns} new "
                "connections stalled (httpx keeps one connection per worker alive)."
            )
        if result["partition"]:
            lines.append(partition_note(result))
    return "\n".join(lines)


def section(payload: dict[str, Any]) -> str:
    """The docs section: the command, what the proxy emulates and what not, the table."""
    return "\n".join(
        [
            "## Network faults (userspace proxy; tc netem unavailable here)",
            "",
            f"`{payload['command']}`",
            "",
            setup_text(payload),
            "",
            model_text(payload),
            "",
            table(payload["results"]),
            "",
            medians(payload["results"]),
            "",
            notes(payload),
        ]
    )
