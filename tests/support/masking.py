"""A federation's pairwise-mask secrets for the masking tests (secure/masking/)."""

from __future__ import annotations

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
