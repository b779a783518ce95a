"""The masked BFV codec and the service's BFV sum (secure/masking/codec.py): the sum of every
party's masked share decodes exactly, anything less decodes to uniform noise, and the service
refuses what does not fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secure.aggregation import SHARE_GRID, PayloadError, ShareSlot, rows_digest, to_grid
from secure.ckks_context import share_bound
from secure.masking.bfv import PLAIN_MODULUS, new_bfv_context
from secure.masking.codec import BfvSumAggregator, MaskedBfvCodec
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from tests.support.masking import masked_codecs as support_codecs

PARTIES = 3
SLOT = ShareSlot(pass_index=2, layer=1, part=0)


def fixed_key_pairs(parties: int) -> list[MaskingKeyPair]:
    """Key pairs from fixed bytes: the masks, hence every figure below, are deterministic."""
    return [MaskingKeyPair.from_private_bytes(bytes([7 + m]) * 32) for m in range(parties)]


def masked_codecs(parties: int = PARTIES, *, session: str = "s-1") -> list[MaskedBfvCodec]:
    return support_codecs(parties, session=session, pairs=fixed_key_pairs(parties))


def shares(rows: int, cols: int, parties: int = PARTIES) -> list[np.ndarray]:
    generator = np.random.default_rng(3)
    bound = share_bound(clients=parties)
    return [
        to_grid(generator.uniform(-bound, bound, size=(rows, cols))).astype(np.float32)
        for _ in range(parties)
    ]


def test_the_sum_of_every_masked_share_decodes_exactly() -> None:
    codecs, values = masked_codecs(), shares(300, 20)  # 6000 values: two ciphertexts
    aggregator = BfvSumAggregator()
    payloads = [c.encode(v, slot=SLOT) for c, v in zip(codecs, values, strict=True)]
    total = codecs[0].decode_sum(aggregator.add(payloads, rows=300, cols=20), rows=300, cols=20)
    expected = np.sum([v.astype(np.float64) for v in values], axis=0)
    np.testing.assert_array_equal(total, expected.astype(np.float32))


def test_a_single_masked_share_served_as_a_sum_is_uniform_noise() -> None:
    codecs, values = masked_codecs(), shares(256, 256)  # 65,536 values
    payload = codecs[1].encode(values[1], slot=SLOT)
    served = codecs[0].decode_sum(payload, rows=256, cols=256)
    correlation = np.corrcoef(served.ravel(), values[1].ravel())[0, 1]
    assert abs(correlation) < 0.01
    residues = np.round(served.ravel() / SHARE_GRID).astype(np.int64) % PLAIN_MODULUS
    assert abs(residues.mean() / PLAIN_MODULUS - 0.5) < 0.01


def test_a_sum_missing_one_share_is_uniform_and_the_codec_takes_only_full_sums() -> None:
    codecs, values = masked_codecs(), shares(64, 64)
    payloads = [c.encode(v, slot=SLOT) for c, v in zip(codecs, values, strict=True)]
    partial = BfvSumAggregator().add(payloads[:2], rows=64, cols=64)
    decoded = codecs[0].decode_sum(partial, rows=64, cols=64)
    honest = values[0].astype(np.float64) + values[1]
    assert abs(np.corrcoef(decoded.ravel(), honest.ravel())[0, 1]) < 0.05
    assert codecs[0].fewest_shares(PARTIES) == PARTIES


def test_every_slot_and_session_has_its_own_masks() -> None:
    codecs, values = masked_codecs(), shares(8, 8)
    other_session = masked_codecs(session="s-2")[0]
    payloads = [
        codecs[0].encode(values[0], slot=SLOT),
        codecs[0].encode(values[0], slot=ShareSlot(pass_index=2, layer=1, part=1)),
        codecs[0].encode(values[0], slot=ShareSlot(pass_index=3, layer=1, part=0)),
        codecs[0].encode(values[0], slot=dataclasses.replace(SLOT, rows=rows_digest(np.ones(8)))),
        other_session.encode(values[0], slot=SLOT),
    ]
    # each decrypted with the key of its own context: the masked residues themselves
    decoded = [codecs[0].decode_sum(payloads[0], rows=8, cols=8)] + [
        c.decode_sum(p, rows=8, cols=8)
        for c, p in zip([codecs[0]] * 3 + [other_session], payloads[1:], strict=True)
    ]
    assert len({d.tobytes() for d in decoded}) == 5


def test_a_share_that_could_wrap_or_has_no_slot_is_refused() -> None:
    codec = masked_codecs()[0]
    too_large = np.full((2, 2), share_bound(clients=PARTIES) + 1.0, dtype=np.float32)
    with pytest.raises(ValueError, match="could wrap modulo t"):
        codec.encode(too_large, slot=SLOT)
    with pytest.raises(ValueError, match="needs its slot"):
        codec.encode(np.zeros((2, 2), dtype=np.float32))


def test_masks_need_three_parties_and_every_peer_key() -> None:
    pairs = fixed_key_pairs(3)
    with pytest.raises(ValueError, match="no pinned masking key for parties \\[2\\]"):
        MaskedBfvCodec.from_keys(
            new_bfv_context(), pairs[0], PinnedPeerKeys({1: pairs[1].public_bytes()}),
            party=0, parties=3, session_id="s",
        )  # fmt: skip
    with pytest.raises(ValueError, match="from 3 parties up"):
        MaskedBfvCodec.from_keys(
            new_bfv_context(), pairs[0], PinnedPeerKeys({1: pairs[1].public_bytes()}),
            party=0, parties=2, session_id="s",
        )  # fmt: skip


def test_the_service_refuses_shares_that_do_not_fit() -> None:
    codecs, values = masked_codecs(), shares(8, 8)
    aggregator = BfvSumAggregator()
    payload = codecs[0].encode(values[0], slot=SLOT)
    with pytest.raises(PayloadError, match="chunk 0: holds 64 values, expected 32"):
        aggregator.read_share(payload, rows=4, cols=8)
    damaged = payload[:40] + bytes(len(payload) - 40)
    with pytest.raises(PayloadError):
        aggregator.read_share(damaged, rows=8, cols=8)
    stranger = masked_codecs()[1]  # another BFV key pair
    total = aggregator.new_sum(rows=8, cols=8)
    total.add(0, aggregator.read_share(payload, rows=8, cols=8))
    foreign = aggregator.read_share(stranger.encode(values[1], slot=SLOT), rows=8, cols=8)
    with pytest.raises(ValueError, match="under BFV key id"):
        total.add(1, foreign)


def test_a_masked_share_travels_seeded_and_its_sum_as_a_full_ciphertext() -> None:
    codecs, values = masked_codecs(), shares(128, 64)  # 8192 values: two ciphertexts
    payloads = [c.encode(v, slot=SLOT) for c, v in zip(codecs, values, strict=True)]
    total = BfvSumAggregator().add(payloads, rows=128, cols=64)
    per_value = [len(p) / 8192 for p in payloads]
    assert max(per_value) < 7.0  # seeded: one polynomial and a seed (public-key: about 12)
    assert 10.0 < len(total) / 8192 < 13.0  # a sum is an ordinary 2-polynomial ciphertext
