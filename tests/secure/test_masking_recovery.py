"""secure/masking/recovery.py: Shamir-shared slot seeds rebuild a dropped party's masks from a
threshold of holders, the shares travel sealed, and the release rule keeps SecAgg's known attack
(a party's masked share together with the seeds that unmask it) out."""

from __future__ import annotations

import numpy as np
import pytest

from secure.masking import bfv
from secure.masking.bfv import PLAIN_MODULUS as T
from secure.masking.recovery import (
    RecoveryRequest,
    SeedShare,
    dropout_correction,
    open_seed_share,
    recovery_threshold,
    seal_seed_share,
    seed_release_refusal,
    shares_to_release,
    split_slot_seeds,
)
from secure.masking.streams import MaskSlot, mask_of_seeds, party_mask, slot_seeds
from tests.support.masking import federation_secrets

SLOT = MaskSlot("session-r", pass_index=2, layer=0, part=1)
COUNT = 300


def _federation(parties: int):
    """Pair secrets, plain shares, masked shares and the shares every holder got."""
    secrets = federation_secrets(parties)
    rng = np.random.default_rng(parties)
    plain = [rng.integers(-5000, 5000, COUNT) % T for _ in range(parties)]
    masked = [
        (plain[m] + party_mask(secrets[m], SLOT, party=m, count=COUNT, modulus=T)) % T
        for m in range(parties)
    ]
    threshold = recovery_threshold(parties)
    held: dict[int, list[SeedShare]] = {h: [] for h in range(parties)}
    for owner in range(parties):
        seeds = slot_seeds(secrets[owner], SLOT, party=owner)
        split = split_slot_seeds(seeds, SLOT, owner=owner, parties=parties, threshold=threshold)
        for holder, shares in split.items():
            held[holder] += shares
    return secrets, plain, masked, held, threshold


def _request(parties: int, dropped: set[int]) -> RecoveryRequest:
    return RecoveryRequest(SLOT, frozenset(set(range(parties)) - dropped), frozenset(dropped))


@pytest.mark.parametrize(("parties", "answering"), [(4, {0, 1, 3}), (5, {0, 1, 2})])
def test_a_dropped_partys_masks_are_removed_from_threshold_shares(parties, answering) -> None:
    # with 5 parties, party 3's share arrived but it left before the recovery: not needed
    _, plain, masked, held, threshold = _federation(parties)
    request = _request(parties, {parties - 1} if parties == 5 else {2})
    released = []
    for holder in sorted(answering):
        assert seed_release_refusal(request, party=holder, parties=parties, told_arrived=()) is None
        released += shares_to_release(held[holder], request)
    arrived = sorted(request.arrived)
    masked_sum = np.sum([masked[m] for m in arrived], axis=0) % T
    assert np.any(masked_sum != np.sum([plain[m] for m in arrived], axis=0) % T)
    correction = dropout_correction(released, request, threshold=threshold, count=COUNT, modulus=T)
    recovered = (masked_sum + correction) % T
    assert np.array_equal(recovered, np.sum([plain[m] for m in arrived], axis=0) % T)


def test_the_correction_added_under_encryption_gives_the_plain_sum() -> None:
    _, plain, masked, held, threshold = _federation(4)
    request = _request(4, {0})
    released = [s for h in (1, 2, 3) for s in shares_to_release(held[h], request)]
    correction = dropout_correction(released, request, threshold=threshold, count=COUNT, modulus=T)
    context = bfv.new_bfv_context()
    public = bfv.public_bfv_context(context)
    parts = [bfv.encrypt(context, masked[m]) for m in (1, 2, 3)]
    parts.append(bfv.encrypt(public, correction))  # the service encrypts and adds it
    total = bfv.decrypt(context, bfv.add_encrypted(public, parts))
    assert np.array_equal(bfv.decode_sum(total), bfv.decode_sum(np.sum(plain[1:], axis=0)))


def test_fewer_than_threshold_shares_rebuild_nothing() -> None:
    _, _, _, held, threshold = _federation(5)
    request = _request(5, {4})
    released = [s for h in (0, 1) for s in shares_to_release(held[h], request)]
    assert threshold == 3
    with pytest.raises(ValueError, match="2 shares of the seed of pair"):
        dropout_correction(released, request, threshold=threshold, count=COUNT, modulus=T)


def test_only_the_dropped_partys_seeds_with_arrived_parties_are_released() -> None:
    _, _, _, held, _ = _federation(5)
    request = _request(5, {3, 4})
    released = shares_to_release(held[0], request)
    assert {(s.owner, s.peer) for s in released} == {(o, p) for o in (3, 4) for p in (0, 1, 2)}
    other_slot = RecoveryRequest(MaskSlot("session-r", 3, 0, 1), request.arrived, request.dropped)
    assert shares_to_release(held[0], other_slot) == []


def test_the_known_attack_unmasks_a_share_and_the_rule_refuses_it() -> None:
    # the service holds party 2's masked share (it arrived) and claims party 2 dropped
    secrets, plain, masked, held, threshold = _federation(4)
    lie = _request(4, {2})
    stolen = [s for h in (0, 1, 3) for s in shares_to_release(held[h], lie)]
    correction = dropout_correction(stolen, lie, threshold=threshold, count=COUNT, modulus=T)
    # what the seeds give is party 2's whole mask: its masked share minus it is its share
    assert np.array_equal((masked[2] - correction) % T, plain[2])
    # so a worker told that party 2's share arrived hands over nothing for it
    for holder in (0, 1, 3):
        reason = seed_release_refusal(lie, party=holder, parties=4, told_arrived={0, 1, 2, 3})
        assert reason is not None and "unmask" in reason
    # the seeds of another slot tell nothing about this slot's masks
    own = mask_of_seeds(slot_seeds(secrets[2], SLOT, party=2), party=2, count=COUNT, modulus=T)
    assert np.array_equal(own, correction)
    later = MaskSlot("session-r", 3, 0, 1)
    other = mask_of_seeds(slot_seeds(secrets[2], later, party=2), party=2, count=COUNT, modulus=T)
    assert np.mean(other == own) < 0.01


@pytest.mark.parametrize(
    ("arrived", "dropped", "party", "told", "reason"),
    [
        ({0, 1, 2}, {3}, 0, (), None),
        ({0, 1, 2, 3}, set(), 0, (), "no party"),
        ({0, 1, 2, 3}, {3}, 0, (), "both"),
        ({0, 1}, {3}, 0, (), "exactly the parties"),
        ({1, 2, 3}, {0}, 0, (), "leaves it out"),
        ({0, 1, 2}, {3}, 0, {3}, "unmask"),
        ({0, 1}, {2, 3}, 0, (), "at least 3"),
    ],
)
def test_the_release_rule(arrived, dropped, party, told, reason) -> None:
    request = RecoveryRequest(SLOT, frozenset(arrived), frozenset(dropped))
    refusal = seed_release_refusal(request, party=party, parties=4, told_arrived=told)
    if reason is None:
        assert refusal is None
    else:
        assert refusal is not None and reason in refusal


def test_seed_shares_open_only_for_their_holder_slot_and_pair() -> None:
    secrets, _, _, held, _ = _federation(3)
    share = held[1][0]  # party 0's seed with some peer, for party 1
    link = secrets[share.owner][share.holder]
    sealed = seal_seed_share(share, link)
    where = {"slot": SLOT, "owner": share.owner, "peer": share.peer, "holder": share.holder}
    assert open_seed_share(sealed, link, **where) == share
    assert share.share.reveal().hex() not in sealed.hex()
    wrong = [
        {**where, "holder": 2},
        {**where, "peer": 2 if share.peer == 1 else 1},
        {**where, "slot": MaskSlot("session-r", 2, 0, 2)},
    ]
    for place in wrong:
        with pytest.raises(ValueError, match="does not open"):
            open_seed_share(sealed, link, **place)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(ValueError, match="does not open"):
        open_seed_share(tampered, link, **where)
    with pytest.raises(ValueError, match="does not open"):
        open_seed_share(sealed, secrets[0][2], **where)


def test_thresholds() -> None:
    assert [recovery_threshold(m) for m in (3, 4, 5, 6, 16)] == [2, 3, 3, 4, 9]
    with pytest.raises(ValueError, match="from 3 parties"):
        recovery_threshold(2)
    with pytest.raises(ValueError, match="threshold"):
        split_slot_seeds({}, SLOT, owner=0, parties=3, threshold=3)
