"""Embedding bodies (shares and sums) as files beside the database, out of SQLite: the
:class:`~.payload_store.PayloadStore` of an SQLite store (PostgreSQL keeps them in a table).

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
from service.store import Slot

if TYPE_CHECKING:
    from service.store import Transaction


_NAME = re.compile(
    r"l(?P<layer>\d+)(?:p(?P<part>\d+))?(?:-c(?P<client>\d+)-(?P<sha256>[0-9a-f]+))?"
)


@dataclass(frozen=True, slots=True)
class StoredBody:
    """A body kept in a file: a share (``client`` and ``sha256``) or a sum (both None)."""

    slot: Slot
    client: int | None
    sha256: bytes | None
    path: Path


#: The folders' mode: the service's user alone lists and enters them.
FOLDER_MODE = 0o700


class PayloadFiles:
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
    def beside(cls, database: Path) -> PayloadFiles:
        """The directory next to ``database``, named like SQLite's own ``-wal`` and ``-shm``."""
        return cls(database.with_name(f"{database.name}-payloads"))

    # ``tx``: the PayloadStore interface's; files are written outside any transaction

    def write_share(
        self,
        slot: Slot,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        tx: Transaction | None = None,
    ) -> None:
        _write(self._share_path(slot, client, sha256), body, sync=False)

    def read_share(
        self, slot: Slot, client: int, sha256: bytes, *, tx: Transaction | None = None
    ) -> bytes:
        """Raises ``FileNotFoundError`` if the share was discarded (or lost in a power loss)."""
        return self._share_path(slot, client, sha256).read_bytes()

    def write_sum(
        self, slot: Slot, body: bytes, *, sync: bool, tx: Transaction | None = None
    ) -> None:
        """``sync``: on disk (file and directory entry) before this returns."""
        _write(self._sum_path(slot), body, sync=sync)

    def read_sum(self, slot: Slot, *, tx: Transaction | None = None) -> bytes | None:
        """None once discarded."""
        try:
            return self._sum_path(slot).read_bytes()
        except FileNotFoundError:
            return None

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
            client, sha256 = name["client"], name["sha256"]
            slot = Slot(
                session_id=path.parent.parent.name,
                pass_index=int(path.parent.name),
                layer=int(name["layer"]),
                part=int(name["part"] or 0),
            )
            yield StoredBody(
                slot=slot,
                client=None if client is None else int(client),
                sha256=None if sha256 is None else bytes.fromhex(sha256),
                path=path,
            )

    def _share_path(self, slot: Slot, client: int, sha256: bytes) -> Path:
        return self._pass_dir(slot) / f"{_slot_name(slot)}-c{client}-{sha256.hex()}.share"

    def _sum_path(self, slot: Slot) -> Path:
        return self._pass_dir(slot) / f"{_slot_name(slot)}.sum"

    def _pass_dir(self, slot: Slot) -> Path:
        return self.root / slot.session_id / str(slot.pass_index)


def _slot_name(slot: Slot) -> str:
    return f"l{slot.layer}" if slot.part == 0 else f"l{slot.layer}p{slot.part}"


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    path.parent.parent.mkdir(mode=FOLDER_MODE, exist_ok=True)  # the session's, the pass's
    path.parent.mkdir(mode=FOLDER_MODE, exist_ok=True)
    atomic_write(path, data, durable=sync)
    if sync:  # the entries of the folders made for it (the pass's and the session's)
        for directory in (path.parent.parent, path.parent.parent.parent):
            sync_folder(directory)
