"""Stage 4: the service and worker images (`podman build --format docker`)."""

from __future__ import annotations

import os
from pathlib import Path

from deploy.podman_e2e import CA_BUNDLES, DEPLOY
from deploy.podman_e2e.commands import engine_env, podman, run


def ca_bundle(choice: str | None) -> str | None:
    if choice == "none":
        return None
    if choice:
        return choice
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), *CA_BUNDLES):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def build(dockerfile: str, tag: str, context: Path, bundle: str | None, *args: str) -> None:
    command = [
        "podman",
        "build",
        "--format",
        "docker",
        "--layers",
        "--force-rm",
        "--network",
        "host",
    ]
    if bundle:
        command += ["--secret", f"id=ca_bundle,src={bundle}"]
    command += [*args, "--ignorefile", str(DEPLOY / f"{dockerfile}.dockerignore")]
    command += ["--file", str(DEPLOY / dockerfile), "--tag", tag, str(context)]
    run(command, env=engine_env())


def image_size(tag: str) -> int:
    done = podman("image", "inspect", "--format", "{{.Size}}", tag, capture=True, quiet=True)
    return int(done.stdout.strip())
