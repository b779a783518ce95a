"""A federation's pairwise-mask secrets for the masking tests (secure/masking/)."""

from __future__ import annotations

from secure.masking.bfv import new_bfv_context
from secure.masking.codec import MaskedBfvCodec
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.secret_material import SecretBytes


def federation_secrets(parties: int) -> list[dict[int, SecretBytes]]:
    """Every party's pair secrets with every other (by peer), from fresh pinned X25519 keys."""
    pairs = [MaskingKeyPair.generate() for _ in range(parties)]
    return [
        PinnedPeerKeys({j: p.public_bytes() for j, p in enumerate(pairs) if j != m}).pair_secrets(
            pairs[m], party=m
        )
        for m in range(parties)
    ]


def masked_codecs(
    parties: int, *, session: str, pairs: list[MaskingKeyPair] | None = None
) -> list[MaskedBfvCodec]:
    """Every party's masked BFV codec under one fresh BFV key (``pairs``: their X25519 pairs,
    fresh if not given), each pinning the others' public keys."""
    context = new_bfv_context()
    pairs = pairs or [MaskingKeyPair.generate() for _ in range(parties)]
    return [
        MaskedBfvCodec.from_keys(
            context,
            pairs[m],
            PinnedPeerKeys({j: p.public_bytes() for j, p in enumerate(pairs) if j != m}),
            party=m,
            parties=parties,
            session_id=session,
        )
        for m in range(parties)
    ]
