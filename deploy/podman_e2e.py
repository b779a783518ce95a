#!/usr/bin/env python3
"""Build the images and run a containerized secure training with podman, end to end.

CI runs it (tests/deploy/test_podman_e2e.py, marked slow) where the machine can run containers;
elsewhere that test skips with one line. Every command it runs is printed first (``+ ...``);
docs/deploy.md lists them for anyone repeating them by hand with podman or Docker.

  1. engine   a containers.conf (through CONTAINERS_CONF) that selects runc and keeps the
              default ulimits within this shell's hard limits;
  2. base     localhost/python:3.11-bookworm: debootstrap (the mirror is read from apt's own
              configuration) plus Debian's python3, imported with `podman import`; kept;
  3. index    torch (the CPU wheel pip finds on this machine) and its dependencies as a small
              package index on 127.0.0.1: the build argument TORCH_INDEX; kept;
  4. images   glasu-service:local and glasu-worker:cpu (`podman build --format docker`; layers
              are cached by podman between runs); sizes printed;
  5. compose  deploy/compose.yaml through podman-compose: keygen and partition as one-shot
              containers, the service with TLS, a private session (DP on, epsilon 4), three
              workers, the report; the ledgers and the results on volumes;
  6. kube     deploy/k8s through `podman kube play`, as far as podman runs it: the service
              Deployment with its claim and Secrets, a second session, the three worker Jobs'
              pods;
  7. checks   after 5 and 6: every container exited 0, each worker's test accuracy is above
              chance, the session spent epsilon > 0 within its target, each worker's own ledger
              recorded every release.

Everything it started (containers, pods, volumes, networks, secrets, the index server) is
removed at the end, also on failure or Ctrl-C; --keep leaves the containers and volumes.
Root only (rootful podman). Exit code 0 passed, 1 failed, 77 cannot run here (the reason on
one line).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import html
import http.server
import json
import os
import re
import resource
import secrets
import shlex
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
BASE_IMAGE = "localhost/python:3.11-bookworm"
SERVICE_IMAGE = "glasu-service:local"
WORKER_IMAGE = "glasu-worker:cpu"
APP_UID = 10001
CLIENTS = 3
CORA_CLASSES = 7
SKIP = 77
INDEX_PORT = 38457
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets" / "planetoid"
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "glasu-e2e"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
# podman kube play runs these kinds; the manifests' other kinds are reported and skipped.
KUBE_PLAY_KINDS = {"Pod", "Deployment", "PersistentVolumeClaim", "ConfigMap", "Secret"}


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


def skip_reason() -> str | None:
    """Why the containerized run cannot happen on this machine (one line), or None."""
    if sys.platform != "linux":
        return "containers need Linux"
    if os.geteuid() != 0:
        return "needs root (rootful podman)"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install podman runc)"
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


# -- 2. the base image -----------------------------------------------------------------------


def debian_mirror(suite: str) -> str:
    """The Debian mirror apt uses here (never written into the repository)."""
    done = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE)"],
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        uri, _, release = line.strip().partition(" ")
        if release == suite:
            return uri
    raise Failed(f"apt has no source for Debian {suite}: cannot run debootstrap")


def ensure_base_image(work: Path, *, rebuild: bool) -> None:
    exists = podman("image", "exists", BASE_IMAGE, check=False, quiet=True).returncode == 0
    if exists and not rebuild:
        say(f"{BASE_IMAGE}: present")
        return
    rootfs = work / "rootfs"
    mirror = debian_mirror("bookworm")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv",
            "bookworm",
            str(rootfs),
            mirror,
        ],
        capture=True,
    )
    run(["chroot", str(rootfs), "apt-get", "clean"])
    for folder in ("var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        for child in (rootfs / folder).glob("*"):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    say(f"+ tar -C {rootfs} -c . | podman import --change ... - {BASE_IMAGE}")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        run(
            [
                "podman",
                "import",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                'CMD ["python3"]',
                "-",
                BASE_IMAGE,
            ],
            env=engine_env(),
            stdin=tar.stdout,
            capture=True,
            quiet=True,
        )
    finally:
        tar.wait()
        shutil.rmtree(rootfs, ignore_errors=True)


# -- 3. the torch index ----------------------------------------------------------------------


def torch_version() -> str:
    found = re.search(r"ARG TORCH_VERSION=(\S+)", (DEPLOY / "Dockerfile.worker").read_text())
    assert found, "Dockerfile.worker lost its TORCH_VERSION"
    return found.group(1)


def ensure_torch_index(cache: Path) -> Path:
    """A PEP 503 index of torch==TORCH_VERSION and its dependencies, made by pip from what pip
    finds here (on this machine the CPU wheel lies on disk: never the multi-GB CUDA build)."""
    version = torch_version()
    root = cache / f"torch-index-{version}"
    files = root / "files"
    if not any(files.glob(f"torch-{version}*.whl")):
        shutil.rmtree(root, ignore_errors=True)
        files.mkdir(parents=True)
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                f"torch=={version}",
                "--dest",
                str(files),
            ]
        )
    wheel = next(files.glob(f"torch-{version}*.whl"))
    if "+cpu" not in wheel.name:
        say(f"warning: {wheel.name} is not the CPU build")
    by_project: dict[str, list[Path]] = {}
    for path in sorted(files.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()
        by_project.setdefault(name, []).append(path)
    simple = root / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    for name, paths in by_project.items():
        (simple / name).mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a><br>\n'
            for p in paths
        )
        (simple / name / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
        )
    return root


@contextlib.contextmanager
def serve_directory(root: Path, port: int) -> Iterator[str]:
    """The index on a fixed port: TORCH_INDEX is a build argument, and a changed value would
    rebuild every layer after it. Another port only when that one is taken."""
    handler = functools.partial(QuietHandler, directory=str(root))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        say(f"warning: 127.0.0.1:{port} is taken: another port, so the worker's layers rebuild")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        say(f"torch index: {url} (python -m http.server --bind 127.0.0.1 --directory {root})")
        yield url
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


# -- 4. the images ---------------------------------------------------------------------------


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


# -- helpers on containers and volumes -------------------------------------------------------


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    tar = subprocess.Popen(
        [
            "tar",
            "-C",
            str(datasets),
            f"--owner={APP_UID}",
            f"--group={APP_UID}",
            "--mode=u+w",
            "-c",
            "Cora",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        run(
            ["podman", "volume", "import", volume, "-"],
            env=engine_env(),
            stdin=tar.stdout,
            capture=True,
            quiet=True,
        )
    finally:
        tar.wait()


# -- 7. the checks ---------------------------------------------------------------------------


def check_training(
    results: dict[int, dict[str, Any]], budget: dict[str, Any], ledgers: dict[int, Path]
) -> dict[str, Any]:
    """Accuracy above chance at every worker, epsilon spent within the target, every release in
    each worker's own ledger. Returns the numbers for the summary."""
    if not budget.get("enabled"):
        raise Failed(f"the session ran without differential privacy: {budget}")
    epsilon, target = budget.get("epsilon"), budget.get("epsilon_target")
    if epsilon is None or target is None or not 0 < epsilon <= target + 1e-9:
        raise Failed(f"epsilon {epsilon} is not within (0, {target}]")
    accuracies = {}
    for m in range(CLIENTS):
        result = results[m]
        if result.get("finished_reason") != "finished":
            raise Failed(f"worker {m} ended with {result.get('finished_reason')!r}")
        if not result.get("history"):
            raise Failed(f"worker {m} recorded no evaluation")
        accuracy = result["history"][-1]["test_accuracy"]
        if not accuracy > 1 / CORA_CLASSES:
            raise Failed(f"worker {m}: test accuracy {accuracy:.3f} is not above chance")
        accuracies[m] = round(accuracy, 4)
        with contextlib.closing(sqlite3.connect(f"file:{ledgers[m]}?mode=ro", uri=True)) as db:
            (rows,) = db.execute("SELECT COUNT(*) FROM releases").fetchone()
        if rows < budget["releases"]:
            raise Failed(f"worker {m}'s ledger has {rows} releases, the service {budget}")
    return {
        "test_accuracy": accuracies,
        "epsilon": round(epsilon, 4),
        "epsilon_target": target,
        "releases": budget["releases"],
    }


# -- 5. compose ------------------------------------------------------------------------------


class ComposeRun:
    """deploy/compose.yaml through podman-compose, under a project name of its own."""

    def __init__(self, work: Path, datasets: Path, rounds: int, eval_every: int) -> None:
        self.project = f"glasu-e2e-{secrets.token_hex(3)}"
        self.work = work
        self.datasets = datasets
        self.port = free_port()
        self.secrets = work / "compose-secrets"
        self.env = engine_env(
            ROUNDS=str(rounds),
            EVAL_EVERY=str(eval_every),
            SECRETS_DIR=str(self.secrets),
            PUBLISH_PORT=str(self.port),
        )
        self.compose = [
            *(podman_compose_command() or ["podman-compose"]),
            "--in-pod",
            "false",
            "--project-name",
            self.project,
            "--file",
            str(DEPLOY / "compose.yaml"),
        ]

    def containers(self) -> dict[str, str]:
        """service name -> container name."""
        done = podman(
            "ps",
            "--all",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--format",
            "json",
            capture=True,
            quiet=True,
        )
        return {
            item["Labels"]["com.docker.compose.service"]: item["Names"][0]
            for item in json.loads(done.stdout or "[]")
        }

    def waves(self) -> list[list[str]]:
        """The services in the order of their depends_on: each wave needs only earlier ones."""
        import yaml

        services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
        needs = {name: set(s.get("depends_on") or ()) for name, s in services.items()}
        waves: list[list[str]] = []
        done: set[str] = set()
        while len(done) < len(needs):
            wave = sorted(n for n, deps in needs.items() if n not in done and deps <= done)
            if not wave:
                raise Failed(f"compose.yaml has a dependency cycle among {set(needs) - done}")
            waves.append(wave)
            done.update(wave)
        return waves

    def up(self, timings: dict[str, float]) -> dict[str, Any]:
        import yaml

        make_secrets(self.secrets, "DNS:service", "DNS:localhost", "IP:127.0.0.1")
        import_dataset(f"{self.project}_datasets", self.datasets)
        services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
        # One wave of depends_on at a time, each waited for here: podman before 4.6 cannot wait
        # for `service_healthy`, and podman-compose links dependencies with `--requires`, which
        # would start the finished one-shot steps again. (Docker Compose: one `up`.)
        for wave in self.waves():
            started = time.monotonic()
            run([*self.compose, "up", "--detach", "--no-build", "--no-deps", *wave], env=self.env)
            containers = self.containers()
            for name in wave:
                if services[name].get("restart", "no") == "no":  # a one-shot step
                    run(["podman", "wait", containers[name]], env=engine_env(), timeout=3600)
                    state = container_state(containers[name])
                    say(logs_tail(containers[name], 12))
                    if state.get("ExitCode") != 0:
                        raise Failed(
                            f"compose service {name}: exit code {state.get('ExitCode')}\n"
                            f"{logs_tail(containers[name])}"
                        )
                elif services[name].get("healthcheck"):
                    wait_healthy(containers[name], timeout=180)
                    timings[f"compose: {name} start to healthy"] = round(
                        time.monotonic() - started, 1
                    )
                    ca = self.secrets / "ca.crt"
                    say(f"https://localhost:{self.port}/healthz: {https_health(self.port, ca)}")
            timings[f"compose: {' '.join(wave)}"] = round(time.monotonic() - started, 1)
        containers = self.containers()
        say(logs_tail(containers["report"], 60))
        results_dir = volume_path(f"{self.project}_results")
        results = {
            m: json.loads((results_dir / f"client-{m}.json").read_text()) for m in range(CLIENTS)
        }
        budget = json.loads((results_dir / "budget.json").read_text())
        ledgers = {
            m: volume_path(f"{self.project}_org-{m}") / "privacy-ledger.sqlite3"
            for m in range(CLIENTS)
        }
        return check_training(results, budget, ledgers)

    def down(self) -> None:
        # the containers with their anonymous volumes (the image's VOLUME), then the rest
        names = list(self.containers().values())
        if names:
            podman("rm", "--force", "--volumes", *names, check=False, capture=True)
        run([*self.compose, "down", "--volumes"], env=self.env, check=False, timeout=300)
        # whatever podman-compose left (a failed `up` can leave volumes it never recorded)
        left = podman(
            "volume", "ls", "--quiet", "--filter", f"name={self.project}_", capture=True,
            check=False, quiet=True,
        )  # fmt: skip
        for name in left.stdout.split():
            podman("volume", "rm", "--force", name, check=False, capture=True)


# -- 6. Kubernetes through podman kube play --------------------------------------------------


def kustomize(folder: Path, files: Path) -> list[dict[str, Any]]:
    """What `kubectl kustomize FOLDER` gives for this project's kustomizations (namespace,
    labels, secretGenerator and configMapGenerator from files, images), with the generator
    files read from FILES instead of FOLDER/secrets/ and no name hashes."""
    import yaml

    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization.get("resources", []):
        docs += [d for d in yaml.safe_load_all((folder / name).read_text()) if d]
    for kind, key in (("Secret", "secretGenerator"), ("ConfigMap", "configMapGenerator")):
        for generator in kustomization.get(key, []):
            data = {}
            for entry in generator["files"]:
                item, _, source = entry.partition("=")
                raw = (files / Path(source).name).read_bytes()
                data[item] = base64.b64encode(raw).decode() if kind == "Secret" else raw.decode()
            doc = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
            if generator.get("type"):
                doc["type"] = generator["type"]
            doc["data"] = data
            docs.append(doc)
    images = {i["name"]: i for i in kustomization.get("images", [])}
    labels = {}
    for entry in kustomization.get("labels", []):
        labels.update(entry.get("pairs", {}))
    for doc in docs:
        doc["metadata"]["namespace"] = kustomization.get("namespace")
        doc["metadata"].setdefault("labels", {}).update(labels)
        for container in pod_containers(doc):
            name, _, _ = container["image"].partition(":")
            if name in images:
                image = images[name]
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] == "Pod":
        return doc["spec"]
    if doc["kind"] in ("Deployment", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(doc)
    return [] if spec is None else spec.get("initContainers", []) + spec.get("containers", [])


class KubeRun:
    """deploy/k8s/service and deploy/k8s/workers through `podman kube play`."""

    def __init__(self, work: Path, datasets: Path, rounds: int, eval_every: int) -> None:
        self.work = work / "kube"
        self.datasets = datasets
        self.rounds = rounds
        self.eval_every = eval_every
        self.tag = secrets.token_hex(3)
        self.network = f"glasu-kube-{self.tag}"
        self.dataset_claim = f"glasu-e2e-datasets-{self.tag}"
        self.played: list[Path] = []
        self.volumes: list[str] = [self.dataset_claim]
        self.skipped: dict[str, int] = {}
        self.notes: set[str] = set()
        self.host_ports: dict[str, int] = {}  # "container/port name" -> published host port

    def adapt(self, docs: list[dict[str, Any]], **changes: Any) -> list[dict[str, Any]]:
        """What podman runs of the manifests, with the changes a CPU-only, registry-less
        podman host needs (each said on the log)."""
        kept = []
        secrets_by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
        for doc in docs:
            kind = doc["kind"]
            if kind == "Secret":  # podman 4.3 mounts a Secret's base64 text, not its value
                self.skipped["Secret (mounted from a host directory)"] = (
                    self.skipped.get("Secret (mounted from a host directory)", 0) + 1
                )
                continue
            if kind == "Job":  # podman runs no Jobs: run its pod, Never restarted, as a Pod
                doc = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        **doc["metadata"],
                        "labels": doc["spec"]["template"]["metadata"]["labels"],
                    },
                    "spec": doc["spec"]["template"]["spec"],
                }
                self.skipped["Job (run as its Pod)"] = (
                    self.skipped.get("Job (run as its Pod)", 0) + 1
                )
            elif kind not in KUBE_PLAY_KINDS:
                self.skipped[kind] = self.skipped.get(kind, 0) + 1
                continue
            spec = pod_spec(doc)
            if spec is not None:
                spec.pop("tolerations", None)
                for volume in spec.get("volumes", []):
                    if "secret" in volume:
                        secret = secrets_by_name[volume.pop("secret")["secretName"]]
                        volume["hostPath"] = {
                            "path": str(self.secret_directory(secret)),
                            "type": "Directory",
                        }
                    if volume["name"] == "dataset":  # the demo's download: a filled claim here
                        volume.pop("emptyDir", None)
                        volume["persistentVolumeClaim"] = {"claimName": self.dataset_claim}
                self.resolve_sub_paths(spec)
                for container in pod_containers(doc):
                    self.publish_on_free_ports(container)
                    container["image"] = changes.get("image", container["image"])
                    for env in container.get("env", []):
                        if env["name"] == "GLASU_DEVICE":
                            env["value"] = "cpu"
                    for part in ("requests", "limits"):
                        container.get("resources", {}).get(part, {}).pop("nvidia.com/gpu", None)
                if "host_aliases" in changes:
                    spec["hostAliases"] = changes["host_aliases"]
            kept.append(doc)
        return kept

    def publish_on_free_ports(self, container: dict[str, Any]) -> None:
        """podman 4.x publishes a containerPort without hostPort on the same host port, so a
        taken 8443 would fail the run: each port gets a free host port instead."""
        for port in container.get("ports", []):
            if "hostPort" not in port:
                port["hostPort"] = free_port()
                name = f"{container['name']}/{port.get('name', port['containerPort'])}"
                self.host_ports[name] = port["hostPort"]
                self.notes.add("containerPort: published on a free host port (podman 4.x)")

    def resolve_sub_paths(self, spec: dict[str, Any]) -> None:
        """podman 4.3 ignores `subPath` on a claim: such a claim becomes a host directory, and
        each mount with a subPath a volume of its subdirectory."""
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        containers = spec.get("initContainers", []) + spec.get("containers", [])
        for container in containers:
            for mount in container.get("volumeMounts", []):
                sub_path = mount.pop("subPath", None)
                if sub_path is None:
                    continue
                volume = volumes[mount["name"]]
                if "persistentVolumeClaim" in volume:
                    claim = volume.pop("persistentVolumeClaim")["claimName"]
                    volume["hostPath"] = {"path": str(self.app_dir("claims", claim))}
                    volume["hostPath"]["type"] = "Directory"
                path = Path(volume["hostPath"]["path"])
                name = f"{mount['name']}-{sub_path}".replace("/", "-")
                if name not in volumes:
                    own = self.app_dir("claims", path.name, sub_path)
                    volumes[name] = {"name": name, "hostPath": {"path": str(own)}}
                    volumes[name]["hostPath"]["type"] = "Directory"
                    spec["volumes"].append(volumes[name])
                mount["name"] = name
        self.notes.add("subPath on a claim: a host directory per subPath (podman 4.3)")

    def app_dir(self, *parts: str) -> Path:
        folder = self.work.joinpath(*parts)
        folder.mkdir(parents=True, exist_ok=True)
        current = self.work
        for part in parts:
            current = current / part
            owned_by_app(current, 0o750)
        return folder

    def secret_directory(self, secret: dict[str, Any]) -> Path:
        """A Secret's files, decoded, owned by the containers' uid, mode 0400."""
        folder = self.work / "secret-volumes" / secret["metadata"]["name"]
        if not folder.is_dir():
            folder.mkdir(parents=True)
            for key, value in secret["data"].items():
                (folder / key).write_bytes(base64.b64decode(value))
                owned_by_app(folder / key)
            owned_by_app(folder, 0o500)
        return folder

    def play(self, name: str, docs: list[dict[str, Any]]) -> None:
        import yaml

        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        # podman makes a volume of each claim and of each ConfigMap mounted as a volume
        claims = [
            d["metadata"]["name"]
            for d in docs
            if d["kind"] in ("PersistentVolumeClaim", "ConfigMap")
        ]
        for claim in claims:  # a claim is a podman volume of that name: none may be left over
            podman("volume", "rm", "--force", claim, check=False, capture=True, quiet=True)
        self.volumes += claims
        self.played.append(path)
        podman("kube", "play", "--network", self.network, str(path), capture=True)

    def up(self, timings: dict[str, float]) -> dict[str, Any]:
        self.work.mkdir(parents=True)
        files = self.work / "files"
        files.mkdir()
        service_names = [
            "DNS:glasu-service",
            "DNS:glasu-service.glasu.svc",
            "DNS:glasu-service.glasu.svc.cluster.local",
            "DNS:localhost",
            "IP:127.0.0.1",
        ]
        make_secrets(files, *service_names)
        shutil.copy(files / "server.crt", files / "tls.crt")
        shutil.copy(files / "server.key", files / "tls.key")
        podman("network", "create", self.network, capture=True)
        import_dataset(self.dataset_claim, self.datasets)
        # the CKKS key pair, from the service image (torch-free)
        keys = self.work / "keys"
        keys.mkdir()
        os.chown(keys, APP_UID, APP_UID)
        podman(
            "run", "--rm", "--read-only", "--cap-drop", "ALL", "--volume", f"{keys}:/keys",
            SERVICE_IMAGE, "keygen", "--out", "/keys",
        )  # fmt: skip
        shutil.copy(keys / "public.context", files / "public.context")
        shutil.copy(keys / "secret.context", files / "secret.context")

        started = time.monotonic()
        service_docs = self.adapt(
            kustomize(DEPLOY / "k8s" / "service", files), image=f"localhost/{SERVICE_IMAGE}"
        )
        self.play("service", service_docs)
        container = self.container_of("glasu-service", "service")
        probe = podman(
            "inspect", "--format", "{{json .Config.Healthcheck}}", container,
            capture=True, quiet=True,
        ).stdout.strip()  # fmt: skip
        say(f"podman's health check from the probes: {probe}")
        # The image's own check: podman turns an httpGet probe into `curl`, which the image
        # lacks (and runs it on systemd timers only).
        wait_healthy(container, timeout=180, command=["python", "/opt/glasu/share/healthcheck.py"])
        timings["kube: service start to healthy"] = round(time.monotonic() - started, 1)
        address = podman(
            "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            container, capture=True, quiet=True,
        ).stdout.strip()  # fmt: skip
        say(f"service pod at {address}; published on the host: {self.host_ports}")

        # the operator: a private session, from the worker image (it reads the dataset)
        session = self.work / "session"
        session.mkdir()
        os.chown(session, APP_UID, APP_UID)
        podman(
            "run", "--rm", "--network", self.network,
            "--add-host", f"glasu-service.glasu.svc:{address}",
            "--volume", f"{files / 'admin.token'}:/run/secrets/admin_token:ro",
            "--volume", f"{files / 'ca.crt'}:/run/secrets/ca_cert:ro",
            "--volume", f"{self.dataset_claim}:/srv/glasu/data",
            "--volume", f"{session}:/run/glasu/session",
            "--entrypoint", "glasu", WORKER_IMAGE,
            "session", "create", "--server", "https://glasu-service.glasu.svc:8443",
            "--admin-token-file", "/run/secrets/admin_token", "--ca-file", "/run/secrets/ca_cert",
            "--dataset", "cora", "--data-dir", "/srv/glasu/data", "--clients", str(CLIENTS),
            "--rounds", str(self.rounds), "--eval-every", str(self.eval_every),
            "--out", "/run/glasu/session",
        )  # fmt: skip
        for name in ["session.id", *(f"client-{m}.token" for m in range(CLIENTS))]:
            shutil.copy(session / name, files / name)
        worker_docs = self.adapt(
            kustomize(DEPLOY / "k8s" / "workers", files),
            image=f"localhost/{WORKER_IMAGE}",
            host_aliases=[{"ip": address, "hostnames": ["glasu-service.glasu.svc"]}],
        )
        self.play("workers", worker_docs)
        names = [self.container_of(f"glasu-worker-{m}", "worker") for m in range(CLIENTS)]
        run(["podman", "wait", *names], env=engine_env(), timeout=3600)
        for name in names:
            state = container_state(name)
            if state.get("ExitCode") != 0:
                raise Failed(f"{name}: exit code {state.get('ExitCode')}\n{logs_tail(name)}")
        results = {
            m: json.loads(
                (volume_path(f"glasu-worker-{m}-results") / f"client-{m}.json").read_text()
            )
            for m in range(CLIENTS)
        }
        budget = json.loads(
            podman(
                "run",
                "--rm",
                "--network",
                self.network,
                "--add-host",
                f"glasu-service.glasu.svc:{address}",
                "--volume",
                f"{files / 'admin.token'}:/run/secrets/admin_token:ro",
                "--volume",
                f"{files / 'ca.crt'}:/run/secrets/ca_cert:ro",
                SERVICE_IMAGE,
                "budget",
                "--server",
                "https://glasu-service.glasu.svc:8443",
                "--session",
                (files / "session.id").read_text().strip(),
                "--token-file",
                "/run/secrets/admin_token",
                "--ca-file",
                "/run/secrets/ca_cert",
                "--json",
                capture=True,
            ).stdout
        )
        ledgers = {m: self.partition_ledger(names[m]) for m in range(CLIENTS)}
        checked = check_training(results, budget, ledgers)
        checked["not run by podman kube play"] = dict(self.skipped)
        checked["adapted"] = sorted(self.notes)
        return checked

    def container_of(self, workload: str, container: str) -> str:
        """The podman name of a container of a played workload (pod `NAME` or `NAME-pod-0`)."""
        done = podman("ps", "--all", "--format", "json", capture=True, quiet=True)
        for item in json.loads(done.stdout or "[]"):
            name = item["Names"][0]
            if name in (f"{workload}-{container}", f"{workload}-pod-0-{container}"):
                return name
        seen = [(i.get("PodName"), i["Names"][0]) for i in json.loads(done.stdout or "[]")]
        raise Failed(f"podman runs no container {container} of {workload}: {seen}")

    def partition_ledger(self, container: str) -> Path:
        """The worker's ledger lies in its partition directory (a volume of the pod)."""
        mounts = json.loads(
            podman(
                "inspect", "--format", "{{json .Mounts}}", container, capture=True, quiet=True
            ).stdout
        )
        for mount in mounts:
            if mount["Destination"] == "/srv/glasu/partition":
                return Path(mount["Source"]) / "privacy-ledger.sqlite3"
        raise Failed(f"{container} has no /srv/glasu/partition mount")

    def down(self) -> None:
        for path in reversed(self.played):
            podman("kube", "down", str(path), check=False, capture=True)
        for name in self.volumes:
            podman("volume", "rm", "--force", name, check=False, capture=True)
        podman("network", "rm", "--force", self.network, check=False, capture=True)
        # made by `kube play` beside --network; removed unless something else uses it
        podman("network", "rm", "podman-default-kube-network", check=False, capture=True)
        for name in (
            "glasu-admin-token",
            "glasu-public-context",
            "glasu-service-tls",
            *(f"glasu-org-{m}" for m in range(CLIENTS)),
        ):
            podman("secret", "rm", name, check=False, capture=True, quiet=True)


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each session (4)")
    parser.add_argument("--eval-every", type=int, default=2, help="evaluation period (2)")
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS, help="holds Cora/")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="the torch index")
    parser.add_argument("--context", type=Path, default=REPO, help="build context (the repo)")
    parser.add_argument("--index-port", type=int, default=INDEX_PORT, help="torch index port")
    parser.add_argument("--ca-bundle", help="CA bundle for pip inside builds ('none': none)")
    parser.add_argument("--skip-compose", action="store_true", help="kube play only")
    parser.add_argument("--skip-kube", action="store_true", help="compose only")
    parser.add_argument("--rebuild-base", action="store_true", help=f"remake {BASE_IMAGE}")
    parser.add_argument("--keep", action="store_true", help="leave containers and volumes")
    parser.add_argument("--summary", type=Path, help="write the timings and checks as JSON")
    args = parser.parse_args(argv)

    reason = skip_reason()
    if reason:
        print(f"podman e2e cannot run here: {reason}", flush=True)
        return SKIP
    if not (args.datasets / "Cora").is_dir():
        print(f"podman e2e: no Cora under {args.datasets} (--datasets)", file=sys.stderr)
        return 1
    say(
        f"CONTAINERS_CONF={engine_env()['CONTAINERS_CONF']}:\n{Path(engine_env()['CONTAINERS_CONF']).read_text()}"
    )
    work = Path(tempfile.mkdtemp(prefix="glasu-e2e-", dir="/var/tmp"))
    timings: dict[str, float] = {}
    summary: dict[str, Any] = {"timings_s": timings}
    runs: list[ComposeRun | KubeRun] = []

    def stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    try:
        with timed("base image", timings):
            ensure_base_image(work, rebuild=args.rebuild_base)
        with timed("torch index", timings):
            index_root = ensure_torch_index(args.cache)
        bundle = ca_bundle(args.ca_bundle)
        with serve_directory(index_root, args.index_port) as index:
            with timed("service image", timings):
                build(
                    "Dockerfile.service", SERVICE_IMAGE, args.context, bundle,
                    "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}",
                )  # fmt: skip
            with timed("worker image", timings):
                build(
                    "Dockerfile.worker", WORKER_IMAGE, args.context, bundle,
                    "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", "--build-arg", "VARIANT=cpu",
                    "--build-arg", f"TORCH_INDEX={index}",
                )  # fmt: skip
        summary["image_mb"] = {
            tag: round(image_size(tag) / 1e6) for tag in (BASE_IMAGE, SERVICE_IMAGE, WORKER_IMAGE)
        }
        say(f"image sizes (MB): {summary['image_mb']}")
        if not args.skip_compose:
            compose = ComposeRun(work, args.datasets, args.rounds, args.eval_every)
            runs.append(compose)
            with timed("compose run", timings):
                summary["compose"] = compose.up(timings)
            say(f"compose: {summary['compose']}")
        if not args.skip_kube:
            kube = KubeRun(work, args.datasets, args.rounds, args.eval_every)
            runs.append(kube)
            with timed("kube run", timings):
                summary["kube"] = kube.up(timings)
            say(f"kube: {summary['kube']}")
        summary["passed"] = True
    except (Exception, KeyboardInterrupt) as exc:
        summary["passed"] = False
        summary["error"] = str(exc) if isinstance(exc, Failed) else repr(exc)
        if not isinstance(exc, Failed | KeyboardInterrupt):
            traceback.print_exc()
        print(f"podman e2e FAILED: {exc}", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            with timed("teardown", timings):
                for each in reversed(runs):
                    each.down()
                shutil.rmtree(work, ignore_errors=True)
        timings["total"] = round(time.monotonic() - started, 1)
        say(json.dumps(summary, indent=2))
        if args.summary:
            args.summary.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
