"""secure/masking/bfv.py: masked shares on the share grid in BFV batching sum exactly under the
shared key; one party's masked share decrypted alone is uniform noise, uncorrelated with it; the
parameters are what the module says."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from tenseal import sealapi

from secure.aggregation import to_grid
from secure.ckks_context import HE_STANDARD_128_CLASSICAL, MAX_ABS_SUM, share_bound
from secure.masking import bfv
from secure.masking.bfv import PLAIN_MODULUS as T
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.streams import MaskSlot, party_mask
from tests.support.masking import federation_secrets

SLOT = MaskSlot("session-bfv", pass_index=0, layer=0, part=0)


@pytest.fixture(scope="module")
def context():
    return bfv.new_bfv_context()


def _shares(parties: int, count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    bound = share_bound(clients=parties)
    return [to_grid(np.clip(rng.normal(0, 2, count), -bound, bound)) for _ in range(parties)]


def _masked(secrets, shares, slot=SLOT) -> list[np.ndarray]:
    return [
        bfv.add_mask(
            bfv.encode_share(share),
            party_mask(secrets[m], slot, party=m, count=share.size, modulus=T),
        )
        for m, share in enumerate(shares)
    ]


def test_three_masked_shares_sum_exactly_under_the_shared_key(context) -> None:
    shares = _shares(3, 5000)  # two ciphertexts, the second partly filled
    encrypted = [bfv.encrypt(context, masked) for masked in _masked(federation_secrets(3), shares)]
    summed = bfv.add_encrypted(bfv.public_bfv_context(context), encrypted)
    decoded = bfv.decode_sum(bfv.decrypt(context, summed))
    assert np.array_equal(decoded, to_grid(np.sum(shares, axis=0)))


def test_a_single_masked_share_served_as_a_sum_is_uniform_noise(context) -> None:
    # fixed keys: the test is deterministic; 2^16 values put |corr| < 0.01 at 2.6 sigma
    pairs = [MaskingKeyPair.from_private_bytes(bytes([m + 1]) * 32) for m in range(3)]
    secrets = [
        PinnedPeerKeys({j: p.public_bytes() for j, p in enumerate(pairs) if j != m}).pair_secrets(
            pairs[m], party=m
        )
        for m in range(3)
    ]
    shares = _shares(3, 2**16, seed=1)
    alone = bfv.decrypt(context, bfv.encrypt(context, _masked(secrets, shares)[1]))
    decoded = bfv.decode_sum(alone)
    assert abs(np.corrcoef(decoded, shares[1])[0, 1]) < 0.01
    assert abs(alone.mean() / T - 0.5) < 0.01
    assert stats.chisquare(np.bincount(alone * 64 // T, minlength=64)).pvalue > 1e-4
    # unmasked, the same path reads the share itself: the test would see a missing mask
    plain = bfv.decode_sum(bfv.decrypt(context, bfv.encrypt(context, bfv.encode_share(shares[1]))))
    assert np.corrcoef(plain, shares[1])[0, 1] > 0.999


def test_masks_of_different_slots_do_not_cancel(context) -> None:
    secrets = federation_secrets(3)
    shares = _shares(3, 64)
    masked = _masked(secrets, shares)
    masked[2] = _masked(secrets, shares, slot=MaskSlot("session-bfv", 0, 0, 1))[2]
    total = np.sum(masked, axis=0) % T
    assert not np.array_equal(bfv.decode_sum(total), to_grid(np.sum(shares, axis=0)))


def test_sums_decode_with_their_sign_up_to_the_range() -> None:
    largest = bfv.DECODABLE_ABS_SUM
    assert largest > MAX_ABS_SUM  # shares within share_bound(clients=M) sum within it
    values = np.array([0.0, -1.5, 2.0**-12, -(2.0**-12), largest, -largest])
    residues = np.round(values / 2.0**-12).astype(np.int64) % T
    assert np.array_equal(bfv.decode_sum(residues), values)
    with pytest.raises(ValueError, match="its sum may not decode"):
        bfv.encode_share(np.array([MAX_ABS_SUM + 1]))


def test_the_parameters_batch_and_sit_within_the_128_bit_table() -> None:
    assert all(T % d for d in range(2, math.isqrt(T) + 1))  # prime
    assert T % (2 * bfv.POLY_MODULUS_DEGREE) == 1
    assert T < 2**23  # mask streams reject few 23-bit draws
    assert sum(bfv.COEFF_MOD_BIT_SIZES) <= HE_STANDARD_128_CLASSICAL[bfv.POLY_MODULUS_DEGREE]


def test_a_sum_of_sixteen_shares_keeps_noise_budget(context) -> None:
    rng = np.random.default_rng(2)
    chunks = [bfv.encrypt(context, rng.integers(0, T, 4096)) for _ in range(16)]
    summed = bfv.add_encrypted(context, chunks)
    native = context.data
    decryptor = sealapi.Decryptor(native.seal_context(), native.secret_key())
    vector = bfv.ts.bfv_vector_from(context, summed[0])
    assert decryptor.invariant_noise_budget(vector.data.ciphertext()[0]) >= 4
