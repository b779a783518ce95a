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

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
