"""A secure training over a faulty network, emulated in userspace (issue 12, network faults).

``tc netem`` is not available on the machine this was written on (``sch_netem`` is an
unknown qdisc), so each worker talks to the service through its own asyncio TCP proxy on
loopback, which can:

- **delay**: hold every chunk it forwards (one ``read()`` of up to 64 KiB, either direction)
  for a fixed one-way delay (100 ms), in order, pipelined (latency, not bandwidth); a new
  connection's first request waits one more round trip (the TCP handshake's);
- **loss** (modelled, not real): each new connection stalls with probability ``loss`` for the
  initial retransmission timeout of a lost SYN (1 s, RFC 6298), and each forwarded chunk
  stalls with probability ``loss`` for one data retransmission timeout (0.4 s: Linux's
  SRTT + max(4 RTTVAR, 200 ms) at the emulated 200 ms round trip); a stalled chunk holds the
  chunks behind it (TCP's in-order delivery);
- **partition**: for ``--partition-seconds`` the proxy of one worker forwards nothing and
  connects nothing upstream, then recovers. ``hold``: connections stay open and their bytes
  are delivered when the partition ends, as TCP retransmission would deliver them, at once
  (real TCP's backed-off retransmission timer could add up to the length of the outage again);
  a new connection is accepted by the kernel where a real partition would let it time out.
  ``refuse``: the proxy stops listening and resets its open connections (what a dead or
  restarting middlebox, or a peer answering with RST / "connection refused", looks like), so
  every request fails at once and the workers' retry policy is what rides through or gives up.

It cannot emulate real packet loss (retransmissions, congestion-window collapse), reordering,
duplication or bandwidth limits: every byte still crosses loopback at loopback speed.

Scenarios: ``clean`` (the proxies forward without faults), ``delay-loss`` (delay and loss on
every worker's proxy), ``delay-loss-partition`` (the same plus a ``hold`` partition of worker 1
once the session is half-way through its passes) and ``delay-loss-partition-refuse`` (the same
with a ``refuse`` partition; a worker that gives up with exit code 4 is started again with the
same command once the partition is over, as docs/deploy.md says to). Each runs ``glasu
serve``, ``glasu session create`` (CKKS and DP on, Cora, 3 clients) and three ``glasu worker``
processes, and records whether every worker finished, how the others ended (exit code and
message), the wall time from the workers' start to the last exit (and of the training phase:
from the last worker's first pass request to the last exit), and their ratios to the clean run.
Results go to bench/results/network_faults.json and the "network-faults" section of docs/results.md.

    .venv/bin/python -m bench.network_faults                 # --rounds 10, 30 s partition
    .venv/bin/python -m bench.network_faults --quick         # 4 rounds, 10 s partition
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.results_doc import add_data_dir_argument, write_section

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "network_faults.json"
GLASU = Path(sys.executable).parent / "glasu"
CHUNK = 65536
CLIENTS = 3
SCENARIOS = ("clean", "delay-loss", "delay-loss-partition", "delay-loss-partition-refuse")


# -- the fault model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    delay: float = 0.0  # one-way, per chunk, seconds
    loss: float = 0.0  # probability that a new connection or a chunk stalls
    syn_stall: float = 1.0  # a lost SYN: the initial RTO (RFC 6298)
    chunk_stall: float = 0.4  # a lost segment: one RTO at the emulated round trip


@dataclass
class ProxyStats:
    connections: int = 0
    stalled_connections: int = 0
    chunks: int = 0
    stalled_chunks: int = 0
    bytes: int = 0
    held_by_partition: int = 0  # chunks that waited for a partition to end
    reset_by_partition: int = 0  # connections reset by a ``refuse`` partition
    first_pass_request: float | None = None  # time.monotonic() of the first /passes/ request


@dataclass
class Partition:
    worker: int
    seconds: float
    mode: str  # hold | refuse
    at_pass: int
    started_at: float | None = None  # seconds since the workers started
    ended_at: float | None = None
    status_during: str = ""


class Proxy:
    """One worker's path to the service: 127.0.0.1:port -> the service, with :class:`Faults`."""

    def __init__(self, *, upstream_port: int, faults: Faults, seed: int) -> None:
        self.upstream_port = upstream_port
        self.faults = faults
        self.rng = random.Random(seed)
        self.stats = ProxyStats()
        self.healed = asyncio.Event()
        self.healed.set()
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, *, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def partition(self, *, seconds: float, mode: str) -> None:
        self.healed.clear()
        if mode == "refuse":
            await self._refuse()
        await asyncio.sleep(seconds)
        if mode == "refuse":
            await self.start(port=self.port)
        self.healed.set()

    async def _refuse(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in list(self.writers):
            self.stats.reset_by_partition += 1
            writer.transport.abort()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()

    def _stall(self, seconds: float) -> float:
        return seconds if self.rng.random() < self.faults.loss else 0.0

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        syn = self._stall(self.faults.syn_stall)
        self.stats.stalled_connections += syn > 0
        handshake = asyncio.get_running_loop().time() + 2 * self.faults.delay + syn
        self.writers.add(client_w)
        try:
            await self._wait_healed()
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.transport.abort()
            self.writers.discard(client_w)
            return
        self.writers.add(up_w)
        try:
            await asyncio.gather(
                self._pipe(client_r, up_w, not_before=handshake, upstream=True),
                self._pipe(up_r, client_w, not_before=0.0, upstream=False),
                return_exceptions=True,  # a reset ends the connection, nothing more
            )
        finally:
            for writer in (client_w, up_w):
                self.writers.discard(writer)
                writer.transport.abort()

    async def _wait_healed(self) -> None:
        if not self.healed.is_set():
            self.stats.held_by_partition += 1
            await self.healed.wait()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        not_before: float,
        upstream: bool,
    ) -> None:
        """Forward ``reader`` to ``writer`` chunk by chunk, each due after the delay (and a
        stall), never before the chunk ahead of it."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        forward = asyncio.create_task(self._deliver(queue, writer))
        last_due = not_before
        loop = asyncio.get_running_loop()
        try:
            while chunk := await reader.read(CHUNK):
                stall = self._stall(self.faults.chunk_stall)
                self.stats.chunks += 1
                self.stats.stalled_chunks += stall > 0
                self.stats.bytes += len(chunk)
                if upstream and self.stats.first_pass_request is None and b"/passes/" in chunk:
                    self.stats.first_pass_request = time.monotonic()
                last_due = max(last_due, loop.time() + self.faults.delay + stall)
                queue.put_nowait((last_due, chunk))
        finally:
            queue.put_nowait((last_due, b""))  # end of stream (or of the connection)
            await forward

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes]], writer: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._wait_healed()
            if writer.transport.is_closing():
                return
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(chunk)
            await writer.drain()


class ProxyLoop:
    """An event loop in a thread, hosting the proxies; the main thread drives the processes."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def proxies(self, *, upstream_port: int, faults: Faults, seed: int) -> list[Proxy]:
        async def make() -> list[Proxy]:
            made = [
                Proxy(upstream_port=upstream_port, faults=faults, seed=seed + m)
                for m in range(CLIENTS)
            ]
            for proxy in made:
                await proxy.start()
            return made

        return self.run(make())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


# -- processes ------------------------------------------------------------------------------------


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASU_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_checked(args: list[str], *, log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(args, cwd=ROOT, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(args[:3])} exited with {done.returncode}:\n{tail}")


def spawn(args: list[str], *, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            args, cwd=ROOT, env=clean_env(), stdout=out, stderr=subprocess.STDOUT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Setup:
    """What every scenario shares: the dataset copy, the CKKS keys, the partitions."""

    root: Path
    data_dir: Path
    keys: Path
    partitions: Path


def prepare(root: Path, *, data_dir: Path) -> Setup:
    planetoid = root / "planetoid"
    shutil.copytree(data_dir / "Cora" / "raw", planetoid / "Cora" / "raw")
    log = root / "prepare.log"
    run_checked([str(GLASU), "keygen", "--out", str(root / "keys")], log=log)
    run_checked(
        [str(GLASU), "partition", "--dataset", "cora", "--data-dir", str(planetoid),
         "--clients", str(CLIENTS), "--out", str(root / "partitions")],
        log=log,
    )  # fmt: skip
    return Setup(root, planetoid, root / "keys", root / "partitions")


@dataclass
class Service:
    process: subprocess.Popen[bytes]
    port: int
    admin_token_file: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self, session_id: str) -> dict[str, Any]:
        token = self.admin_token_file.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        response = httpx.get(f"{self.url}/v1/sessions/{session_id}", headers=headers, timeout=10)
        response.raise_for_status()
        return dict(response.json())


def start_service(setup: Setup, work: Path) -> Service:
    token_file = work / "admin.token"
    token_file.write_text(os.urandom(24).hex())
    token_file.chmod(0o600)
    port = free_port()
    process = spawn(
        [str(GLASU), "serve", "--host", "127.0.0.1", "--port", str(port),
         "--database", str(work / "service.sqlite3"), "--admin-token-file", str(token_file),
         "--public-context", str(setup.keys / "public.context"), "--log-level", "warning"],
        log=work / "service.log",
    )  # fmt: skip
    service = Service(process, port, token_file)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError((work / "service.log").read_text(errors="replace")[-2000:])
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{service.url}/healthz", timeout=1).status_code == 200:
                return service
        time.sleep(0.1)
    raise RuntimeError("glasu serve never became healthy")


def session_command(
    setup: Setup, service: Service, work: Path, *, rounds: int, eval_every: int, hidden: int
) -> list[str]:
    return [
        str(GLASU), "session", "create", "--server", service.url,
        "--admin-token-file", str(service.admin_token_file), "--dataset", "cora",
        "--data-dir", str(setup.data_dir), "--clients", str(CLIENTS), "--rounds", str(rounds),
        "--eval-every", str(eval_every), "--hidden", str(hidden), "--out", str(work / "session"),
    ]  # fmt: skip


def worker_command(
    setup: Setup, work: Path, *, client: int, port: int, session_id: str, hidden: int
) -> list[str]:
    return [
        str(GLASU), "worker", "--server", f"http://127.0.0.1:{port}", "--session", session_id,
        "--client", str(client), "--token-file", str(work / "session" / f"client-{client}.token"),
        "--data", str(work / "partitions" / f"client-{client}"),
        "--secret-context", str(setup.keys / "secret.context"), "--device", "cpu",
        "--hidden", str(hidden), "--threads", "1", "--result", str(work / f"result-{client}.json"),
    ]  # fmt: skip


# -- one scenario ---------------------------------------------------------------------------------


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
        self, plan: Plan, service: Service, session_id: str, proxies: list[Proxy], loop: ProxyLoop
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

    def follow(self, workers: list[subprocess.Popen[bytes]], *, started: float) -> str:
        """ "finished" when every worker exited, "abandoned" when one failed for good (the
        others would wait up to --peer-wait-seconds), "timeout" otherwise."""
        while time.monotonic() - started < self.plan.timeout:
            elapsed = time.monotonic() - started
            self._progress(elapsed)
            self._partition_ends(elapsed)
            self._exits(workers, elapsed)
            if all(w.poll() is not None for w in workers):
                return "finished"
            if self.failed_at is not None and elapsed > self.failed_at + GRACE:
                return "abandoned"
            time.sleep(0.2)
        return "timeout"

    def _exits(self, workers: list[subprocess.Popen[bytes]], elapsed: float) -> None:
        for m, worker in enumerate(workers):
            code = worker.poll()
            if code is None or worker.pid in self.seen:
                continue
            self.seen.add(worker.pid)
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

    def _restart(self, workers: list[subprocess.Popen[bytes]], elapsed: float) -> None:
        healed = self.partition is None or self.partition.ended_at is not None
        for m in sorted(self.pending_restart) if healed else []:
            self.pending_restart.discard(m)
            self.restarted.add(m)
            workers[m] = spawn(self.commands[m], log=self.work / f"worker-{m}.restart.log")
            self.events.append({"worker": m, "restarted": True, "at": round(elapsed, 2)})
            print(f"  [{self.plan.name}] {elapsed:6.1f} s  worker {m} started again", flush=True)

    def _progress(self, elapsed: float) -> None:
        with contextlib.suppress(httpx.HTTPError):
            status = self.service.status(self.session_id)
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
                status = self.service.status(self.session_id)
                lines = describe(status).splitlines()[:2]
                part.status_during = "; ".join(line.strip() for line in lines)
        if elapsed >= part.started_at + part.seconds:
            part.ended_at = elapsed
            print(f"  [{self.plan.name}] {elapsed:6.1f} s  partition over", flush=True)

    def step(self) -> dict[str, Any]:
        status = self.service.status(self.session_id)
        keep = ("state", "current_pass", "current_step", "waiting_for", "missing", "received")
        return {k: status[k] for k in keep if k in status}


def run_scenario(plan: Plan, setup: Setup, loop: ProxyLoop) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"{plan.name}-", dir=setup.root))
    copy_partitions(setup, work)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    service = start_service(setup, work)
    workers: list[subprocess.Popen[bytes]] = []
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
        for worker in workers:
            stop(worker)
        for proxy in proxies:
            loop.run(proxy.close())
        stop(service.process)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    run = Run(workers, proxies, watch, ending, wall, status, cpu, command, started)
    return summarize(plan, work, run)


def worker_outcome(work: Path, m: int, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    logs = [work / f"worker-{m}.log", work / f"worker-{m}.restart.log"]
    result_file = work / f"result-{m}.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    history = result.get("history") or [{}]
    retries = [line for log in logs if log.exists() for line in retry_lines(log)]
    messages = [last_line(log, prefix=f"glasu worker {m}:") for log in logs if log.exists()]
    return {
        "exit_code": process.returncode,
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

    workers: list[subprocess.Popen[bytes]]
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


# -- all scenarios, the results file and the docs section ----------------------------------------


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
        "loopback (`bench/network_faults.py`); the operator's calls go direct. "
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
        "request may take up to the HTTP read timeout of 120 s (clients/transport.py); a worker "
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_dir_argument(parser)
    parser.add_argument(
        "--quick", action="store_true", help="4 rounds, eval every 2, 10 s partition"
    )
    parser.add_argument("--rounds", type=int, help="communication rounds (10; --quick: 4)")
    parser.add_argument("--eval-every", type=int, help="evaluate every N rounds (5; --quick: 2)")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--delay", type=float, default=0.1, help="one-way delay per chunk, s")
    parser.add_argument("--loss", type=float, default=0.05, help="stall probability")
    parser.add_argument("--partition-seconds", type=float, help="30; --quick: 10")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--timeout", type=float, default=900.0, help="per scenario, s")
    parser.add_argument("--seed", type=int, default=0, help="seeds the proxies' stalls")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every scenario")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-doc", action="store_true", help="do not touch docs/results.md")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing: rewrite the docs section from the results file (--out)",
    )
    args = parser.parse_args(argv)
    defaults = (4, 2, 10.0) if args.quick else (10, 5, 30.0)
    for name, default in zip(("rounds", "eval_every", "partition_seconds"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        write_section("network-faults", section(json.loads(args.out.read_text())))
        return 0
    root = Path(tempfile.mkdtemp(prefix="glasu-netfaults-"))
    loop = ProxyLoop()
    results: list[dict[str, Any]] = []
    try:
        print(f"preparing keys and partitions in {root}", flush=True)
        setup = prepare(root, data_dir=Path(args.data_dir))
        for run in range(args.repeat):
            for plan in plans(args):
                plan = replace(plan, seed=plan.seed + 1000 * run)
                print(f"run {run + 1}/{args.repeat}, scenario {plan.name}: {plan.faults}, "
                      f"partition {plan.partition_seconds} s", flush=True)  # fmt: skip
                results.append({"run": run, **run_scenario(plan, setup, loop)})
                print(progress_line(results[-1]), flush=True)
    finally:
        loop.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    add_ratios(results)
    payload = {
        "description": __doc__.split("\n\n")[0],
        "command": " ".join(
            [".venv/bin/python", "-m", "bench.network_faults", *(argv or sys.argv[1:])]
        ),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "results": results,
    }
    write_results(payload, path=args.out)
    print(table(results))
    if not args.no_doc:
        write_section("network-faults", section(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
