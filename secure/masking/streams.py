"""Per-slot seeds and mask streams: uniform integers modulo the plaintext modulus that cancel in
the sum.

A slot is one place a masked share goes: (session, pass, layer, part). For every pair of parties
and every slot, HKDF-SHA256 derives a 16-byte slot seed from the pair secret with the slot and the
ordered pair in ``info``; HKDF derives a ChaCha20 key from the seed, whose keystream (zero nonce:
every key is used for one stream) is read as 32-bit little-endian words, cut to the bits of the
modulus and rejection-sampled, so that each mask value is exactly uniform modulo ``t``. Two
slots, or two pairs, never share a stream unless HKDF collides.

The lower-indexed party of a pair adds the pair's stream and the higher subtracts it, so the sum
of every party's mask is 0 modulo ``t``: over the slot's participants (a pass that went on
without a client is masked over the others, :mod:`secure.masking.participants`), which the slot
binds, so that two stories of who takes part never share a stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from secure.masking.keys import hkdf
from secure.masking.secret_material import SecretBytes
from secure.psi import length_prefixed

SLOT_SEED_BYTES = 16
SLOT_SEED_KIND = "slot seed"
SLOT_SEED_TAG = b"glasu/masking/v1/slot-seed"
STREAM_KEY_TAG = b"glasu/masking/v1/chacha20-key"
_WORD = np.dtype("<u4")
_ZERO_NONCE = bytes(16)  # cryptography's ChaCha20 nonce: 4-byte block counter, 12-byte nonce


@dataclass(frozen=True)
class MaskSlot:
    """Where a masked share goes: part ``part`` of layer ``layer`` in pass ``pass_index`` of
    session ``session_id``."""

    session_id: str
    pass_index: int
    layer: int
    part: int
    # SHA-256 of the node ids of the part's rows, which every party was sent alike (empty: not
    # bound): a slot asked for again with other rows gets other masks
    rows_digest: bytes = b""
    # the parties the slot's shares are masked over, ascending (empty: every party of the
    # session, not bound)
    participants: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ValueError("a mask slot needs the session id")
        negative = [n for n in (self.pass_index, self.layer, self.part) if n < 0]
        if negative:
            raise ValueError(f"pass, layer and part are counts from 0, got {negative}")
        if list(self.participants) != sorted(set(self.participants)):
            raise ValueError(f"participants must ascend without repeats: {self.participants}")

    def fields(self) -> tuple[bytes, ...]:
        numbers = (n.to_bytes(8, "big") for n in (self.pass_index, self.layer, self.part))
        rows = (self.rows_digest,) if self.rows_digest else ()
        members = (
            (b"participants", b"".join(m.to_bytes(8, "big") for m in self.participants))
            if self.participants
            else ()
        )
        return (self.session_id.encode("utf-8"), *numbers, *rows, *members)


def pair_sign(party: int, peer: int) -> int:
    """+1 if ``party`` adds the pair's stream (it is the lower index), -1 if it subtracts it."""
    if party == peer:
        raise ValueError(f"party {party} has no pair with itself")
    return 1 if party < peer else -1


def slot_seed(pair_secret: SecretBytes, slot: MaskSlot, *, pair: tuple[int, int]) -> SecretBytes:
    """The seed of the masks of the two parties ``pair`` (either order) in ``slot``."""
    low, high = sorted(pair)
    if low == high:
        raise ValueError(f"party {low} has no pair with itself")
    info = length_prefixed(
        SLOT_SEED_TAG, *slot.fields(), low.to_bytes(8, "big"), high.to_bytes(8, "big")
    )
    return SecretBytes(
        hkdf(pair_secret.reveal(), info, length=SLOT_SEED_BYTES), kind=SLOT_SEED_KIND
    )


def slot_seeds(
    pair_secrets: Mapping[int, SecretBytes], slot: MaskSlot, *, party: int
) -> dict[int, SecretBytes]:
    """``party``'s seed with every peer in ``slot``, by peer index."""
    return {
        peer: slot_seed(secret, slot, pair=(party, peer)) for peer, secret in pair_secrets.items()
    }


def mask_stream(seed: SecretBytes, *, count: int, modulus: int) -> np.ndarray:
    """``count`` integers uniform in [0, modulus) (int64) expanded from ``seed``."""
    if not 2 <= modulus < 2**32:
        raise ValueError(f"the modulus must lie in [2, 2^32), got {modulus}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    bits = (modulus - 1).bit_length()
    keep = np.uint32((1 << bits) - 1)
    key = hkdf(
        seed.reveal(), length_prefixed(STREAM_KEY_TAG, modulus.to_bytes(8, "big")), length=32
    )
    keystream = Cipher(algorithms.ChaCha20(key, _ZERO_NONCE), mode=None).encryptor()
    accepted: list[np.ndarray] = []
    have = 0
    acceptance = modulus / (1 << bits)  # at least 1/2
    while have < count:
        words = int((count - have) / acceptance * 1.02) + 16
        values = np.frombuffer(keystream.update(bytes(4 * words)), dtype=_WORD) & keep
        values = values[values < modulus]
        accepted.append(values)
        have += values.size
    if not accepted:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(accepted)[:count].astype(np.int64)


def mask_of_seeds(
    seeds: Mapping[int, SecretBytes], *, party: int, count: int, modulus: int
) -> np.ndarray:
    """``party``'s mask from its slot seeds with its peers (by peer index): the sum of each
    pair's stream with the pair's sign, modulo ``modulus`` (int64 in [0, modulus))."""
    mask = np.zeros(count, dtype=np.int64)
    for peer, seed in sorted(seeds.items()):
        stream = mask_stream(seed, count=count, modulus=modulus)
        mask = (mask + pair_sign(party, peer) * stream) % modulus
    return mask


def party_mask(
    pair_secrets: Mapping[int, SecretBytes],
    slot: MaskSlot,
    *,
    party: int,
    count: int,
    modulus: int,
) -> np.ndarray:
    """The mask ``party`` adds to its ``count`` values in ``slot`` (int64 in [0, modulus)): its
    pairs with the slot's participants (all of ``pair_secrets`` when the slot names none)."""
    if slot.participants:
        if party not in slot.participants:
            raise ValueError(f"party {party} is not a participant of the slot {slot.participants}")
        pair_secrets = {p: s for p, s in pair_secrets.items() if p in slot.participants}
    seeds = slot_seeds(pair_secrets, slot, party=party)
    return mask_of_seeds(seeds, party=party, count=count, modulus=modulus)
