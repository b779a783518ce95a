"""secure/masking/participants.py and the codec's pass participants: a worker masks a pass over
the participants the service states only if they include it, lie within the session and number 3
at least; the masks of a pass over fewer than every party cancel in its participants' sum, which
must hold exactly them; the participant set is bound into the streams, so two stories of who
takes part never share one."""

from __future__ import annotations

import numpy as np
import pytest

from secure.aggregation import ShareSlot
from secure.masking.bfv import PLAIN_MODULUS
from secure.masking.codec import BfvSumAggregator
from secure.masking.participants import participants_refusal
from secure.masking.streams import MaskSlot, party_mask
from secure.protocol import ProtocolViolation
from tests.support.masking import federation_secrets, masked_codecs


@pytest.mark.parametrize(
    ("stated", "says"),
    [
        (None, "did not state"),
        ([1, 2, 3], "leave this client 0 out"),
        ([0, 1], "masks need 3 at least"),
        ([0, 1, 1, 2], "repeat"),
        ([0, 1, 4], "not clients of this 4"),
    ],
)
def test_a_participant_set_a_worker_must_not_mask_over_is_refused(
    stated: list[int] | None, says: str
) -> None:
    refusal = participants_refusal(stated, party=0, parties=4)
    assert refusal is not None and says in refusal
    codec = masked_codecs(4, session="s")[0]
    with pytest.raises(ProtocolViolation, match="nothing of it is sent"):
        codec.begin_pass(7, stated)


def test_a_set_of_three_with_this_party_is_taken() -> None:
    assert participants_refusal([2, 0, 3], party=0, parties=4) is None


def test_a_pass_over_three_of_four_sums_exactly_and_takes_only_their_sum() -> None:
    codecs = masked_codecs(4, session="s-drop")
    shares = {m: np.full((40, 3), 0.5 * m - 0.25, dtype=np.float32) for m in (0, 1, 3)}
    for m in shares:
        codecs[m].begin_pass(5, [0, 1, 3])
        assert codecs[m].fewest_shares(4) == codecs[m].most_shares(4) == 3
    slot = ShareSlot(pass_index=5, layer=1, part=0)
    bodies = [codecs[m].encode(share, slot=slot) for m, share in shares.items()]
    total = BfvSumAggregator().add(bodies, rows=40, cols=3)
    np.testing.assert_array_equal(
        codecs[0].decode_sum(total, rows=40, cols=3), sum(shares.values())
    )
    with pytest.raises(ProtocolViolation, match="a share of pass 6 in pass 5"):
        codecs[0].encode(shares[0], slot=ShareSlot(pass_index=6, layer=1, part=0))


def test_two_stories_of_who_takes_part_never_share_a_stream() -> None:
    secrets = federation_secrets(4)
    one, other = (MaskSlot("s", 2, 1, 0, participants=p) for p in ((0, 1, 2), (0, 1, 3)))
    # party 0's pair with party 1 exists in both stories, but its stream differs
    masks = [
        party_mask({1: secrets[0][1]}, slot, party=0, count=2000, modulus=PLAIN_MODULUS)
        for slot in (one, other)
    ]
    assert np.mean(masks[0] == masks[1]) < 0.01
    with pytest.raises(ValueError, match="not a participant"):
        party_mask(secrets[3], one, party=3, count=10, modulus=PLAIN_MODULUS)
