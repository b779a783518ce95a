"""One scenario: its plan, the watch that follows the session (and cuts and heals the
partition), and what the run left behind."""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.network_faults.processes import (
    Setup,
    run_checked,
    session_command,
    session_status,
    spawn,
    start_service,
    worker_command,
)
from bench.network_faults.proxy import Faults, Partition, Proxy, ProxyLoop
from clients.local.processes import ManagedProcess, ServedService, stop_all

SCENARIOS = ("clean", "delay-loss", "delay-loss-partition", "delay-loss-partition-refuse")


@dataclass(frozen=True)
class Plan:
    name: str
    faults: Faults
    partition_seconds: float  # 0: none
    partition_mode: str
    rounds: int
    eval_every: int
    hidden: int
    timeout: float
    seed: int
    restart_unreachable: bool = False  # start a worker that gave up (exit 4) again, as documented


EXIT_UNREACHABLE = 4  # glasu worker: the service stayed unreachable after the bounded retries
GRACE = 5.0  # seconds the bench waits after a worker failed for good before stopping the rest


def copy_partitions(setup: Setup, work: Path) -> None:
    """A fresh copy per scenario: each worker's privacy ledger and checkpoints start empty."""
    shutil.copytree(setup.partitions, work / "partitions")


def worker_commands(
    setup: Setup, work: Path, proxies: list[Proxy], *, session_id: str, hidden: int
) -> list[list[str]]:
    return [
        worker_command(setup, work, client=m, port=proxy.port, session_id=session_id, hidden=hidden)
        for m, proxy in enumerate(proxies)
    ]


def last_line(log: Path, *, prefix: str) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if prefix in line]
    return lines[-1].strip() if lines else ""


def retry_lines(log: Path) -> list[str]:
    return [
        line.strip() for line in log.read_text(errors="replace").splitlines() if "; retry " in line
    ]


class Watch:
    """Follows the session on the service (directly, not through a proxy): prints each pass,
    starts the partition half-way, stops at the workers' exits or the timeout."""

    def __init__(
        self,
        plan: Plan,
        service: ServedService,
        session_id: str,
        proxies: list[Proxy],
        loop: ProxyLoop,
    ) -> None:
        self.plan, self.service, self.session_id = plan, service, session_id
        self.proxies, self.loop = proxies, loop
        self.partition: Partition | None = None
        self.last_pass = -1
        self.passes_total = 0
        self.work = Path()
        self.commands: list[list[str]] = []
        self.events: list[dict[str, Any]] = []  # worker exits and restarts
        self.seen: set[int] = set()  # pids whose exit is recorded
        self.pending_restart: set[int] = set()
        self.restarted: set[int] = set()
        self.failed_at: float | None = None

    def follow(self, workers: list[ManagedProcess], *, started: float) -> str:
        """ "finished" when every worker exited, "abandoned" when one failed for good (the
        others would wait up to --peer-wait-seconds), "timeout" otherwise."""
        while time.monotonic() - started < self.plan.timeout:
            elapsed = time.monotonic() - started
            self._progress(elapsed)
            self._partition_ends(elapsed)
            self._exits(workers, elapsed)
            if all(w.process.poll() is not None for w in workers):
                return "finished"
            if self.failed_at is not None and elapsed > self.failed_at + GRACE:
                return "abandoned"
            time.sleep(0.2)
        return "timeout"

    def _exits(self, workers: list[ManagedProcess], elapsed: float) -> None:
        for m, worker in enumerate(workers):
            code = worker.process.poll()
            if code is None or worker.process.pid in self.seen:
                continue
            self.seen.add(worker.process.pid)
            log = self.work / f"worker-{m}{'.restart' if m in self.restarted else ''}.log"
            event = {"worker": m, "exit_code": code, "at": round(elapsed, 2),
                     "message": last_line(log, prefix=f"glasu worker {m}:")}  # fmt: skip
            self.events.append(event)
            print(f"  [{self.plan.name}] {elapsed:6.1f} s  worker {m} exited {code}", flush=True)
            if code == 0:
                continue
            if (
                code == EXIT_UNREACHABLE
                and self.plan.restart_unreachable
                and m not in self.restarted
            ):
                self.pending_restart.add(m)
            elif self.failed_at is None:
                self.failed_at = elapsed
        self._restart(workers, elapsed)

    def _restart(self, workers: list[ManagedProcess], elapsed: float) -> None:
        healed = self.partition is None or self.partition.ended_at is not None
        for m in sorted(self.pending_restart) if healed else []:
            self.pending_restart.discard(m)
            self.restarted.add(m)
            workers[m] = spawn(self.commands[m], log=self.work / f"worker-{m}.restart.log")
            self.events.append({"worker": m, "restarted": True, "at": round(elapsed, 2)})
            print(f"  [{self.plan.name}] {elapsed:6.1f} s  worker {m} started again", flush=True)

    def _progress(self, elapsed: float) -> None:
        with contextlib.suppress(httpx.HTTPError):
            status = session_status(self.service, self.session_id)
            self.passes_total = int(status.get("passes_total", 0))
            current = int(status.get("current_pass", 0))
            if current != self.last_pass:
                self.last_pass = current
                print(
                    f"  [{self.plan.name}] {elapsed:6.1f} s  pass {current}/{self.passes_total}",
                    flush=True,
                )
            due = current >= max(1, self.passes_total // 2)
            if self.plan.partition_seconds and self.partition is None and due:
                self._partition_starts(elapsed, current)

    def _partition_starts(self, elapsed: float, current: int) -> None:
        self.partition = Partition(
            worker=1, seconds=self.plan.partition_seconds, mode=self.plan.partition_mode,
            at_pass=current, started_at=elapsed,
        )  # fmt: skip
        seconds, mode = self.plan.partition_seconds, self.plan.partition_mode
        self.loop.submit(self.proxies[1].partition(seconds=seconds, mode=mode))
        print(
            f"  [{self.plan.name}] {elapsed:6.1f} s  partition of worker 1 ({mode}, "
            f"{seconds:.0f} s) at pass {current}",
            flush=True,
        )

    def _partition_ends(self, elapsed: float) -> None:
        part = self.partition
        if part is None or part.started_at is None or part.ended_at is not None:
            return
        if not part.status_during and elapsed > part.started_at + part.seconds / 2:
            from clients.cli.session_cmd import describe  # `glasu session status`'s lines

            with contextlib.suppress(httpx.HTTPError):
                status = session_status(self.service, self.session_id)
                lines = describe(status).splitlines()[:2]
                part.status_during = "; ".join(line.strip() for line in lines)
        if elapsed >= part.started_at + part.seconds:
            part.ended_at = elapsed
            print(f"  [{self.plan.name}] {elapsed:6.1f} s  partition over", flush=True)

    def step(self) -> dict[str, Any]:
        status = session_status(self.service, self.session_id)
        keep = ("state", "current_pass", "current_step", "waiting_for", "missing", "received")
        return {k: status[k] for k in keep if k in status}


def run_scenario(plan: Plan, setup: Setup, loop: ProxyLoop) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"{plan.name}-", dir=setup.root))
    copy_partitions(setup, work)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    service = start_service(setup, work)
    workers: list[ManagedProcess] = []
    proxies: list[Proxy] = []
    try:
        command = session_command(
            setup, service, work, rounds=plan.rounds, eval_every=plan.eval_every, hidden=plan.hidden
        )
        run_checked(command, log=work / "session.log")
        session_id = (work / "session" / "session.id").read_text().strip()
        proxies = loop.proxies(upstream_port=service.port, faults=plan.faults, seed=plan.seed)
        watch = Watch(plan, service, session_id, proxies, loop)
        watch.work = work
        watch.commands = worker_commands(
            setup, work, proxies, session_id=session_id, hidden=plan.hidden
        )
        started = time.monotonic()
        workers = [
            spawn(command, log=work / f"worker-{m}.log") for m, command in enumerate(watch.commands)
        ]
        ending = watch.follow(workers, started=started)
        wall = time.monotonic() - started
        status = watch.step()
    finally:
        stop_all(workers, grace=15)
        for proxy in proxies:
            loop.run(proxy.close())
        service.stop()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    run = Run(workers, proxies, watch, ending, wall, status, cpu, command, started)
    return summarize(plan, work, run)


def worker_outcome(work: Path, m: int, worker: ManagedProcess) -> dict[str, Any]:
    logs = [work / f"worker-{m}.log", work / f"worker-{m}.restart.log"]
    result_file = work / f"result-{m}.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    history = result.get("history") or [{}]
    retries = [line for log in logs if log.exists() for line in retry_lines(log)]
    messages = [last_line(log, prefix=f"glasu worker {m}:") for log in logs if log.exists()]
    return {
        "exit_code": worker.process.returncode,
        "message": " / ".join(message for message in messages if message),
        "passes": result.get("passes"),
        "finished_reason": result.get("finished_reason"),
        "resumed_from": result.get("resumed_from"),
        "test_accuracy": history[-1].get("test_accuracy"),
        "retries": len(retries),
        "retry_examples": retries[:3],
    }


@dataclass
class Run:
    """What one scenario left behind."""

    workers: list[ManagedProcess]
    proxies: list[Proxy]
    watch: Watch
    ending: str  # finished | abandoned | timeout
    wall: float
    status: dict[str, Any]
    cpu: float
    command: list[str]
    started: float  # time.monotonic() when the workers were started

    def training_seconds(self) -> float | None:
        """From the last worker's first pass request (all have started up) to the last exit."""
        firsts = [p.stats.first_pass_request for p in self.proxies]
        if any(first is None for first in firsts):
            return None
        return self.started + self.wall - max(f for f in firsts if f is not None)


def summarize(plan: Plan, work: Path, run: Run) -> dict[str, Any]:
    outcomes = [worker_outcome(work, m, w) for m, w in enumerate(run.workers)]
    training = run.training_seconds()
    completed = run.ending == "finished" and all(
        o["exit_code"] == 0 and o["finished_reason"] == "finished" for o in outcomes
    )
    return {
        "scenario": plan.name,
        "faults": asdict(plan.faults),
        "partition": asdict(run.watch.partition) if run.watch.partition else None,
        "completed": completed,
        "ending": run.ending,
        "events": run.watch.events,
        "wall_seconds": round(run.wall, 2),
        "training_seconds": None if training is None else round(training, 2),
        "passes_total": run.watch.passes_total,
        "session_at_end": run.status,
        "workers": outcomes,
        "proxies": [asdict(p.stats) for p in run.proxies],
        "cpu_seconds_children": round(run.cpu, 1),
        "session_command": [str(a) for a in run.command],
        "work_dir": str(work),
    }


def plans(args: argparse.Namespace) -> list[Plan]:
    faulty = Faults(delay=args.delay, loss=args.loss)
    common = {
        "rounds": args.rounds, "eval_every": args.eval_every, "hidden": args.hidden,
        "timeout": args.timeout, "seed": args.seed,
    }  # fmt: skip
    cut = args.partition_seconds
    every = {
        "clean": Plan("clean", Faults(), 0.0, "hold", **common),
        "delay-loss": Plan("delay-loss", faulty, 0.0, "hold", **common),
        "delay-loss-partition": Plan("delay-loss-partition", faulty, cut, "hold", **common),
        "delay-loss-partition-refuse": Plan(
            "delay-loss-partition-refuse", faulty, cut, "refuse", **common, restart_unreachable=True
        ),
    }
    return [every[name] for name in args.scenarios]
