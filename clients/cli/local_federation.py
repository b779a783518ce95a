"""``glasu train --transport http``: the service and one worker process per client on this
machine, over real HTTP on loopback. Every process started here is stopped here, whatever
happens."""

from __future__ import annotations

import json
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from clients.admin import AdminClient, ServiceUnavailable
from clients.cli.errors import EXIT_INTERRUPTED, CliError
from models.config import TrainConfig
from models.data import GraphDataset
from models.layout import FederationLayout, eval_nodes
from models.partition import save_partition
from models.report import HistoryEntry, RunReport, build_report

STARTUP_SECONDS = 60.0


class FederationFailed(CliError, RuntimeError):
    """A process of the local federation failed; the message says which and why."""


@dataclass
class ManagedProcess:
    name: str
    process: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def glasu_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "clients.cli.main", *args]


def session_request(
    config: TrainConfig, plan: FederationLayout, dataset: GraphDataset
) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body for ``config``."""
    width = config.release_width if config.private else config.hidden
    return {
        "clients": len(plan.partitions),
        "layers": config.layers,
        "agg_layers": [{"layer": layer, "width": width} for layer in plan.client_config.agg_layers],
        "stale": plan.client_config.stale,
        "rounds": config.rounds,
        "eval_every": config.eval_every,
        "batch_size": config.batch_size,
        "fanout": config.fanout,
        "num_nodes": dataset.num_nodes,
        "train_nodes": dataset.train_nodes.tolist(),
        "eval_nodes": eval_nodes(dataset).tolist(),
        "seed": config.seed,
        "encryption": "ckks" if config.encrypted else "none",
        "privacy": config.privacy_request(),
        "label": f"glasu train {config.dataset} {config.mode}",
    }


def train_over_http(
    config: TrainConfig,
    plan: FederationLayout,
    dataset: GraphDataset,
    *,
    threads: int = 1,
    progress: bool = True,
    work_dir: Path | None = None,
) -> RunReport:
    if len(plan.groups) != 1:
        raise ValueError(
            "this mode trains clients independently; run it with "
            "--transport inprocess (it sends nothing)"
        )
    started = time.perf_counter()
    with ExitStack() as stack:
        # A process that is still writing its log while the directory goes must not turn an
        # interrupted run into an OSError.
        root = work_dir or Path(
            stack.enter_context(
                tempfile.TemporaryDirectory(prefix="glasu-", ignore_cleanup_errors=True)
            )
        )
        processes: list[ManagedProcess] = []
        stack.callback(stop_all, processes)
        admin_token = secrets.token_urlsafe(32)
        admin_file = _secret_file(root / "admin.token", admin_token)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve_args = [
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database",
            str(root / "service.sqlite3"),
            "--admin-token-file",
            str(admin_file),
            "--log-level",
            "warning",
        ]
        secret_context = None
        if config.encrypted:
            from secure.he import generate_keys

            secret_context, public_context = generate_keys(root / "keys")
            serve_args += ["--public-context", str(public_context)]
        processes.append(_start("service", glasu_command(*serve_args), root / "service.log"))
        admin = stack.enter_context(AdminClient(base_url=url, token=admin_token))
        _wait_healthy(admin, processes[0])
        created = admin.create_session(session_request(config, plan, dataset))
        session_id = created["session_id"]
        for part, token in zip(plan.partitions, created["client_tokens"], strict=True):
            folder = save_partition(part, root / "partitions")
            token_file = _secret_file(root / f"client-{part.client}.token", token)
            args = [
                "worker",
                "--server",
                url,
                "--session",
                session_id,
                "--client",
                str(part.client),
                "--token-file",
                str(token_file),
                "--data",
                str(folder),
                "--device",
                config.device,
                "--backbone",
                config.backbone,
                "--hidden",
                str(config.hidden),
                "--dropout",
                str(config.dropout),
                "--lr",
                str(config.lr),
                "--weight-decay",
                str(config.weight_decay),
                "--eval-fanout",
                str(config.eval_fanout),
                "--seed",
                str(config.seed),
                "--threads",
                str(threads),
                "--result",
                str(root / f"client-{part.client}.json"),
                "--quiet",
            ]
            if secret_context:
                args += ["--secret-context", str(secret_context)]
            if config.noise_seed is not None:
                args += ["--noise-seed", str(config.noise_seed)]
            processes.append(
                _start(
                    f"worker {part.client}",
                    glasu_command(*args),
                    root / f"client-{part.client}.log",
                )
            )
        _follow(admin, session_id, processes, created["passes_total"], progress)
        results = [
            json.loads((root / f"client-{m}.json").read_text()) for m in range(len(plan.partitions))
        ]
        privacy = admin.privacy(session_id)
    return _report(
        config, plan, dataset, results, privacy, wall_seconds=time.perf_counter() - started
    )


def _secret_file(path: Path, content: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(content)
    return path


def _start(name: str, command: Sequence[str], log_path: Path) -> ManagedProcess:
    log = log_path.open("wb")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    log.close()
    return ManagedProcess(name=name, process=process, log_path=log_path)


def stop_all(processes: Sequence[ManagedProcess], grace: float = 5.0) -> None:
    """Workers first, the service last; SIGTERM, then SIGKILL after ``grace`` seconds. A second
    Ctrl-C while they stop kills the rest at once instead of leaving them behind."""
    for managed in reversed(processes):
        if managed.process.poll() is None:
            managed.process.terminate()
    deadline = time.monotonic() + grace
    try:
        for managed in reversed(processes):
            try:
                managed.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                managed.process.kill()
                managed.process.wait()
    except KeyboardInterrupt:
        for managed in processes:
            if managed.process.poll() is None:
                managed.process.kill()
        for managed in processes:
            managed.process.wait()
        raise


def _exit_failure(managed: ManagedProcess, code: int) -> FederationFailed:
    """How a process of the federation ended, for people. Interrupted processes (Ctrl-C
    reaches the whole process group) are named without their log, which may end in a
    traceback of the interruption."""
    if code in (EXIT_INTERRUPTED, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL):
        how = "was interrupted" if code in (EXIT_INTERRUPTED, -signal.SIGINT) else "was killed"
        return FederationFailed(f"{managed.name} {how} (exit code {code})")
    return FederationFailed(f"{managed.name} exited with code {code}:\n{managed.tail()}")


def _wait_healthy(admin: AdminClient, service: ManagedProcess) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        code = service.process.poll()
        if code is not None:
            raise _exit_failure(service, code)
        if admin.healthy(timeout=2.0):
            return
        time.sleep(0.2)
    raise FederationFailed(
        f"the service did not become healthy in {STARTUP_SECONDS:.0f} s:\n{service.tail()}"
    )


def _follow(
    admin: AdminClient,
    session_id: str,
    processes: Sequence[ManagedProcess],
    passes_total: int,
    progress: bool,
) -> dict[str, Any]:
    """Show one progress bar for the whole federation until every worker has exited; fail fast
    (naming the process) when any process dies with an error."""
    workers = processes[1:]
    bar = tqdm(
        total=passes_total, desc="federation", unit="pass", disable=not progress, leave=False
    )
    status: dict[str, Any] = {}

    def check_processes() -> None:
        for managed in processes:
            code = managed.process.poll()
            if code not in (None, 0) or (managed is processes[0] and code is not None):
                raise _exit_failure(managed, code)

    try:
        while True:
            check_processes()
            try:
                status = admin.session(session_id)
            except ServiceUnavailable:
                # The service may have stopped between the check and the call (it is the first
                # to go when Ctrl-C reaches the process group): name it rather than the symptom.
                with suppress(subprocess.TimeoutExpired):
                    processes[0].process.wait(timeout=1.0)
                check_processes()
                raise
            bar.update(max(0, min(status["current_pass"], passes_total) - bar.n))
            evals = [m for m in status.get("metrics", []) if m.get("val_accuracy") is not None]
            if evals:
                bar.set_postfix(round=evals[-1]["round"], val=f"{evals[-1]['val_accuracy']:.3f}")
            if all(w.process.poll() == 0 for w in workers):
                return status
            time.sleep(0.3)
    finally:
        bar.close()


def _report(
    config: TrainConfig,
    layout: FederationLayout,
    dataset: GraphDataset,
    results: list[dict[str, Any]],
    privacy: dict[str, Any],
    *,
    wall_seconds: float,
) -> RunReport:
    """The workers' histories, one row per evaluation, averaged over clients (bytes summed)."""
    epsilon_at_pass = {entry["pass"]: entry["epsilon"] for entry in privacy.get("ledger", [])}

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return float(np.mean([row[key] for row in rows]))

    history = [
        HistoryEntry(
            round=rows[0]["round"],
            loss=mean(rows, "loss"),
            val_accuracy=mean(rows, "val_accuracy"),
            test_accuracy=mean(rows, "test_accuracy"),
            bytes_up=sum(row["bytes_up"] for row in rows),
            bytes_down=sum(row["bytes_down"] for row in rows),
            training_bytes=sum(row["training_bytes"] for row in rows),
            epsilon=epsilon_at_pass.get(rows[0]["pass"]),
        )
        for rows in zip(*(res["history"] for res in results), strict=True)
    ]
    reasons = {res["finished_reason"] for res in results}
    stopped = next((r for r in reasons if r != "finished"), None)
    try:
        return build_report(
            config,
            transport="http",
            history=history,
            agg_layers=layout.client_config.agg_layers,
            stale=layout.client_config.stale,
            split_note=dataset.split_note,
            devices=[res["device"] for res in results],
            wall_seconds=wall_seconds,
            privacy=privacy if privacy.get("enabled") else None,
            bytes_up=sum(res["bytes_up"] for res in results),
            bytes_down=sum(res["bytes_down"] for res in results),
            stopped_early=stopped,
        )
    except ValueError as exc:  # no evaluation before the session ended
        raise FederationFailed(str(exc)) from exc
