"""Share and sum bodies as files beside an SQLite database: :class:`FileBodies`.

A share is written before the transaction that acknowledges it commits, so an acknowledged share
survives a crash of the process as the row does (neither is synced to disk: the WAL under
``synchronous=NORMAL`` is not either); a sum is written before the transaction that stores its
row, and synced to disk first when that transaction is a release's (durable), so a counted
release stays servable after a power loss. Files are written under a temporary name and renamed,
so a crash never leaves a partial file under a final name.

Layout: ``<database>-payloads/<session>/<pass>/`` holds ``<slot>-c<client>-<sha256>.share``
(named by content: a concurrent upload of another body to the same slot, refused by the
transaction, cannot replace the acknowledged one) and ``<slot>.sum``, where ``<slot>`` is
``l<layer>`` for part 0 of a layer (the name of a whole layer's files before shares travelled in
parts, so a pass in flight during the upgrade keeps its files) and ``l<layer>p<part>`` for the
others. A pass's directory goes when the store discards the pass's payloads.

The files are the owner's alone (0600, like the database); so are the folders (0700), which
name the sessions and passes: made so, and made so again when the service starts over folders
an earlier version left open.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from secure.files import atomic_write, sync_folder
from service.store.bodies.interface import SUM_CLIENT, Bodies, BodyKey
from service.store.rounds import Slot

if TYPE_CHECKING:
    from service.store import Transaction


_NAME = re.compile(
    r"l(?P<layer>\d+)(?:p(?P<part>\d+))?(?:-c(?P<client>\d+)-(?P<sha256>[0-9a-f]+))?"
)


@dataclass(frozen=True, slots=True)
class StoredBody:
    """A body kept in a file."""

    key: BodyKey
    path: Path


#: The folders' mode: the service's user alone lists and enters them.
FOLDER_MODE = 0o700


class FileBodies(Bodies):
    def __init__(self, root: Path) -> None:
        self.root = root
        self._make_private()

    def _make_private(self) -> None:
        """The root made (0700), and it and the session and pass folders already below it made
        0700 if they are not (a folder made by an earlier version, or by hand)."""
        self.root.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
        folders = [self.root]
        for session_dir in self.root.iterdir():
            if session_dir.is_dir() and not session_dir.is_symlink():
                folders.append(session_dir)
                folders += [p for p in session_dir.iterdir() if p.is_dir() and not p.is_symlink()]
        for folder in folders:
            if folder.stat().st_mode & 0o777 != FOLDER_MODE:
                folder.chmod(FOLDER_MODE)

    @classmethod
    def beside(cls, database: Path) -> FileBodies:
        """The directory next to ``database``, named like SQLite's own ``-wal`` and ``-shm``."""
        return cls(database.with_name(f"{database.name}-payloads"))

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        """Delete the files of passes < ``before_pass`` (all passes if None)."""
        session_dir = self.root / session_id
        if before_pass is None:
            shutil.rmtree(session_dir, ignore_errors=True)
            return
        if not session_dir.is_dir():
            return
        for pass_dir in session_dir.iterdir():
            if pass_dir.name.isdigit() and int(pass_dir.name) < before_pass:
                shutil.rmtree(pass_dir, ignore_errors=True)

    def stored(self) -> Iterator[StoredBody]:
        """Every body kept."""
        for path in sorted(self.root.glob("*/*/l*")):
            name = _NAME.fullmatch(path.stem)
            if name is None or path.suffix not in (".sum", ".share"):
                continue
            slot = Slot(
                session_id=path.parent.parent.name,
                pass_index=int(path.parent.name),
                layer=int(name["layer"]),
                part=int(name["part"] or 0),
            )
            client, sha256 = name["client"], name["sha256"]
            if client is None or sha256 is None:
                yield StoredBody(BodyKey.sum_of(slot), path)
            else:
                yield StoredBody(BodyKey(slot, int(client), bytes.fromhex(sha256)), path)

    # files are written outside any transaction: ``tx`` is the interface's

    def _write(self, key: BodyKey, body: bytes, *, durable: bool, tx: Transaction | None) -> None:
        """``durable``: on disk (file and directory entries) before this returns."""
        path = self._path(key)
        path.parent.parent.mkdir(mode=FOLDER_MODE, exist_ok=True)  # the session's, the pass's
        path.parent.mkdir(mode=FOLDER_MODE, exist_ok=True)
        atomic_write(path, body, durable=durable)
        if durable:  # the entries of the folders made for it (the pass's and the session's)
            for directory in (path.parent.parent, path.parent.parent.parent):
                sync_folder(directory)

    def _read(self, key: BodyKey, *, tx: Transaction | None) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def _path(self, key: BodyKey) -> Path:
        slot = key.slot
        name = f"l{slot.layer}" if slot.part == 0 else f"l{slot.layer}p{slot.part}"
        if key.client != SUM_CLIENT:
            name += f"-c{key.client}-{key.sha256.hex()}.share"
        else:
            name += ".sum"
        return self.root / slot.session_id / str(slot.pass_index) / name
