"""``python -m deploy.podman_e2e``: every stage in order, the summary, the teardown."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import deploy.podman_e2e as package
from deploy.podman_e2e import (
    BASE_IMAGE,
    DEFAULT_CACHE,
    DEFAULT_DATASETS,
    INDEX_PORT,
    REPO,
    SERVICE_IMAGE,
    SKIP,
    WORKER_IMAGE,
)
from deploy.podman_e2e.base_image import ensure_base_image
from deploy.podman_e2e.commands import Failed, engine_env, say, skip_reason, timed
from deploy.podman_e2e.compose import ComposeRun
from deploy.podman_e2e.images import build, ca_bundle, image_size
from deploy.podman_e2e.kube import KubeRun
from deploy.podman_e2e.torch_index import ensure_torch_index, serve_directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.podman_e2e", description=(package.__doc__ or "").split("\n\n")[0]
    )
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
        stages: tuple[tuple[str, type[ComposeRun | KubeRun], bool], ...] = (
            ("compose", ComposeRun, args.skip_compose),
            ("kube", KubeRun, args.skip_kube),
        )
        for name, stage, skipped in stages:
            if skipped:
                continue
            runs.append(stage(work, args.datasets, args.rounds, args.eval_every))
            with timed(f"{name} run", timings):
                summary[name] = runs[-1].up(timings)
            say(f"{name}: {summary[name]}")
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
