"""Dropouts under masked secure aggregation at the service, without HTTP (service/session_state.py,
service/rounds/sums.py): a masked slot whose straggler wait is over without a participant voids
its pass (no sum: the masks would not cancel), the missing client is absent from the next pass,
the next pass is masked over the others, which the service states, and a pass left with fewer
than 3 participants waits for a rejoin rather than sum two. The clock is a ManualClock."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import session_request

from secure.aggregation import ShareSlot
from secure.masking.codec import MaskedBfvCodec
from secure.wire.sessions import SessionCreate
from service.app import service_context
from service.clock import ManualClock
from service.context import ServiceContext
from service.domain_errors import WrongPass
from service.rounds import Caller, Payload
from service.session_state import (
    SessionState,
    rejoin_pass,
    slot_progress,
    stated_participants,
    voids_pass,
)
from tests.support.masking import masked_codecs

WAIT = 60.0
TOP = 3  # the sessions aggregate at their top layer only: no node sets
MASKED_CONTINUE = {
    "clients": 4,
    "encryption": "ckks",
    "secure_aggregation": "masks",
    "stragglers": "continue",
    "straggler_wait_seconds": WAIT,
    "agg_layers": [{"layer": TOP, "width": 3}],
}


LAYER_1 = [{"layer": 1, "width": 3}]  # below the top: node sets first


def progress(received: list[int], participants: list[int], *, masked: bool, waited: float):
    return slot_progress(
        received, participants, clients=4, stragglers="continue", straggler_wait_seconds=WAIT,
        first_upload_at=0.0, now=waited, masked=masked,
    )  # fmt: skip


def test_a_masked_slot_closing_without_a_participant_voids_its_pass() -> None:
    late = progress([0, 1, 2], [0, 1, 2, 3], masked=True, waited=WAIT)
    assert late.closes and late.missing == [3] and voids_pass(late, masked=True)
    early = progress([0, 1, 2], [0, 1, 2, 3], masked=True, waited=WAIT - 1)
    assert not early.closes and not voids_pass(early, masked=True)
    complete = progress([0, 1, 2, 3], [0, 1, 2, 3], masked=True, waited=0.0)
    assert complete.closes and not voids_pass(complete, masked=True)
    # without masks the same slot is summed over the three
    unmasked = progress([0, 1, 2], [0, 1, 2, 3], masked=False, waited=WAIT)
    assert unmasked.closes and not voids_pass(unmasked, masked=False)


def test_a_masked_slot_with_one_upload_is_void_after_the_wait_where_an_unmasked_one_waits() -> None:
    alone = progress([0], [0, 1, 2, 3], masked=True, waited=WAIT)
    assert voids_pass(alone, masked=True)
    assert not progress([0], [0, 1, 2, 3], masked=False, waited=WAIT).closes


def test_a_masked_pass_of_two_participants_never_forms_a_sum() -> None:
    both = progress([0, 1], [0, 1], masked=True, waited=10 * WAIT)
    assert not both.closes and both.closes_at is None
    assert progress([0, 1], [0, 1], masked=False, waited=0.0).closes  # unmasked: a sum of two


def test_the_participants_are_stated_once_fixed() -> None:
    def stated(members: list[int], *, pass_index: int = 4, stragglers: str = "continue"):
        return stated_participants(
            members, masked=True, stragglers=stragglers,  # type: ignore[arg-type]
            pass_index=pass_index, current_pass=4,
        )  # fmt: skip

    assert stated([0, 1, 2]) == [0, 1, 2]
    assert stated([0, 1, 2], pass_index=3) == [0, 1, 2]  # a pass before: as it was
    assert stated([0, 1, 2], pass_index=5) is None  # the pass before may still lose one
    assert stated([0, 1]) is None  # waits for a rejoin
    assert stated([0, 1, 2, 3], pass_index=9, stragglers="wait") == [0, 1, 2, 3]
    unmasked = stated_participants(
        [0, 1], masked=False, stragglers="continue", pass_index=4, current_pass=4
    )
    assert unmasked is None


def test_a_stated_masked_pass_takes_a_rejoining_client_only_at_the_next_pass() -> None:
    def back_at(*, stated: bool) -> int | None:
        return rejoin_pass(
            SessionState.RUNNING, 4, participating=False, absent=True, slots_closed=False,
            stated=stated,
        )  # fmt: skip

    assert back_at(stated=True) == 5
    assert back_at(stated=False) == 4  # fewer than 3: nobody masked over it yet


# The round engine, without HTTP


def masked_service(
    make_app: Callable[..., FastAPI], **overrides: object
) -> tuple[ManualClock, ServiceContext, str, list[MaskedBfvCodec]]:
    """A service on a ManualClock with one masked "continue" session (``overrides`` on
    :data:`MASKED_CONTINUE`) and its four clients' codecs."""
    clock = ManualClock()
    context = service_context(make_app(clock=clock))
    body = session_request(**{**MASKED_CONTINUE, **overrides})
    sid = context.sessions.create(SessionCreate.model_validate(body)).session_id
    return clock, context, sid, masked_codecs(4, session=sid)


def put_node_sets(context: ServiceContext, sid: str, clients: range) -> None:
    """Layer 1's node sets of pass 0 from ``clients`` (the same ten nodes)."""
    nodes = np.arange(10, dtype="<i8").tobytes()
    for m in clients:
        context.engine.uploads.put(
            "nodes", Caller(sid, m), 0, 1, shape="10", encoding="int64", body=nodes
        )


def upload(
    context: ServiceContext, codecs: list[MaskedBfvCodec], sid: str, p: int, clients: list[int]
) -> dict[int, np.ndarray]:
    """Each of ``clients`` uploads its masked share of pass ``p``'s top layer, masked over the
    participants the service states; the shares."""
    engine = context.engine
    info = engine.downloads.pass_info(sid, p)
    rows = len(info.output_nodes)
    shares = {}
    for m in clients:
        codecs[m].begin_pass(p, info.participants)
        shares[m] = np.full((rows, 3), 0.25 * (m + 1) + p, dtype=np.float32)
        body = codecs[m].encode(shares[m], slot=ShareSlot(p, TOP, 0))
        engine.uploads.put(
            "share", Caller(sid, m), p, TOP, shape=f"{rows},3", encoding="bfv-masked", body=body
        )
    return shares


@pytest.mark.anyio
async def test_a_void_masked_pass_goes_on_over_the_others_and_its_sum_is_exact(
    make_app: Callable[..., FastAPI],
) -> None:
    clock, context, sid, codecs = masked_service(make_app)
    engine = context.engine
    assert engine.downloads.pass_info(sid, 0).participants == [0, 1, 2, 3]
    assert engine.downloads.pass_info(sid, 1).participants is None  # pass 0 may lose one
    upload(context, codecs, sid, 0, [0, 1, 2])  # client 3 never uploads
    assert not isinstance(engine.downloads.get("sum", Caller(sid, 0), 0, TOP), Payload)
    clock.advance(WAIT)
    with pytest.raises(WrongPass) as voided:
        engine.downloads.get("sum", Caller(sid, 0), 0, TOP)
    assert voided.value.reason == "voided" and voided.value.current_pass == 1
    with context.store.transaction() as tx:
        assert tx.result(sid, 0, TOP, "sum") is None  # no sum of pass 0, ever
        assert sorted(tx.absent_clients(sid, 1)) == [3]
    # pass 1 is masked over the three, and their sum holds exactly them
    assert engine.downloads.pass_info(sid, 1).participants == [0, 1, 2]
    shares = upload(context, codecs, sid, 1, [0, 1, 2])
    total = engine.downloads.get("sum", Caller(sid, 1), 1, TOP)
    assert isinstance(total, Payload) and total.count == 3
    rows = shares[0].shape[0]
    np.testing.assert_array_equal(
        codecs[1].decode_sum(total.body, rows=rows, cols=3), sum(shares.values())
    )
    # client 3 comes back: pass 2 is stated already (pass 1 ended), so it joins pass 3
    assert engine.uploads.rejoin(Caller(sid, 3)) == 3
    assert engine.downloads.pass_info(sid, 2).participants == [0, 1, 2]


@pytest.mark.anyio
async def test_a_masked_pass_left_with_two_participants_waits_for_a_rejoin(
    make_app: Callable[..., FastAPI],
) -> None:
    clock, context, sid, codecs = masked_service(make_app)
    engine = context.engine
    upload(context, codecs, sid, 0, [0, 1])  # clients 2 and 3 are gone
    clock.advance(WAIT)
    with pytest.raises(WrongPass):
        engine.downloads.get("sum", Caller(sid, 0), 0, TOP)
    info = engine.downloads.pass_info(sid, 1)
    assert info.kind == "train" and info.participants is None  # two: nothing to mask over
    # client 2 rejoins; pass 1's set was never stated, so it joins it
    assert engine.uploads.rejoin(Caller(sid, 2)) == 1
    assert engine.downloads.pass_info(sid, 1).participants == [0, 1, 2]


@pytest.mark.anyio
async def test_a_void_release_is_in_the_ledger_with_the_shares_that_arrived(
    make_app: Callable[..., FastAPI],
) -> None:
    privacy = {"noise_multiplier": 1.0, "delta": 1e-5, "clip": 1.0}
    clock, context, sid, codecs = masked_service(make_app, agg_layers=LAYER_1, privacy=privacy)
    engine = context.engine
    put_node_sets(context, sid, range(4))
    for m in range(3):
        codecs[m].begin_pass(0, [0, 1, 2, 3])
        share = np.full((10, 3), 0.5, dtype=np.float32)
        engine.uploads.put(
            "share", Caller(sid, m), 0, 1, shape="10,3", encoding="bfv-masked",
            body=codecs[m].encode(share, slot=ShareSlot(0, 1, 0)),
        )  # fmt: skip
    clock.advance(WAIT)
    with pytest.raises(WrongPass):
        engine.downloads.get("sum", Caller(sid, 0), 0, 1)
    with context.store.transaction() as tx:
        ledger = tx.ledger(sid)
    assert [(e.pass_index, e.clients) for e in ledger] == [(0, [0, 1, 2])]


@pytest.mark.anyio
async def test_a_node_set_missing_after_the_wait_voids_a_masked_pass(
    make_app: Callable[..., FastAPI],
) -> None:
    clock, context, sid, _ = masked_service(make_app, agg_layers=LAYER_1)
    engine = context.engine
    put_node_sets(context, sid, range(3))  # client 3's never comes
    clock.advance(WAIT)
    with pytest.raises(WrongPass, match="went on without a sum"):
        engine.downloads.get("union", Caller(sid, 1), 0, 1)
    with context.store.transaction() as tx:
        assert tx.result(sid, 0, 1, "union") is None
    assert engine.downloads.pass_info(sid, 1).participants == [0, 1, 2]
