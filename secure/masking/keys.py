"""Organisations' X25519 key pairs for the pairwise masks, and the peers' pinned public keys.

Stored as the alignment's Ed25519 keys are (``glasu align keygen``, clients/cli/keyfiles.py):
the 32-byte private key in hex in a file of mode 0600, the 32-byte public key in hex beside it;
each organisation hands its public key to the others out of band, and each pins them by party
index (as ``--peer-key M=PATH``). The service never holds a masking key: it only relays.

Two parties' X25519 agreement is put through HKDF-SHA256 with both public keys and party indices
in ``info`` (as libsodium's ``crypto_kx`` hashes the two public keys in), so the pair secret is
bound to who agreed it; every seed of the pair derives from it (:mod:`secure.masking.streams`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secure.masking.secret_material import SecretBytes
from secure.psi import length_prefixed

PRIVATE_KEY_FILE = "masking.key"  # the X25519 private key, hex, mode 0600
PUBLIC_KEY_FILE = "masking.pub"  # its public key, hex: given to the other organisations
KEY_BYTES = 32
PAIR_SECRET_BYTES = 32
PAIR_SECRET_TAG = b"glasu/masking/v1/pair-secret"
PAIR_SECRET_KIND = "pair secret"

_RAW = serialization.Encoding.Raw


@dataclass(frozen=True, repr=False)
class MaskingKeyPair:
    """One organisation's X25519 key pair; its repr shows the public key's fingerprint only."""

    _private: X25519PrivateKey

    @classmethod
    def generate(cls) -> MaskingKeyPair:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes | SecretBytes) -> MaskingKeyPair:
        """The pair of a key file's 32 bytes; ValueError for any other length."""
        data = raw.reveal() if isinstance(raw, SecretBytes) else bytes(raw)
        if len(data) != KEY_BYTES:
            raise ValueError(f"an X25519 private key is {KEY_BYTES} bytes, not {len(data)}")
        return cls(X25519PrivateKey.from_private_bytes(data))

    def private_bytes(self) -> SecretBytes:
        """The private key's 32 bytes, for its key file."""
        raw = self._private.private_bytes(
            _RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        return SecretBytes(raw, kind="X25519 private key")

    def public_bytes(self) -> bytes:
        return self._private.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)

    def __repr__(self) -> str:
        return f"MaskingKeyPair(public={fingerprint(self.public_bytes())})"

    def pair_secret(self, *, party: int, peer: int, peer_public: bytes) -> SecretBytes:
        """The secret this party (index ``party``) shares with ``peer``, whose pinned public key
        is ``peer_public``: both ends compute the same bytes."""
        if party == peer:
            raise ValueError(f"party {party} has no pair secret with itself")
        if len(peer_public) != KEY_BYTES:
            raise ValueError(f"an X25519 public key is {KEY_BYTES} bytes, not {len(peer_public)}")
        # raises ValueError for a low-order peer key (an all-zero shared secret)
        shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        publics = {party: self.public_bytes(), peer: bytes(peer_public)}
        low, high = sorted(publics)
        info = length_prefixed(
            PAIR_SECRET_TAG,
            low.to_bytes(8, "big"),
            high.to_bytes(8, "big"),
            publics[low],
            publics[high],
        )
        return SecretBytes(hkdf(shared, info, length=PAIR_SECRET_BYTES), kind=PAIR_SECRET_KIND)


@dataclass(frozen=True)
class PinnedPeerKeys:
    """The other parties' public masking keys by party index, received out of band."""

    keys: Mapping[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wrong = sorted(m for m, key in self.keys.items() if len(key) != KEY_BYTES)
        if wrong:
            raise ValueError(f"peer keys of parties {wrong} are not {KEY_BYTES}-byte X25519 keys")
        object.__setattr__(self, "keys", MappingProxyType(dict(self.keys)))

    def check_parties(self, parties: int, party: int) -> None:
        """One key for every other party of ``parties``, none for this one (``party``) or
        strangers; raises ValueError otherwise (masks would not cancel)."""
        strangers = sorted(m for m in self.keys if m == party or not 0 <= m < parties)
        if strangers:
            raise ValueError(
                f"this is party {party} of {parties}, but masking keys were pinned for parties "
                f"{strangers}"
            )
        missing = sorted(set(range(parties)) - {party} - set(self.keys))
        if missing:
            raise ValueError(f"no pinned masking key for parties {missing}")

    def pair_secrets(self, own: MaskingKeyPair, *, party: int) -> dict[int, SecretBytes]:
        """This party's pair secret with every pinned peer, by peer index."""
        return {
            peer: own.pair_secret(party=party, peer=peer, peer_public=public)
            for peer, public in sorted(self.keys.items())
        }


def hkdf(secret: bytes, info: bytes, *, length: int) -> bytes:
    """HKDF-SHA256 of ``secret`` (no salt: every input is a uniformly random key) to
    ``length`` bytes, bound to ``info``."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def fingerprint(public_key: bytes) -> str:
    """A short, printable name of a public key (the first 8 bytes of its SHA-256, hex)."""
    return hashlib.sha256(public_key).hexdigest()[:16]
