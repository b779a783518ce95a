"""The sets' signatures (``clients/alignment_signing.py``): one is good for one body in one slot
of one alignment, from one peer; the peers' keys must fit the ring the service describes."""

from __future__ import annotations

import pytest

from clients.alignment_signing import SetSigning, SetSlot


def test_a_signature_is_good_for_one_body_in_one_slot_from_one_peer() -> None:
    party0, party1, party2 = SetSigning.generate(3)
    slot = SetSlot("align-1", 3, owner=0, hop=0)  # posted by party 0, blinded next by party 1
    signature = party0.sign(slot, b"body")
    party1.verify(slot, b"body", signature)
    moved = (
        (slot, b"other body"),
        (SetSlot("align-2", 3, 0, 0), b"body"),  # another alignment
        (SetSlot("align-1", 4, 0, 0), b"body"),  # a ring the service made up
        (SetSlot("align-1", 3, 2, 1), b"body"),  # another slot, also posted by party 0
    )
    for other, body in moved:
        with pytest.raises(ValueError, match="not party 0's"):
            party1.verify(other, body, signature)
    with pytest.raises(ValueError, match="not party 0's"):
        party1.verify(slot, b"body", party2.sign(slot, b"body"))  # signed by someone else
    with pytest.raises(ValueError, match="unsigned"):
        party1.verify(slot, b"body", None)
    with pytest.raises(ValueError, match="not party 0's"):
        party1.verify(slot, b"body", "not hex")
    SetSigning().verify(slot, b"body", None)  # no peer keys: nothing to check
    assert SetSigning().sign(slot, b"body") is None


def test_the_peer_keys_must_fit_the_ring() -> None:
    _, party1, _ = SetSigning.generate(3)
    party1.check_ring(3, 1)
    with pytest.raises(ValueError, match=r"says 2 parties .* parties \[2\]"):
        party1.check_ring(2, 1)  # the service leaves out party 2
    only_party2 = SetSigning(peer_keys={2: party1.peer_keys[2]})
    with pytest.raises(ValueError, match="no peer key for party 0"):
        only_party2.check_ring(3, 1)  # party 0 posts every set party 1 blinds
