"""Dropout recovery: slot seeds Shamir-shared to the other parties, and the rule that keeps
SecAgg's known attack out.

Before it uploads a masked share for a slot, a party splits each of its slot seeds (one per peer,
:func:`secure.masking.streams.slot_seeds`) with PyCryptodome's Shamir scheme over GF(2^128), a
share for every other party, any ``threshold`` of which rebuild the seed. Each share travels to
its holder sealed with ChaCha20-Poly1305 under a key of the owner's and holder's pair secret, the
slot and the seed's pair as associated data, so the service that relays it neither reads nor
moves it. If a party's masked share never arrives, the sum of the others still carries their
streams with it; from ``threshold`` holders' shares of its seeds with the survivors the dropped
party's mask over the survivors is rebuilt and added to the sum, which cancels them. Survivors
that leave after their own share arrived are covered too: their seeds are not needed.

The known attack (Bonawitz et al. 2017, section 4): a service that holds a party's masked share
and also gets the seeds that made its mask unmasks the share (with the key, which every worker
holds, so the service with one colluding worker). A worker therefore hands over seed shares only
under :func:`seed_release_refusal`: never for a party whose masked share it was told arrived in
that slot, and every slot has its own seeds, so a recovery in one slot reveals no other's.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from secure.masking.keys import hkdf
from secure.masking.secret_material import SecretBytes
from secure.masking.streams import SLOT_SEED_BYTES, SLOT_SEED_KIND, MaskSlot, mask_of_seeds
from secure.psi import length_prefixed

SEED_SHARE_KIND = "slot seed share"
TRANSPORT_KEY_TAG = b"glasu/masking/v1/seed-share-transport"
_NONCE_BYTES = 12
#: The sum of two shares tells each of their owners the other's share: masks protect from three.
MIN_SHARES_IN_SUM = 3


@dataclass(frozen=True)
class SeedShare:
    """``holder``'s Shamir share of the seed of the pair (``owner``, ``peer``) in ``slot``, as
    ``owner`` split it."""

    slot: MaskSlot
    owner: int
    peer: int
    holder: int
    share: SecretBytes

    def associated_data(self) -> bytes:
        parties = (n.to_bytes(8, "big") for n in (self.owner, self.peer, self.holder))
        return length_prefixed(TRANSPORT_KEY_TAG, *self.slot.fields(), *parties)


@dataclass(frozen=True)
class RecoveryRequest:
    """The service's claim for ``slot``: the masked shares of ``arrived`` are in the sum, those
    of ``dropped`` never came; it asks for the seed shares that rebuild the dropped ones' masks."""

    slot: MaskSlot
    arrived: frozenset[int]
    dropped: frozenset[int]


def recovery_threshold(parties: int) -> int:
    """Shares that rebuild a seed: a majority of the parties and at least 2, so that neither
    the service with one colluding worker nor a minority told a different story rebuilds one."""
    if parties < MIN_SHARES_IN_SUM:
        raise ValueError(f"masks protect from {MIN_SHARES_IN_SUM} parties up, got {parties}")
    return max(2, parties // 2 + 1)


def split_slot_seeds(
    seeds: Mapping[int, SecretBytes],
    slot: MaskSlot,
    *,
    owner: int,
    parties: int,
    threshold: int,
) -> dict[int, list[SeedShare]]:
    """``owner``'s seeds with its peers (by peer index) in ``slot`` split for every other party:
    holder -> its shares, one per seed. Share indices are holder + 1."""
    holders = [h for h in range(parties) if h != owner]
    if not 2 <= threshold <= len(holders):
        raise ValueError(f"threshold {threshold} must lie in [2, {len(holders)}]")
    shared: dict[int, list[SeedShare]] = {h: [] for h in holders}
    for peer, seed in sorted(seeds.items()):
        for index, share in Shamir.split(threshold, parties, seed.reveal()):
            holder = index - 1
            if holder != owner:
                secret = SecretBytes(share, kind=SEED_SHARE_KIND)
                shared[holder].append(SeedShare(slot, owner, peer, holder, secret))
    return shared


def seal_seed_share(share: SeedShare, owner_holder_secret: SecretBytes) -> bytes:
    """``share`` encrypted and authenticated for its holder (nonce then ciphertext)."""
    nonce = os.urandom(_NONCE_BYTES)
    aead = ChaCha20Poly1305(_transport_key(owner_holder_secret))
    return nonce + aead.encrypt(nonce, share.share.reveal(), share.associated_data())


def open_seed_share(
    sealed: bytes,
    owner_holder_secret: SecretBytes,
    *,
    slot: MaskSlot,
    owner: int,
    peer: int,
    holder: int,
) -> SeedShare:
    """The share sealed by :func:`seal_seed_share` for this slot, pair and holder; ValueError
    if it was sealed for another or altered."""
    empty = SeedShare(slot, owner, peer, holder, SecretBytes(b"", kind=SEED_SHARE_KIND))
    aead = ChaCha20Poly1305(_transport_key(owner_holder_secret))
    nonce, ciphertext = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
    try:
        plain = aead.decrypt(nonce, ciphertext, empty.associated_data())
    except InvalidTag:
        raise ValueError(
            f"the seed share of pair ({owner}, {peer}) for party {holder} does not open: "
            "altered, or sealed for another slot, pair or holder"
        ) from None
    return SeedShare(slot, owner, peer, holder, SecretBytes(plain, kind=SEED_SHARE_KIND))


def _transport_key(pair_secret: SecretBytes) -> bytes:
    return hkdf(pair_secret.reveal(), TRANSPORT_KEY_TAG, length=32)


def seed_release_refusal(
    request: RecoveryRequest,
    *,
    party: int,
    parties: int,
    told_arrived: Collection[int],
) -> str | None:
    """Why ``party`` must not hand over its seed shares for ``request``, or None if it may.

    ``told_arrived``: every party whose masked share this worker was told, at any time, arrived
    in the request's slot (the caller keeps that record per slot). Seeds are released only for a
    party that neither the request nor any earlier word calls arrived, only to complete a sum of
    at least :data:`MIN_SHARES_IN_SUM` shares that includes this party's own."""
    arrived, dropped = request.arrived, request.dropped
    everyone = set(range(parties))
    if not dropped:
        return "no party is said to have dropped"
    if arrived & dropped:
        return f"parties {sorted(arrived & dropped)} are said both to have arrived and dropped"
    if arrived | dropped != everyone:
        return f"the claim does not account for exactly the parties {sorted(everyone)}"
    if party not in arrived:
        return f"this party {party} uploaded its share, but the claim leaves it out of the sum"
    unmaskable = sorted(dropped & set(told_arrived))
    if unmaskable:
        return (
            f"parties {unmaskable} were said to have arrived in this slot: their seeds with "
            "their masked shares would unmask them"
        )
    if len(arrived) < MIN_SHARES_IN_SUM:
        return (
            f"a sum of {len(arrived)} shares tells each owner the other's: at least "
            f"{MIN_SHARES_IN_SUM} are needed"
        )
    return None


def shares_to_release(held: Iterable[SeedShare], request: RecoveryRequest) -> list[SeedShare]:
    """Of the shares a worker holds, those the request needs: the dropped parties' seeds with
    the parties whose shares arrived (a pair of two dropped parties never entered the sum).
    Call only when :func:`seed_release_refusal` returned None."""
    return [
        share
        for share in held
        if share.slot == request.slot
        and share.owner in request.dropped
        and share.peer in request.arrived
    ]


def dropout_correction(
    shares: Iterable[SeedShare],
    request: RecoveryRequest,
    *,
    threshold: int,
    count: int,
    modulus: int,
) -> np.ndarray:
    """What to add (modulo ``modulus``) to the sum of the arrived masked shares so that the
    streams they share with the dropped parties cancel: each dropped party's mask over the
    arrived parties, its seeds rebuilt from ``threshold`` shares each. ValueError when a seed
    has fewer shares."""
    by_seed: dict[tuple[int, int], dict[int, bytes]] = {}
    for share in shares:
        if share.slot == request.slot:
            by_seed.setdefault((share.owner, share.peer), {})[share.holder] = share.share.reveal()
    correction = np.zeros(count, dtype=np.int64)
    for owner in sorted(request.dropped):
        seeds = {}
        for peer in sorted(request.arrived):
            held = by_seed.get((owner, peer), {})
            if len(held) < threshold:
                raise ValueError(
                    f"{len(held)} shares of the seed of pair ({owner}, {peer}), {threshold} needed"
                )
            chosen = [(holder + 1, held[holder]) for holder in sorted(held)[:threshold]]
            seeds[peer] = SecretBytes(Shamir.combine(chosen), kind=SLOT_SEED_KIND)
            if len(seeds[peer]) != SLOT_SEED_BYTES:
                raise ValueError(f"the seed of pair ({owner}, {peer}) rebuilt to a wrong length")
        mask = mask_of_seeds(seeds, party=owner, count=count, modulus=modulus)
        correction = (correction + mask) % modulus
    return correction
