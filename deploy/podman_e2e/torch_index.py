"""Stage 3: torch (the CPU wheel pip finds here) and its dependencies as a small package
index on 127.0.0.1, the workers' build argument TORCH_INDEX; kept between runs."""

from __future__ import annotations

import contextlib
import functools
import html
import http.server
import re
import shutil
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deploy.podman_e2e import DEPLOY
from deploy.podman_e2e.commands import run, say


def torch_version() -> str:
    found = re.search(r"ARG TORCH_VERSION=(\S+)", (DEPLOY / "Dockerfile.worker").read_text())
    assert found, "Dockerfile.worker lost its TORCH_VERSION"
    return found.group(1)


def ensure_torch_index(cache: Path) -> Path:
    """A PEP 503 index of torch==TORCH_VERSION and its dependencies, made by pip from what pip
    finds here (on this machine the CPU wheel lies on disk: never the multi-GB CUDA build)."""
    version = torch_version()
    root = cache / f"torch-index-{version}"
    files = root / "files"
    if not any(files.glob(f"torch-{version}*.whl")):
        shutil.rmtree(root, ignore_errors=True)
        files.mkdir(parents=True)
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                f"torch=={version}",
                "--dest",
                str(files),
            ]
        )
    wheel = next(files.glob(f"torch-{version}*.whl"))
    if "+cpu" not in wheel.name:
        say(f"warning: {wheel.name} is not the CPU build")
    by_project: dict[str, list[Path]] = {}
    for path in sorted(files.glob("*.whl")):
        name = re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()
        by_project.setdefault(name, []).append(path)
    simple = root / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    for name, paths in by_project.items():
        (simple / name).mkdir(parents=True)
        links = "".join(
            f'<a href="../../files/{urllib.parse.quote(p.name)}">{html.escape(p.name)}</a><br>\n'
            for p in paths
        )
        (simple / name / "index.html").write_text(
            f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n"
        )
    return root


@contextlib.contextmanager
def serve_directory(root: Path, port: int) -> Iterator[str]:
    """The index on a fixed port: TORCH_INDEX is a build argument, and a changed value would
    rebuild every layer after it. Another port only when that one is taken."""
    handler = functools.partial(QuietHandler, directory=str(root))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        say(f"warning: 127.0.0.1:{port} is taken: another port, so the worker's layers rebuild")
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        say(f"torch index: {url} (python -m http.server --bind 127.0.0.1 --directory {root})")
        yield url
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
