"""Who posted a set of the alignment: Ed25519 signatures (PyNaCl) over every set a party posts,
so that a party blinds only sets its peer posted (docs/threat-model.md, "Entity alignment").

Without them a service that deviates could hand a party the hashes of guessed ids as a set to
blind and compare the result with that party's own blinded set: which guesses it holds. A
signature covers the alignment id, the number of parties, the slot (owner, hop) and the SHA-256
of the body, so the service can neither forge a set nor move a genuine one to another slot or
alignment. The service only relays signatures (``X-Glasu-Signature``); the public keys travel
out of band, like the CKKS context. In the ring every set a party fetches is posted by the party
before it (hop h - 1 of owner m - h is posted by m - 1), so that peer's key is the one used.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from secure.psi import length_prefixed

SIGNATURE_TAG = b"glasu/alignment/v1/set-ed25519"


@dataclass(frozen=True)
class SetSlot:
    """A set's place: hop ``hop`` of the set of party ``owner`` in alignment ``alignment_id``."""

    alignment_id: str
    parties: int
    owner: int
    hop: int

    @property
    def poster(self) -> int:
        return (self.owner + self.hop) % self.parties

    def message(self, body: bytes) -> bytes:
        numbers = (n.to_bytes(8, "big") for n in (self.parties, self.owner, self.hop))
        return length_prefixed(
            SIGNATURE_TAG,
            self.alignment_id.encode("utf-8"),
            *numbers,
            hashlib.sha256(body).digest(),
        )


@dataclass(frozen=True)
class SetSigning:
    """This party's signing key (it signs every set it posts) and its peers' public keys by
    party index (given any, it blinds only sets signed by the peer that posted them)."""

    signing_key: SigningKey | None = None
    peer_keys: Mapping[int, VerifyKey] = field(default_factory=dict)

    @classmethod
    def generate(cls, parties: int) -> list[SetSigning]:
        """Fresh keys for parties that run in one process (``glasu train --party``)."""
        keys = [SigningKey.generate() for _ in range(parties)]
        return [
            cls(key, {j: peer.verify_key for j, peer in enumerate(keys) if j != m})
            for m, key in enumerate(keys)
        ]

    @property
    def verifies(self) -> bool:
        return bool(self.peer_keys)

    def check_ring(self, parties: int, party: int) -> None:
        """The peers' keys fit an alignment of ``parties`` (as the service says) in which this
        is party ``party``; raises ValueError otherwise."""
        if not self.verifies:
            return
        strangers = sorted(j for j in self.peer_keys if j == party or not 0 <= j < parties)
        if strangers:
            raise ValueError(
                f"the service says {parties} parties and this is party {party}, but peer keys "
                f"were given for parties {strangers}"
            )
        previous = (party - 1) % parties
        if previous not in self.peer_keys:
            raise ValueError(
                f"no peer key for party {previous}, which posts every set this party blinds"
            )

    def sign(self, slot: SetSlot, body: bytes) -> str | None:
        """The signature of ``body`` in ``slot``, hex (the header's value); None unsigned."""
        if self.signing_key is None:
            return None
        return self.signing_key.sign(slot.message(body)).signature.hex()

    def verify(self, slot: SetSlot, body: bytes, signature: str | None) -> None:
        """Raises ValueError unless ``signature`` (hex, as relayed) is the poster's over this
        body in this slot (nothing to check without peer keys)."""
        if not self.verifies:
            return
        poster = slot.poster
        key = self.peer_keys.get(poster)
        if key is None:
            raise ValueError(f"no peer key for party {poster}, which posted it")
        if signature is None:
            raise ValueError(f"it is unsigned, and only sets signed by party {poster} are blinded")
        try:
            key.verify(slot.message(body), bytes.fromhex(signature))
        except (BadSignatureError, ValueError):
            raise ValueError(
                f"its signature is not party {poster}'s for this alignment and slot"
            ) from None
