"""The processes of a scenario: the keys and partitions every scenario shares, ``glasu serve``,
``glasu session create`` and the ``glasu worker`` commands."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from clients.local.processes import (
    ManagedProcess,
    ServedService,
    glasu_command,
    log_tail,
    start_process,
    start_serve,
    without_glasu_settings,
)
from secure.wire.headers import AUTHORIZATION_HEADER

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 3


def clean_env() -> dict[str, str]:
    return without_glasu_settings(OMP_NUM_THREADS="1")


def run_checked(args: list[str], *, log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(args, cwd=ROOT, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:3])} exited with {done.returncode}:\n{log_tail(log, 25)}"
        )


def spawn(args: list[str], *, log: Path) -> ManagedProcess:
    return start_process(log.stem, args, log, cwd=ROOT, env=clean_env())


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
    run_checked(glasu_command("keygen", "--out", str(root / "keys")), log=log)
    run_checked(
        glasu_command("partition", "--dataset", "cora", "--data-dir", str(planetoid),
                      "--clients", str(CLIENTS), "--out", str(root / "partitions")),
        log=log,
    )  # fmt: skip
    return Setup(root, planetoid, root / "keys", root / "partitions")


def start_service(setup: Setup, work: Path) -> ServedService:
    service = start_serve(
        work, admin_token=os.urandom(24).hex(), cwd=ROOT, env=clean_env(),
        extra_args=["--public-context", str(setup.keys / "public.context")],
    )  # fmt: skip
    service.wait_healthy(timeout=120, poll_seconds=0.1)
    return service


def session_status(service: ServedService, session_id: str) -> dict[str, Any]:
    """``GET /v1/sessions/{id}`` straight to the service (not through a proxy)."""
    headers = {AUTHORIZATION_HEADER: f"Bearer {service.admin_token}"}
    response = httpx.get(f"{service.url}/v1/sessions/{session_id}", headers=headers, timeout=10)
    response.raise_for_status()
    return dict(response.json())


def session_command(
    setup: Setup, service: ServedService, work: Path, *, rounds: int, eval_every: int, hidden: int
) -> list[str]:
    return [
        *glasu_command("session", "create"), "--server", service.url,
        "--admin-token-file", str(service.admin_token_file), "--dataset", "cora",
        "--data-dir", str(setup.data_dir), "--clients", str(CLIENTS), "--rounds", str(rounds),
        "--eval-every", str(eval_every), "--hidden", str(hidden), "--out", str(work / "session"),
    ]  # fmt: skip


def worker_command(
    setup: Setup, work: Path, *, client: int, port: int, session_id: str, hidden: int
) -> list[str]:
    return [
        *glasu_command("worker"), "--server", f"http://127.0.0.1:{port}", "--session", session_id,
        "--client", str(client), "--token-file", str(work / "session" / f"client-{client}.token"),
        "--data", str(work / "partitions" / f"client-{client}"),
        "--secret-context", str(setup.keys / "secret.context"), "--device", "cpu",
        "--hidden", str(hidden), "--threads", "1", "--result", str(work / f"result-{client}.json"),
    ]  # fmt: skip
