"""Embedding bodies (shares and sums) as files beside the database, out of SQLite: the
:class:`~.payload_store.PayloadStore` of an SQLite store (PostgreSQL keeps them in a table).

A share is written before the transaction that acknowledges it commits, so an acknowledged share
survives a crash of the process as the row does (neither is synced to disk: the WAL under
``synchronous=NORMAL`` is not either); a sum is written before the transaction that stores its
row, and synced to disk first when that transaction is a release's (durable), so a counted
release stays servable after a power loss. Files are written under a temporary name and renamed,
so a crash never leaves a partial file under a final name.

Layout: ``<database>-payloads/<session>/<pass>/`` holds ``l<layer>-c<client>-<sha256>.share``
(named by content: a concurrent upload of another body to the same slot, refused by the
transaction, cannot replace the acknowledged one) and ``l<layer>.sum``. A pass's directory goes
when the store discards the pass's payloads.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from secure.files import atomic_write, sync_folder

if TYPE_CHECKING:
    from service.store import Transaction


class PayloadFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def beside(cls, database: Path) -> PayloadFiles:
        """The directory next to ``database``, named like SQLite's own ``-wal`` and ``-shm``."""
        return cls(database.with_name(f"{database.name}-payloads"))

    # ``tx``: the PayloadStore interface's; files are written outside any transaction

    def write_share(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        tx: Transaction | None = None,
    ) -> None:
        _write(self._share_path(session_id, pass_index, layer, client, sha256), body, sync=False)

    def read_share(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        client: int,
        sha256: bytes,
        *,
        tx: Transaction | None = None,
    ) -> bytes:
        """Raises ``FileNotFoundError`` if the share was discarded (or lost in a power loss)."""
        return self._share_path(session_id, pass_index, layer, client, sha256).read_bytes()

    def write_sum(
        self,
        session_id: str,
        pass_index: int,
        layer: int,
        body: bytes,
        *,
        sync: bool,
        tx: Transaction | None = None,
    ) -> None:
        """``sync``: on disk (file and directory entry) before this returns."""
        _write(self._sum_path(session_id, pass_index, layer), body, sync=sync)

    def read_sum(
        self, session_id: str, pass_index: int, layer: int, *, tx: Transaction | None = None
    ) -> bytes | None:
        """None once discarded."""
        try:
            return self._sum_path(session_id, pass_index, layer).read_bytes()
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

    def stored(self) -> Iterator[tuple[str, int, int, int | None, bytes | None, Path]]:
        """Every body kept: (session, pass, layer, client and sha256 of a share or None for a
        sum, file)."""
        for path in sorted(self.root.glob("*/*/l*")):
            session_id, pass_index = path.parent.parent.name, int(path.parent.name)
            if path.suffix == ".sum":
                yield session_id, pass_index, int(path.stem[1:]), None, None, path
            elif path.suffix == ".share":
                layer, client, sha256 = path.stem.split("-")
                yield (
                    session_id,
                    pass_index,
                    int(layer[1:]),
                    int(client[1:]),
                    bytes.fromhex(sha256),
                    path,
                )

    def _pass_dir(self, session_id: str, pass_index: int) -> Path:
        return self.root / session_id / str(pass_index)

    def _share_path(
        self, session_id: str, pass_index: int, layer: int, client: int, sha256: bytes
    ) -> Path:
        name = f"l{layer}-c{client}-{sha256.hex()}.share"
        return self._pass_dir(session_id, pass_index) / name

    def _sum_path(self, session_id: str, pass_index: int, layer: int) -> Path:
        return self._pass_dir(session_id, pass_index) / f"l{layer}.sum"


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    atomic_write(path, data, durable=sync)
    if sync:  # the entries of the folders made for it (the pass's and the session's)
        for directory in (path.parent.parent, path.parent.parent.parent):
            sync_folder(directory)
