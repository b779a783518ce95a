"""Where share and sum bodies live: one interface, :class:`PayloadStore`, two places.

- SQLite (one process): files beside the database, :class:`~.payload_files.PayloadFiles`.
- PostgreSQL (replicas): :class:`DatabasePayloads`, table ``payloads`` of the same database
  (``service/store/payload_rows.py``), which every replica reads, and which needs no shared
  volume. A body is written in its own committed transaction before the row that acknowledges
  it (as a file is), or, when the caller passes its transaction (``tx=``), in that transaction:
  either way a committed row always has its body.

Measured on the development VM (2 cores shared with other work, so medians of 10, rough;
loopback PostgreSQL 15 with fsync on), a 4 MB share: written as a file (no sync, as shares are)
6 to 11 ms, as a ``bytea`` row 72 ms (31 at best: the body goes through the WAL and TOAST); a
synced sum 13 to 28 ms vs 46; read back 0.6 ms vs 17 ms (binary results; 98 ms in text, which
hex-encodes it). The database is several times slower, but it is the only one that every
replica reads without a shared file system (NFS, a ReadWriteMany volume), that commits a body
and its row atomically, and that drops a pass's bodies in the transaction that discards them;
and the cost stays off the session's lock (a share is written before its row's transaction), a
share is read back at most once (by whichever replica forms the sum), and a sum once per replica
(then from the recent-sums cache). Hence: files on SQLite, the database on PostgreSQL.
"""

from __future__ import annotations

from typing import Protocol

from service.rounds.payload_files import PayloadFiles
from service.store import Slot, Store, Transaction
from service.store.payload_rows import SUM_CLIENT


class PayloadMissing(FileNotFoundError):
    """A share the database no longer holds (discarded), as a missing file is for files."""


class PayloadStore(Protocol):
    def write_share(
        self,
        slot: Slot,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        tx: Transaction | None = None,
    ) -> None: ...

    def read_share(
        self, slot: Slot, client: int, sha256: bytes, *, tx: Transaction | None = None
    ) -> bytes:
        """Raises ``FileNotFoundError`` if the share was discarded."""
        ...

    def write_sum(
        self, slot: Slot, body: bytes, *, sync: bool, tx: Transaction | None = None
    ) -> None:
        """``sync``: on disk before this returns (or with ``tx``'s durable commit)."""
        ...

    def read_sum(self, slot: Slot, *, tx: Transaction | None = None) -> bytes | None:
        """None once discarded."""
        ...

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        """Delete the bodies of passes < ``before_pass`` (all passes if None)."""
        ...


class DatabasePayloads:
    """Bodies as rows of the store's PostgreSQL database (see the module's docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def write_share(
        self,
        slot: Slot,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        tx: Transaction | None = None,
    ) -> None:
        self._put(tx, slot, client, sha256, body, durable=False)

    def read_share(
        self, slot: Slot, client: int, sha256: bytes, *, tx: Transaction | None = None
    ) -> bytes:
        body = self._get(tx, slot, client, sha256)
        if body is None:
            raise PayloadMissing(
                f"the share of client {client} (pass {slot.pass_index}, layer {slot.layer},"
                f" part {slot.part}) was discarded"
            )
        return body

    def write_sum(
        self, slot: Slot, body: bytes, *, sync: bool, tx: Transaction | None = None
    ) -> None:
        self._put(tx, slot, SUM_CLIENT, b"", body, durable=sync)

    def read_sum(self, slot: Slot, *, tx: Transaction | None = None) -> bytes | None:
        return self._get(tx, slot, SUM_CLIENT, b"")

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        with self.store.transaction() as tx:
            tx.delete_payloads(session_id, before_pass)

    def _put(
        self,
        tx: Transaction | None,
        slot: Slot,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        durable: bool,
    ) -> None:
        if tx is not None:
            tx.put_payload(slot, client, sha256, body)
            return
        with self.store.transaction(durable=durable) as own:
            own.put_payload(slot, client, sha256, body)

    def _get(self, tx: Transaction | None, slot: Slot, client: int, sha256: bytes) -> bytes | None:
        if tx is not None:
            return tx.payload(slot, client, sha256)
        with self.store.transaction() as own:
            return own.payload(slot, client, sha256)


def payload_store_for(store: Store) -> PayloadStore:
    """Files beside an SQLite database; the PostgreSQL database itself."""
    if store.path is not None:
        return PayloadFiles.beside(store.path)
    return DatabasePayloads(store)
