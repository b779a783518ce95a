"""Stage 2: the base image, localhost/python:3.11-bookworm, made by debootstrap from the
mirror apt uses and imported with `podman import`; kept between runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from deploy.podman_e2e import BASE_IMAGE
from deploy.podman_e2e.commands import Failed, podman, run, run_piped, say


def debian_mirror(suite: str) -> str:
    """The Debian mirror apt uses here (never written into the repository)."""
    done = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(REPO_URI) $(RELEASE)"],
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        uri, _, release = line.strip().partition(" ")
        if release == suite:
            return uri
    raise Failed(f"apt has no source for Debian {suite}: cannot run debootstrap")


def ensure_base_image(work: Path, *, rebuild: bool) -> None:
    exists = podman("image", "exists", BASE_IMAGE, check=False, quiet=True).returncode == 0
    if exists and not rebuild:
        say(f"{BASE_IMAGE}: present")
        return
    rootfs = work / "rootfs"
    mirror = debian_mirror("bookworm")
    run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv",
            "bookworm",
            str(rootfs),
            mirror,
        ],
        capture=True,
    )
    run(["chroot", str(rootfs), "apt-get", "clean"])
    for folder in ("var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        for child in (rootfs / folder).glob("*"):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    say(f"+ tar -C {rootfs} -c . | podman import --change ... - {BASE_IMAGE}")
    try:
        run_piped(
            ["tar", "-C", str(rootfs), "-c", "."],
            ["podman", "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]',
             "-", BASE_IMAGE],
        )  # fmt: skip
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
