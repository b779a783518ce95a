"""Stage 6: deploy/k8s through `podman kube play`, as far as podman runs it."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from clients.local.processes import free_port
from deploy.podman_e2e import APP_UID, CLIENTS, DEPLOY, KUBE_PLAY_KINDS, SERVICE_IMAGE, WORKER_IMAGE
from deploy.podman_e2e.checks import check_training
from deploy.podman_e2e.commands import (
    Failed,
    engine_env,
    kubectl,
    podman,
    run,
    say,
)
from deploy.podman_e2e.containers import (
    container_state,
    import_dataset,
    logs_tail,
    make_secrets,
    owned_by_app,
    volume_path,
    wait_healthy,
)


def kustomize(folder: Path, files: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` of ``folder`` with its generators' files read from ``files``
    (instead of ``folder/secrets/``), and the generated names without a hash suffix: the
    manifests podman plays refer to the Secrets by name."""
    import yaml

    command = kubectl()
    if command is None:
        raise Failed(
            "kubectl is not installed (pip install -e '.[dev]' or apt-get install kubectl)"
        )
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    kustomization["generatorOptions"] = {"disableNameSuffixHash": True}
    with tempfile.TemporaryDirectory(prefix="glasu-kustomize-") as tmp:
        copy = Path(tmp) / folder.name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("secrets"))
        (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        for key in ("secretGenerator", "configMapGenerator"):
            for generator in kustomization.get(key, []):
                for entry in generator["files"]:
                    source = Path(entry.partition("=")[2] or entry)
                    (copy / source).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(files / source.name, copy / source)
        rendered = run([command, "kustomize", str(copy)], capture=True, quiet=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


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
        # --replace: pods of the same names left by an interrupted run are recreated, not a clash
        podman("kube", "play", "--replace", "--network", self.network, str(path), capture=True)

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
