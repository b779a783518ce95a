"""The Kubernetes manifests: the Kubernetes OpenAPI schemas (kubernetes-validate ships them, so
this runs offline), the kustomizations, and the references and policies between objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deploykit import (
    K8S,
    k8s_patches,
    k8s_resources,
    kustomizations,
    pod_specs,
    render_kustomization,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")

WORKER_LABELS = {"app.kubernetes.io/name": "glasu", "app.kubernetes.io/component": "worker"}
SERVICE_LABELS = {"app.kubernetes.io/name": "glasu", "app.kubernetes.io/component": "service"}
SECRET_LIMIT_BYTES = 1024 * 1024  # a Secret holds at most 1 MiB


def _resource_id(item: tuple[Path, dict[str, Any]]) -> str:
    path, doc = item
    return f"{path.parent.name}/{path.name}:{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("item", k8s_resources(), ids=_resource_id)
def test_resources_match_the_kubernetes_schema(item: tuple[Path, dict[str, Any]]) -> None:
    _, doc = item
    version = kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{_resource_id(item)} against Kubernetes {version}: {exc.message}")


def test_the_schema_check_can_fail() -> None:
    _, deployment = next(i for i in k8s_resources() if i[1]["kind"] == "Deployment")
    deployment = yaml.safe_load(yaml.safe_dump(deployment))
    deployment["spec"]["replica"] = deployment["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_every_manifest_is_listed_in_a_kustomization() -> None:
    listed = {path for path, _ in k8s_resources()} | k8s_patches()
    on_disk = {p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert on_disk == listed
    for folder, kustomization in kustomizations().items():
        assert kustomization["kind"] == "Kustomization" and kustomization["namespace"] == "glasu"
        for generator in kustomization.get("secretGenerator", []) + kustomization.get(
            "configMapGenerator", []
        ):
            for entry in generator["files"]:
                source = Path(entry.partition("=")[2] or entry)
                # Generated from files the operator provides, which git never sees.
                assert source.parts[0] == "secrets", f"{folder.name}: {entry}"


def _generated(kind: str) -> set[str]:
    key = {"Secret": "secretGenerator", "ConfigMap": "configMapGenerator"}[kind]
    names = {g["name"] for k in kustomizations().values() for g in k.get(key, [])}
    return names | {d["metadata"]["name"] for _, d in k8s_resources() if d["kind"] == kind}


def test_every_reference_resolves() -> None:
    secrets, config_maps = _generated("Secret"), _generated("ConfigMap")
    claims = {
        d["metadata"]["name"] for _, d in k8s_resources() if d["kind"] == "PersistentVolumeClaim"
    }
    accounts = {d["metadata"]["name"] for _, d in k8s_resources() if d["kind"] == "ServiceAccount"}
    for path, workload, spec in pod_specs():
        where = f"{path.name}:{workload['metadata']['name']}"
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        templates = workload["spec"].get("volumeClaimTemplates", [])  # a StatefulSet's claims
        volumes |= {t["metadata"]["name"]: {"claimTemplate": t} for t in templates}
        for volume in volumes.values():
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, where
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, where
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts, where
        for container in spec.get("initContainers", []) + spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{where}: {mount['name']}"
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("configMapKeyRef")
                if ref:
                    assert ref["name"] in config_maps, where
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, where


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in k8s_resources() if d["kind"] == kind]
    if name:
        found = [d for d in found if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


def test_the_service_deployment() -> None:
    deployment = _one("Deployment", "glasu-service")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod = spec["template"]
    assert pod["metadata"]["labels"] == SERVICE_LABELS == spec["selector"]["matchLabels"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}

    def volume_of(path: str) -> dict[str, Any]:
        mount = next(m for p, m in mounts.items() if path.startswith(p.rstrip("/") + "/"))
        return volumes[mount["name"]] | {"readOnly": mount.get("readOnly", False)}

    assert "persistentVolumeClaim" in volume_of(env["GLASU_DATABASE"])
    for name, secret in (
        ("GLASU_ADMIN_TOKEN_FILE", "glasu-admin-token"),
        ("GLASU_PUBLIC_CONTEXT", "glasu-public-context"),
        ("GLASU_TLS_CERTFILE", "glasu-service-tls"),
        ("GLASU_TLS_KEYFILE", "glasu-service-tls"),
    ):
        volume = volume_of(env[name])
        assert volume["secret"]["secretName"] == secret and volume["readOnly"], name
    port = container["ports"][0]
    assert str(port["containerPort"]) == env["GLASU_PORT"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == ("/healthz", "HTTPS", port["name"])
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    tls = next(g for k in kustomizations().values() for g in k.get("secretGenerator", [])
               if g["name"] == "glasu-service-tls")  # fmt: skip
    assert tls["type"] == "kubernetes.io/tls"
    service = _one("Service", "glasu-service")
    assert service["spec"]["selector"] == SERVICE_LABELS
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]


def test_the_network_policy_admits_only_the_workers() -> None:
    policy = _one("NetworkPolicy", "glasu-service-ingress")["spec"]
    assert policy["podSelector"]["matchLabels"] == SERVICE_LABELS
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert peer == {"podSelector": {"matchLabels": WORKER_LABELS}}  # no namespace or ipBlock
    (port,) = rule["ports"]
    assert port == {"protocol": "TCP", "port": 8443}
    jobs = [w for _, w, _ in pod_specs() if w["kind"] == "Job"]
    assert jobs
    for job in jobs:  # every worker pod carries the admitted labels
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert WORKER_LABELS.items() <= labels.items()
    for _, workload, _ in pod_specs():  # and nothing else does
        if workload["kind"] != "Job":
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert not WORKER_LABELS.items() <= labels.items()


def test_the_worker_jobs() -> None:
    clients = set()
    for _, job, spec in pod_specs():
        if job["kind"] != "Job":
            continue
        (container,) = spec["containers"]
        env = {e["name"]: e for e in container["env"]}
        m = int(env["GLASU_CLIENT"]["value"])
        clients.add(m)
        assert job["metadata"]["name"] == f"glasu-worker-{m}"
        assert env["GLASU_SERVER"]["value"] == "https://glasu-service.glasu.svc:8443"
        assert env["GLASU_SESSION"]["valueFrom"]["configMapKeyRef"]["name"] == "glasu-session"
        assert env["GLASU_DEVICE"]["value"] == "cuda"
        assert job["spec"]["backoffLimit"] == 3 and spec["restartPolicy"] == "Never"
        resources = container["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == 1
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m_["mountPath"]: m_ for m_ in container["volumeMounts"]}
        org = mounts["/etc/glasu/org"]
        assert org["readOnly"] and volumes[org["name"]]["secret"]["secretName"] == f"glasu-org-{m}"
        assert env["GLASU_TOKEN_FILE"]["value"] == "/etc/glasu/org/token"
        assert env["GLASU_SECRET_CONTEXT"]["value"] == "/etc/glasu/org/secret.context"
        partition = mounts[env["GLASU_DATA"]["value"]]
        # writable: the worker's privacy ledger lives beside its partition, on a claim that
        # outlives the Job
        assert not partition.get("readOnly") and partition["subPath"] == f"client-{m}"
        claim = volumes[partition["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim == f"glasu-worker-{m}-data"
        assert mounts["/etc/glasu/ca"]["readOnly"]
        assert env["GLASU_CA_FILE"]["value"].startswith("/etc/glasu/ca/")
        assert container["args"] == ["--threads", "1"]
    assert clients == {0, 1, 2}
    generated = {
        g["name"]: g for k in kustomizations().values() for g in k.get("secretGenerator", [])
    }
    for m in clients:
        files = dict(f.split("=", 1) for f in generated[f"glasu-org-{m}"]["files"])
        assert files == {
            "secret.context": "secrets/secret.context",
            "token": f"secrets/client-{m}.token",
        }


@pytest.mark.parametrize("which", ["service", "worker"])
def test_pods_run_restricted(which: str) -> None:
    """Non-root, no privilege escalation, read-only root, no capabilities, no API token: what
    the `restricted` Pod Security level on the namespace enforces."""
    assert (
        _one("Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        == "restricted"
    )
    for _, workload, spec in pod_specs():
        if (workload["kind"] == "Job") != (which == "worker"):
            continue
        assert spec["automountServiceAccountToken"] is False
        pod_security = spec["securityContext"]
        assert pod_security["runAsNonRoot"] and pod_security["runAsUser"] != 0
        assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
        for container in spec.get("initContainers", []) + spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["readOnlyRootFilesystem"] is True
            assert security["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_key_material_fits_in_a_secret(tmp_path: Path) -> None:
    """The contexts travel as Kubernetes Secrets (1 MiB at most)."""
    from secure.ckks import generate_keys

    generate_keys(tmp_path)
    for name in ("secret.context", "public.context"):
        assert (tmp_path / name).stat().st_size < SECRET_LIMIT_BYTES * 3 // 4  # base64 room


DATABASE_LABELS = {"app.kubernetes.io/name": "glasu", "app.kubernetes.io/component": "database"}


@pytest.fixture(scope="module")
def scaled_out(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """deploy/k8s/service-postgresql rendered by `kubectl kustomize` (the base and the patch)."""
    return render_kustomization("service-postgresql", tmp_path_factory.mktemp("kustomize"))


def _rendered(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_the_scaled_out_service_renders_to_valid_objects(scaled_out: list[dict[str, Any]]):
    version = kubernetes_validate.latest_version()
    for doc in scaled_out:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    assert all(d["metadata"].get("namespace", "glasu") == "glasu" for d in scaled_out)
    # SQLite's claim is gone; PostgreSQL's data is the StatefulSet's own claim
    assert not [d for d in scaled_out if d["kind"] == "PersistentVolumeClaim"]


def test_the_service_runs_several_replicas_on_postgresql(scaled_out: list[dict[str, Any]]):
    spec = _rendered(scaled_out, "Deployment", "glasu-service")["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    database = env["GLASU_DATABASE"]
    assert "value" not in database  # from the Secret only
    assert database["valueFrom"]["secretKeyRef"] == {"name": "glasu-database", "key": "url"}
    _rendered(scaled_out, "Secret", "glasu-database")
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert "/var/lib/glasu" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # the rest of the base stays: TLS, the admin token, the public context
    assert {"GLASU_TLS_CERTFILE", "GLASU_ADMIN_TOKEN_FILE", "GLASU_PUBLIC_CONTEXT"} <= set(env)


def test_postgresql_runs_as_a_statefulset_reachable_from_the_service_only(
    scaled_out: list[dict[str, Any]],
) -> None:
    statefulset = _rendered(scaled_out, "StatefulSet", "glasu-postgres")["spec"]
    assert statefulset["replicas"] == 1 and statefulset["serviceName"] == "glasu-postgres"
    pod = statefulset["template"]
    assert pod["metadata"]["labels"] == DATABASE_LABELS == statefulset["selector"]["matchLabels"]
    (container,) = pod["spec"]["containers"]
    assert container["image"].startswith("postgres:")
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    password = env["POSTGRES_PASSWORD_FILE"]
    mount = mounts[str(Path(password).parent)]
    assert mount["readOnly"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "glasu-postgres"
    (claim,) = statefulset["volumeClaimTemplates"]
    assert env["PGDATA"].startswith(mounts["/var/lib/postgresql/data"]["mountPath"] + "/")
    assert mounts["/var/lib/postgresql/data"]["name"] == claim["metadata"]["name"]
    service = _rendered(scaled_out, "Service", "glasu-postgres")["spec"]
    assert service["selector"] == DATABASE_LABELS and service["ports"][0]["port"] == 5432
    policy = _rendered(scaled_out, "NetworkPolicy", "glasu-postgres-ingress")["spec"]
    assert policy["podSelector"]["matchLabels"] == DATABASE_LABELS
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": SERVICE_LABELS}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 5432}]
