"""The ring of the private set intersection, one party's turns (docs/protocol.md,
"Alignment"): it posts its own blinded set at hop 0, then blinds each set the ring relays to it,
after checking it (signed by the peer that posted it when given peer keys, the size its owner
declared, distinct canonical elements): a service that deviates could otherwise hand it guessed
ids to blind. A fresh alignment (``clients/alignment.py``) and an update
(``clients/alignment_update.py``) run the same ring, over whole sets or over deltas."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from clients.alignment_signing import SetSigning, SetSlot
from secure.psi import BlindingKey, check_elements, pack, unpack
from secure.wire.alignment import AlignmentStatus, SetProgress

if TYPE_CHECKING:
    from clients.alignment import AlignmentClient


class AlignmentFailed(RuntimeError):
    """The alignment finished without a usable shared node index."""


def checked_signing(signing: SetSigning | None, parties: int, party: int) -> SetSigning:
    signing = signing or SetSigning()
    try:
        signing.check_ring(parties, party)
    except ValueError as exc:
        raise AlignmentFailed(str(exc)) from None
    return signing


def run_ring(
    client: AlignmentClient,
    signing: SetSigning,
    key: BlindingKey,
    own: list[bytes],
    parties: int,
    workers: int,
    done: Callable[[int], object],
) -> int:
    """Post this party's set (``own``: its blinded elements in the order posted) at hop 0,
    then blind what the ring relays at hops 1..M-1, each set checked first (signed by its
    poster given peer keys, the size declared, distinct canonical elements); the
    exponentiations it took."""
    m = client.party

    def post(owner: int, hop: int, elements: list[bytes]) -> None:
        body = pack(elements)
        slot = SetSlot(client.alignment_id, parties, owner, hop)
        client.post_set(owner, hop, body, signature=signing.sign(slot, body))

    post(m, 0, own)
    blinded = 0
    for hop in range(1, parties):
        slot = SetSlot(client.alignment_id, parties, (m - hop) % parties, hop - 1)
        received = relayed(client, signing, slot)
        try:
            check_elements(received)
        except ValueError as exc:
            raise not_blinding(slot, exc) from None
        fresh = key.blind_elements(received, workers=workers)
        post(slot.owner, hop, [element for chunk in fresh for element in chunk])
        blinded += len(received)
        done(len(received))
    return blinded


def relayed(client: AlignmentClient, signing: SetSigning, slot: SetSlot) -> list[bytes]:
    """The set at ``slot``, once it is sure to be worth blinding: signed by the party that
    posted it (given peer keys), as many elements as the status declares for its owner (that they
    are distinct and canonical, :func:`run_ring` checks). A service that deviates
    could otherwise have guessed ids blinded."""
    try:
        relayed = client.fetch_set(slot.owner, slot.hop)
        signing.verify(slot, relayed.body, relayed.signature)
        elements = unpack(relayed.body)
        check_declared(client.status(), slot, len(elements))
    except ValueError as exc:
        raise not_blinding(slot, exc) from None
    return elements


def not_blinding(slot: SetSlot, exc: ValueError) -> AlignmentFailed:
    return AlignmentFailed(
        f"the service relayed hop {slot.hop} of party {slot.owner}'s set to blind, and "
        f"{exc}: not blinding it"
    )


def declared_set(status: AlignmentStatus, owner: int) -> SetProgress:
    declared = {s.owner: s for s in status.sets}.get(owner)
    if declared is None:
        raise ValueError(f"the status declares no set of party {owner}")
    return declared


def check_declared(status: AlignmentStatus, slot: SetSlot, size: int) -> None:
    """What the status says of the set's owner: its hop-0 size and that hop ``slot.hop`` is in.
    Only consistency (the service writes the status), which the owner checks in turn."""
    declared = declared_set(status, slot.owner)
    if declared.size != size:
        raise ValueError(
            f"it has {size} elements where the status declares {declared.size} for party "
            f"{slot.owner}'s set"
        )
    if declared.hops <= slot.hop:
        raise ValueError(f"the status shows only {declared.hops} hops of it posted")
