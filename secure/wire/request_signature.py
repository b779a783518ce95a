"""A signed online scoring request as it travels (docs/data.md, "Online scoring"): what the
answering party signs when it asks (``glasu ask``), which the service keeps with the request
session it opens and shows in that session's configuration, so that every online worker can
check it at join before anything is released (``clients/request_signing.py`` makes and checks
the signature; the service never does: it has no key).

The signed statement binds the online session, the answering party, a fresh random nonce, the
asked nodes (:func:`nodes_sha256`, of the sorted distinct aligned node ids) and the time of
signing."""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import Field

from secure.wire.common import MAX_CLIENTS, StrictModel

NONCE_BYTES = 16


def nodes_sha256(nodes: np.ndarray) -> str:
    """SHA-256 (hex) of the sorted distinct node ids as 8-byte little-endian integers: the asked
    node set, whatever order or repeats it was asked in."""
    distinct = np.unique(np.asarray(nodes, dtype=np.int64))
    return hashlib.sha256(distinct.astype("<i8").tobytes()).hexdigest()


class RequestSignature(StrictModel):
    """The answering party's signature over one request of an online scoring session."""

    party: int = Field(ge=0, lt=MAX_CLIENTS, description="The signing (answering) party.")
    nonce: str = Field(
        pattern=f"^[0-9a-f]{{{2 * NONCE_BYTES}}}$",
        description="Fresh random bytes (hex) of this request: a worker takes part in a request "
        "only once per nonce.",
    )
    nodes_sha256: str = Field(
        pattern="^[0-9a-f]{64}$", description="SHA-256 of the asked nodes (sorted, distinct)."
    )
    signed_at: float = Field(ge=0, description="When it was signed (Unix time, seconds).")
    signature: str = Field(
        pattern="^[0-9a-f]{128}$", description="Ed25519 signature (hex) over the statement."
    )
