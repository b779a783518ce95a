"""Stage 5: deploy/compose.yaml through podman-compose."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from clients.local.processes import free_port
from deploy.podman_e2e import CLIENTS, DEPLOY
from deploy.podman_e2e.checks import check_training
from deploy.podman_e2e.commands import Failed, engine_env, podman, podman_compose_command, run, say
from deploy.podman_e2e.containers import (
    container_state,
    https_health,
    import_dataset,
    logs_tail,
    make_secrets,
    volume_path,
    wait_healthy,
)


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
