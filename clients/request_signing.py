"""Signed online scoring requests (docs/threat-model.md, "Scoring"): the answering party signs
each request it asks for (``glasu ask --signing-key``: its organisation's Ed25519 key of
``glasu align keygen``, PyNaCl), and an online worker whose owner pinned that party's public
key (``glasu worker --answering-party-key M=PATH``) checks the request session against the
signature at join, before anything is released. Without it a service that deviates could open
request sessions nobody asked for, each one release in every owner's ledger.

The statement covers the online session id, the answering party, a fresh 16-byte nonce, the
SHA-256 of the asked nodes (sorted, distinct) and the time of signing, under a tag of its own
(so that no alignment set's or report's signature of the same key can pass for a request).

A worker refuses a request session (:class:`RequestRefused`, told to the service at join, so
nothing is released by anyone) that is unsigned, signed by another key or for another online
session, not one scoring pass, whose nodes are not the signed ones, signed longer ago (or
further ahead) than ``max_age_seconds``, or whose nonce its owner's ledger holds for another
request session (a replay: refused across restarts, the ledger being a file). While the
request runs, every pass it is given must be that one pass over the signed nodes
(:meth:`RequestCheck.check_pass`: :class:`ProtocolViolation` otherwise)."""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal
from secure.protocol import ProtocolViolation, answering_party
from secure.psi import length_prefixed
from secure.wire.passes import PassInfo
from secure.wire.request_signature import NONCE_BYTES, RequestSignature, nodes_sha256
from secure.wire.sessions import online_session_of
from secure.wire.status import SessionStatus

SIGNATURE_TAG = b"glasu/online-request/v1/ed25519"
#: How far a request's signing time may lie from the worker's clock, by default
MAX_AGE_SECONDS = 600.0


class RequestRefused(PolicyRefusal):
    """A request session this owner's worker does not take part in: one sentence why."""


def statement(online_id: str, signed: RequestSignature) -> bytes:
    """The bytes the answering party signs for a request of online session ``online_id``."""
    return length_prefixed(
        SIGNATURE_TAG,
        online_id.encode("utf-8"),
        signed.party.to_bytes(8, "big"),
        bytes.fromhex(signed.nonce),
        bytes.fromhex(signed.nodes_sha256),
        struct.pack(">d", signed.signed_at),
    )


def sign_request(
    key: SigningKey, *, online_id: str, party: int, nodes: np.ndarray, now: float
) -> RequestSignature:
    """Party ``party``'s signature of a request for ``nodes`` (any order) in ``online_id``,
    under a fresh nonce."""
    unsigned = RequestSignature(
        party=party,
        nonce=secrets.token_hex(NONCE_BYTES),
        nodes_sha256=nodes_sha256(nodes),
        signed_at=float(now),
        signature="0" * 128,
    )
    signature = key.sign(statement(online_id, unsigned)).signature.hex()
    return unsigned.model_copy(update={"signature": signature})


@dataclass(frozen=True)
class RequestCheck:
    """What an online worker checks of each request session of ``online_id``: with ``key``
    (party ``party``'s, pinned by its owner) the signature, else nothing (its owner accepted
    unsigned requests)."""

    online_id: str
    party: int | None = None
    key: VerifyKey | None = None
    max_age_seconds: float = MAX_AGE_SECONDS
    clock: Callable[[], float] = field(default=time.time)

    def admit(
        self, status: SessionStatus, first_pass: Callable[[], PassInfo], ledger: OwnerLedger
    ) -> None:
        """:class:`RequestRefused` unless request session ``status`` is one scoring pass of this
        online session (``first_pass()``: as the service states it) over the nodes the pinned
        party signed within ``max_age_seconds``, under a nonce ``ledger`` has not seen in
        another request session (which it then keeps)."""
        session_id = status.session_id
        if online_session_of(session_id) != self.online_id:
            raise RequestRefused(
                f"{session_id} is not a request of online session {self.online_id}"
            )
        config = status.config
        if config.kind != "scoring" or config.online or status.passes_total != 1:
            raise RequestRefused(
                f"request session {session_id} is not one scoring pass ({config.kind}, "
                f"{status.passes_total} passes)"
            )
        if self.key is None:
            return
        signed = config.request_signature
        answering = answering_party(config.label_holder)
        if answering != self.party:
            raise RequestRefused(
                f"the request session's answering party is {answering}, but this owner pinned "
                f"the key of party {self.party} (--answering-party-key)"
            )
        if signed is None:
            raise RequestRefused(
                f"request {session_id} is not signed by the answering party {self.party}: "
                "nobody asked for it that this owner can tell"
            )
        self._check_signature(session_id, signed)
        info = first_pass()
        if info.kind != "eval":
            raise RequestRefused(f"request {session_id} has no pass to run ({info.reason})")
        if nodes_sha256(np.asarray(info.output_nodes, dtype=np.int64)) != signed.nodes_sha256:
            raise RequestRefused(
                f"request {session_id} scores other nodes than party {self.party} signed"
            )
        used_by = ledger.claim_request_nonce(signed.nonce, session_id)
        if used_by is not None:
            raise RequestRefused(
                f"request {session_id} replays the signed request of {used_by} (its nonce was "
                "used before)"
            )

    def _check_signature(self, session_id: str, signed: RequestSignature) -> None:
        assert self.key is not None
        if signed.party != self.party:
            raise RequestRefused(
                f"request {session_id} is signed as party {signed.party}, not as the answering "
                f"party {self.party}"
            )
        try:
            self.key.verify(statement(self.online_id, signed), bytes.fromhex(signed.signature))
        except (BadSignatureError, ValueError):
            raise RequestRefused(
                f"request {session_id}'s signature is not party {self.party}'s for this online "
                "session"
            ) from None
        age = self.clock() - signed.signed_at
        if abs(age) > self.max_age_seconds:
            when = f"{age:.0f} s ago" if age > 0 else f"{-age:.0f} s ahead of this host's clock"
            raise RequestRefused(
                f"request {session_id} was signed {when}, more than the "
                f"{self.max_age_seconds:.0f} s this owner allows (--request-max-age-seconds)"
            )

    def check_pass(self, status: SessionStatus, info: PassInfo) -> None:
        """While the request runs: :class:`ProtocolViolation` unless ``info`` is its one pass,
        over the signed nodes (nothing to check unsigned)."""
        signed = status.config.request_signature
        if self.key is None or signed is None or info.kind == "done":
            return
        if info.pass_index != 0 or nodes_sha256(np.asarray(info.output_nodes)) != (
            signed.nodes_sha256
        ):
            raise ProtocolViolation(
                f"the service gives pass {info.pass_index} of request {status.session_id} over "
                "other nodes than the signed request's one pass"
            )
