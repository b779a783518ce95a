"""What the compose and kube runs share: containers' state and logs, health, secrets owned
by the containers' user, the dataset imported into a volume."""

from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from deploy.podman_e2e import APP_UID, DEPLOY
from deploy.podman_e2e.commands import Failed, engine_env, podman, run, run_piped, say


def volume_path(name: str) -> Path:
    done = podman("volume", "inspect", "--format", "{{.Mountpoint}}", name, capture=True)
    return Path(done.stdout.strip())


def container_state(name: str) -> dict[str, Any]:
    done = podman("inspect", "--format", "{{json .State}}", name, capture=True, quiet=True)
    return json.loads(done.stdout)


def logs_tail(name: str, lines: int = 40) -> str:
    done = subprocess.run(
        ["podman", "logs", "--tail", str(lines), name],
        capture_output=True,
        text=True,
        env=engine_env(),
    )
    return (done.stdout + done.stderr).strip()


def wait_healthy(container: str, timeout: float, command: list[str] | None = None) -> float:
    """Run the image's HEALTHCHECK until it passes (podman's timers need systemd), or
    ``command`` inside the container."""
    started = time.monotonic()
    check_args = ["exec", container, *command] if command else ["healthcheck", "run", container]
    while True:
        state = container_state(container)
        if state.get("Status") != "running":
            raise Failed(f"{container} stopped ({state.get('Status')}):\n{logs_tail(container)}")
        check = subprocess.run(["podman", *check_args], capture_output=True, env=engine_env())
        if check.returncode == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise Failed(f"{container} not healthy after {timeout:.0f} s:\n{logs_tail(container)}")
        time.sleep(1)


def https_health(port: int, ca: Path, host: str = "localhost") -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://{host}:{port}/healthz")
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)


def owned_by_app(path: Path, mode: int = 0o400) -> None:
    os.chown(path, APP_UID, APP_UID)
    path.chmod(mode)


def make_secrets(folder: Path, *names: str) -> None:
    """A development CA and server certificate (deploy/dev-ca.sh) and an admin token, owned by
    the containers' uid, mode 0400."""
    run(["sh", str(DEPLOY / "dev-ca.sh"), str(folder), *names], capture=True)
    (folder / "admin.token").write_text(secrets.token_urlsafe(32) + "\n")
    for name in ("admin.token", "server.crt", "server.key", "ca.crt"):
        owned_by_app(folder / name)


def import_dataset(volume: str, datasets: Path) -> None:
    """Cora's files into a fresh volume, owned and writable by the containers' uid (PyG writes
    its processed copy beside the raw files; the shared copy may be read-only): nothing is
    downloaded."""
    podman("volume", "create", volume, capture=True)
    say(
        f"+ tar -C {datasets} --owner={APP_UID} --group={APP_UID} --mode=u+w -c Cora"
        f" | podman volume import {volume} -"
    )
    run_piped(
        ["tar", "-C", str(datasets), f"--owner={APP_UID}", f"--group={APP_UID}", "--mode=u+w",
         "-c", "Cora"],
        ["podman", "volume", "import", volume, "-"],
    )  # fmt: skip
