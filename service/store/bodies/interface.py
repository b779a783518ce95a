"""What every place that keeps share and sum bodies offers: :class:`Bodies`, and the name of a
body (:class:`BodyKey`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from service.store.rounds import Slot

if TYPE_CHECKING:
    from service.store import Transaction

SUM_CLIENT = -1  # the client of a slot's sum (its SHA-256 is empty)


class BodyKey(NamedTuple):
    """One body: a share (named by its client and its content's SHA-256: an identical
    re-upload replaces it by itself) or a slot's sum (:meth:`sum_of`)."""

    slot: Slot
    client: int
    sha256: bytes

    @classmethod
    def sum_of(cls, slot: Slot) -> BodyKey:
        return cls(slot, SUM_CLIENT, b"")


class BodyMissing(FileNotFoundError):
    """A share no longer kept: discarded (or, as a file, lost in a power loss)."""


class Bodies(ABC):
    """Where a round's share and sum bodies are kept (``service/store/bodies/__init__.py``
    says where and why). ``tx``: a transaction of the store to write or read in (the table's;
    files are written outside any transaction)."""

    def write_share(
        self,
        slot: Slot,
        client: int,
        sha256: bytes,
        body: bytes,
        *,
        tx: Transaction | None = None,
    ) -> None:
        """Kept before this returns (not synced to disk), or with ``tx``'s commit."""
        self._write(BodyKey(slot, client, sha256), body, durable=False, tx=tx)

    def read_share(
        self, slot: Slot, client: int, sha256: bytes, *, tx: Transaction | None = None
    ) -> bytes:
        """Raises :class:`BodyMissing` if the share is no longer kept."""
        body = self._read(BodyKey(slot, client, sha256), tx=tx)
        if body is None:
            raise BodyMissing(
                f"the share of client {client} (pass {slot.pass_index}, layer {slot.layer},"
                f" part {slot.part}) was discarded"
            )
        return body

    def write_sum(
        self, slot: Slot, body: bytes, *, sync: bool, tx: Transaction | None = None
    ) -> None:
        """``sync``: on disk before this returns (or with ``tx``'s durable commit)."""
        self._write(BodyKey.sum_of(slot), body, durable=sync, tx=tx)

    def read_sum(self, slot: Slot, *, tx: Transaction | None = None) -> bytes | None:
        """None once discarded."""
        return self._read(BodyKey.sum_of(slot), tx=tx)

    @abstractmethod
    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        """Delete the bodies of passes < ``before_pass`` (all passes if None)."""

    @abstractmethod
    def _write(self, key: BodyKey, body: bytes, *, durable: bool, tx: Transaction | None) -> None:
        """Insert or replace ``key``'s body; ``durable``: on disk before it counts as kept."""

    @abstractmethod
    def _read(self, key: BodyKey, *, tx: Transaction | None) -> bytes | None:
        """``key``'s body, None if none is kept."""
