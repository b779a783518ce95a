"""The values that cross the round engine's boundary: who is calling, and what an upload or a
download answers (a download not ready answers
:class:`service.notify.Pending`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: client ``client_index`` of session ``session_id`` (authenticated)."""

    session_id: str
    client_index: int


@dataclass(frozen=True, slots=True)
class Payload:
    """A completed download: the body and its X-Glasu-* header values."""

    body: bytes
    shape: str
    encoding: str
    count: int | None = None


@dataclass(frozen=True, slots=True)
class UploadOutcome:
    created: bool
    received: list[int]
    missing: list[int]
    # Whether the requests long-polling this session should check again: the upload completed
    # its slot, or (stragglers "continue") it may bring the slot's early close forward. Waking
    # them on every upload would cost M checks per upload, M^2 per layer.
    wakes_waiters: bool
