"""secure/masking/streams.py: per-slot mask streams are exactly uniform modulo t, differ across
slots and pairs, repeat for the same inputs, and every party's masks cancel in the sum."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from secure.masking.bfv import PLAIN_MODULUS
from secure.masking.secret_material import SecretBytes
from secure.masking.streams import (
    MaskSlot,
    mask_stream,
    pair_sign,
    party_mask,
    slot_seed,
)
from tests.support.masking import federation_secrets

T = PLAIN_MODULUS
SLOT = MaskSlot("session-a", pass_index=3, layer=1, part=0)


def _seed(byte: int) -> SecretBytes:
    return SecretBytes(bytes([byte]) * 16, kind="slot seed")


@pytest.mark.parametrize("parties", [3, 5])
def test_the_masks_of_all_parties_cancel_modulo_t(parties: int) -> None:
    secrets = federation_secrets(parties)
    masks = [party_mask(secrets[m], SLOT, party=m, count=5000, modulus=T) for m in range(parties)]
    assert not np.any(np.sum(masks, axis=0) % T)
    assert all(np.any(mask) for mask in masks)


def test_streams_differ_across_pass_layer_part_and_session() -> None:
    secret = federation_secrets(3)[0][1]
    slots = [
        SLOT,
        MaskSlot("session-a", 4, 1, 0),
        MaskSlot("session-a", 3, 2, 0),
        MaskSlot("session-a", 3, 1, 1),
        MaskSlot("session-b", 3, 1, 0),
    ]
    streams = [
        mask_stream(slot_seed(secret, slot, pair=(0, 1)), count=256, modulus=T) for slot in slots
    ]
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            assert np.mean(streams[i] == streams[j]) < 0.01, (slots[i], slots[j])


def test_a_seed_depends_on_the_pair_not_on_its_order() -> None:
    secret = _seed(7)
    assert slot_seed(secret, SLOT, pair=(0, 2)) == slot_seed(secret, SLOT, pair=(2, 0))
    assert slot_seed(secret, SLOT, pair=(0, 2)) != slot_seed(secret, SLOT, pair=(0, 1))
    assert pair_sign(0, 2) == 1 and pair_sign(2, 0) == -1


def test_a_stream_is_deterministic_and_its_prefix_does_not_depend_on_the_count() -> None:
    long = mask_stream(_seed(1), count=10_000, modulus=T)
    assert np.array_equal(mask_stream(_seed(1), count=10_000, modulus=T), long)
    assert np.array_equal(mask_stream(_seed(1), count=37, modulus=T), long[:37])
    assert mask_stream(_seed(1), count=0, modulus=T).size == 0


def test_streams_are_uniform_modulo_t() -> None:
    values = mask_stream(_seed(2), count=200_000, modulus=T)
    assert values.min() >= 0 and values.max() < T
    counts = np.bincount(values * 64 // T, minlength=64)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_rejection_keeps_a_small_modulus_exactly_uniform() -> None:
    # 5 needs 3 bits: without rejection 0..2 would come twice as often as 3..4
    values = mask_stream(_seed(3), count=100_000, modulus=5)
    counts = np.bincount(values, minlength=5)
    assert counts.size == 5
    assert stats.chisquare(counts).pvalue > 1e-4


def test_out_of_range_moduli_and_slots_are_refused() -> None:
    with pytest.raises(ValueError, match="modulus"):
        mask_stream(_seed(4), count=1, modulus=2**32)
    with pytest.raises(ValueError, match="session id"):
        MaskSlot("", 0, 0, 0)
    with pytest.raises(ValueError, match="counts from 0"):
        MaskSlot("s", -1, 0, 0)
