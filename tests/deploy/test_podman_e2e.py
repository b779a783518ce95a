"""The deployment, run: ``python -m deploy.podman_e2e`` builds the base, service and worker
images and runs a secure training (CKKS + DP) through deploy/compose.yaml and deploy/k8s with
podman.

The run is slow (minutes; the first one on a machine builds everything) and needs root and
podman: elsewhere it skips with the script's one-line reason. The other checks here are quick."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from deploykit import DEPLOY

from deploy.podman_e2e import SKIP
from deploy.podman_e2e.commands import skip_reason
from deploy.podman_e2e.kube import KubeRun, kustomize, pod_containers

REPO = DEPLOY.parent


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(2700)
def test_images_build_and_a_secure_training_runs_in_containers(tmp_path: Path) -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(f"podman e2e cannot run here: {reason}")
    summary_path = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, "-m", "deploy.podman_e2e", "--summary", str(summary_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=2600,
    )
    output = (done.stdout + done.stderr)[-8000:]
    if done.returncode == SKIP:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, output
    summary = json.loads(summary_path.read_text())
    print(json.dumps(summary, indent=2))  # timings and sizes, with `pytest -s`
    assert summary["passed"], output
    for run in ("compose", "kube"):
        checked = summary[run]
        assert 0 < checked["epsilon"] <= checked["epsilon_target"]
        assert all(acc > 1 / 7 for acc in checked["test_accuracy"].values())
    # the service image carries no torch: a fraction of the worker's size
    sizes = summary["image_mb"]
    assert sizes["glasu-service:local"] < sizes["glasu-worker:cpu"] / 2


def test_the_script_says_why_it_cannot_run() -> None:
    """The skip reason is one line, or None where podman runs containers."""
    reason = skip_reason()
    assert reason is None or (reason and "\n" not in reason)


def test_kustomize_renders_the_generators_from_the_given_files(tmp_path: Path) -> None:
    """`kubectl kustomize` through the script: namespace, labels, generated Secrets and
    ConfigMaps from the files given (not deploy/k8s/*/secrets/), image names."""
    for name in ("admin.token", "public.context", "tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(f"{name}\n".encode())
    docs = kustomize(DEPLOY / "k8s" / "service", tmp_path)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "Deployment", "Secret", "PersistentVolumeClaim", "Service"} <= kinds
    (namespace,) = [d for d in docs if d["kind"] == "Namespace"]  # cluster-scoped
    assert namespace["metadata"]["name"] == "glasu"
    assert all(d["metadata"]["namespace"] == "glasu" for d in docs if d is not namespace)
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "glasu" for d in docs)
    tls = next(d for d in docs if d["metadata"]["name"] == "glasu-service-tls")
    assert tls["type"] == "kubernetes.io/tls" and set(tls["data"]) == {"tls.crt", "tls.key"}
    assert base64.b64decode(tls["data"]["tls.key"]) == b"tls.key\n"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "glasu-service:0.1.0"


def test_kube_publishes_the_service_on_a_free_host_port(tmp_path: Path) -> None:
    """podman 4.x publishes a containerPort on the same host port: a taken 8443 must not fail
    the kube run."""
    for name in ("admin.token", "public.context", "tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(f"{name}\n".encode())
    kube = KubeRun(tmp_path / "work", tmp_path, rounds=2, eval_every=1)
    docs = kube.adapt(kustomize(DEPLOY / "k8s" / "service", tmp_path))
    ports = [
        port
        for doc in docs
        for container in pod_containers(doc)
        for port in container.get("ports", [])
    ]
    assert ports and all(port["containerPort"] == 8443 for port in ports)
    assert all(port.get("hostPort") not in (None, 8443) for port in ports), ports
    assert set(kube.host_ports.values()) == {port["hostPort"] for port in ports}
