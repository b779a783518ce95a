"""Files written atomically: a crash at any moment leaves the old file or the new one.

The one way the project writes a file that must never be seen half-written (checkpoints, key
material, model folders, alignments, the service's payload files), and the header (kind and
format) by which a reader tells its own files from others and from older ones."""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that a crash at any moment leaves either the old file or
    the new one, never a part: a temporary file in the same folder (created with ``mode``),
    renamed over ``path``.

    ``durable`` (the default): the file is synced before the rename and the folder after it, so
    the new file also survives a power loss once this returns. Without it the write is still
    all-or-nothing for a crash of the process, at no ``fsync`` cost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if durable:
        sync_folder(path.parent)


def move_into_place(complete: Path, path: Path) -> None:
    """Rename ``complete`` (a finished file in the same folder, e.g. one written as a stream)
    over ``path`` durably: the file is synced first, the folder after."""
    with open(complete, "rb") as written:
        os.fsync(written.fileno())
    os.replace(complete, path)
    sync_folder(Path(path).parent)


def sync_folder(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename, a new file or folder) durable."""
    with suppress(OSError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class FileFormat:
    """What a file of ours says it is: a ``kind`` and a ``format`` (its version). A reader checks
    both before it trusts anything else the file holds."""

    kind: str
    version: int
    title: str  # what a message calls such a file: "glasu worker checkpoint"

    def header(self) -> dict[str, Any]:
        return {"kind": self.kind, "format": self.version}

    def problem(self, content: object, *, name: str) -> str | None:
        """Why ``content`` (read from ``name``) is not a file of this kind and format, or
        None if it is."""
        if not isinstance(content, dict) or content.get("kind") != self.kind:
            return f"{name} is not a {self.title}"
        if content.get("format") != self.version:
            found = content.get("format")
            return f"{name} has format {found}, this glasu reads format {self.version}"
        return None
