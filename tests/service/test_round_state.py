"""The round state machine (``service/session_state.py``) on its own: no HTTP, no store, no
event loop. The session states' transition table and its strings; when a slot closes; who a
closed slot leaves out and where a rejoining client comes back; releases and the budget; where
a session goes once a pass completed; and the moves it refuses."""

from __future__ import annotations

from typing import get_args

import pytest

from secure.wire.sessions import SessionStateName
from service.session_state import (
    ALLOWED_TRANSITIONS,
    IllegalTransition,
    PassEnd,
    SessionState,
    layer_summed,
    left_out,
    participants,
    pass_end,
    pass_is_done,
    rejoin_pass,
    release_of_pass,
    slot_progress,
    sum_pending,
    transition,
)

RUNNING, FINISHED = SessionState.RUNNING, SessionState.FINISHED
BUDGET_EXHAUSTED, CLOSED = SessionState.BUDGET_EXHAUSTED, SessionState.CLOSED


def test_the_stored_and_wire_strings_stay_as_they_were() -> None:
    assert [s.value for s in SessionState] == ["running", "finished", "budget_exhausted", "closed"]
    assert list(get_args(SessionStateName)) == [s.value for s in SessionState]
    assert BUDGET_EXHAUSTED.done_reason == "budget-exhausted"
    assert RUNNING.done_reason == "finished"
    assert CLOSED.done_reason == "closed"


def test_only_the_table_s_transitions_are_allowed() -> None:
    for current in SessionState:
        for target in SessionState:
            if target in ALLOWED_TRANSITIONS[current]:
                assert transition(current, target) is target
            else:
                with pytest.raises(IllegalTransition):
                    transition(current, target)
    assert ALLOWED_TRANSITIONS[RUNNING] == {FINISHED, BUDGET_EXHAUSTED, CLOSED}
    assert ALLOWED_TRANSITIONS[FINISHED] == ALLOWED_TRANSITIONS[BUDGET_EXHAUSTED] == {CLOSED}
    with pytest.raises(IllegalTransition, match="closed"):
        transition(CLOSED, RUNNING)


def _progress(
    received: list[int],
    members: list[int],
    *,
    stragglers: str = "wait",
    first: float | None = 100.0,
    now: float = 100.0,
    clients: int = 4,
):  # type: ignore[no-untyped-def]
    return slot_progress(
        received,
        members,
        clients=clients,
        stragglers=stragglers,  # type: ignore[arg-type]
        straggler_wait_seconds=30.0,
        first_upload_at=first,
        now=now,
    )


def test_a_slot_closes_once_every_participant_uploaded() -> None:
    waiting = _progress([0, 2], [0, 1, 2, 3], now=10_000.0)
    assert (waiting.received, waiting.missing) == ([0, 2], [1, 3])
    assert not waiting.closes and waiting.closes_at is None  # "wait" never closes early
    complete = _progress([0, 1, 2, 3], [0, 1, 2, 3])
    assert complete.closes and complete.missing == []
    # only the participants count: client 3 is out of the pass
    assert _progress([0, 1, 2], [0, 1, 2]).closes


def test_under_continue_a_slot_closes_after_the_wait_with_enough_clients() -> None:
    early = _progress([0, 2], [0, 1, 2, 3], stragglers="continue", first=100.0, now=129.0)
    assert early.closes_at == 130.0 and not early.closes
    due = _progress([0, 2], [0, 1, 2, 3], stragglers="continue", first=100.0, now=130.0)
    assert due.closes and due.missing == [1, 3]
    # one upload is too few to close however long the wait
    lone = _progress([0], [0, 1, 2, 3], stragglers="continue", now=10_000.0)
    assert lone.closes_at is None and not lone.closes
    # the others are absent: one upload left never closes a slot on its own
    assert not _progress([0], [0], stragglers="continue").closes


def test_participants_drop_the_absent_and_those_a_closed_slot_lacked() -> None:
    kwargs = {"absent": {3}, "closed_slots_uploaders": [[0, 1, 3], [0, 1, 2, 3]]}
    assert participants(4, "wait", **kwargs) == [0, 1, 2, 3]  # "wait" leaves nobody out
    assert participants(4, "continue", **kwargs) == [0, 1]
    assert participants(4, "continue", absent=(), closed_slots_uploaders=()) == [0, 1, 2, 3]


def test_a_closed_slot_leaves_out_the_participants_it_lacked() -> None:
    assert left_out([0, 1, 2, 3], [0, 2]) == [1, 3]
    assert left_out([0, 1, 2], [0, 1, 2]) == []
    assert left_out([0, 2], [0, 1, 2]) == []  # client 1 was not a participant any more


def test_a_rejoining_client_comes_back_where_no_slot_closed_without_it() -> None:
    def back(*, participating: bool, absent: bool, closed: bool, state=RUNNING):  # type: ignore[no-untyped-def]
        return rejoin_pass(
            state, 5, participating=participating, absent=absent, slots_closed=closed
        )

    assert back(participating=True, absent=False, closed=True) == 5  # never left out
    assert back(participating=False, absent=True, closed=False) == 5  # nothing closed yet
    assert back(participating=False, absent=True, closed=True) == 6  # this pass went on
    assert back(participating=False, absent=False, closed=True) == 6  # left out of this pass
    for state in (FINISHED, BUDGET_EXHAUSTED, CLOSED):
        assert back(participating=False, absent=True, closed=True, state=state) is None


def test_a_sum_is_pending_once_in_the_running_pass() -> None:
    assert sum_pending(RUNNING, 3, 3, sum_stored=False)
    assert not sum_pending(RUNNING, 3, 3, sum_stored=True)
    assert not sum_pending(RUNNING, 4, 3, sum_stored=False)  # the pass is over
    for state in (FINISHED, BUDGET_EXHAUSTED, CLOSED):
        assert not sum_pending(state, 3, 3, sum_stored=False)


def test_a_layer_is_summed_once_every_part_is() -> None:
    assert layer_summed(3, 3)
    assert not layer_summed(2, 3)
    assert not layer_summed(0, 0)


def test_a_release_appends_one_ledger_row_per_pass() -> None:
    first = release_of_pass(RUNNING, 0, {}, allowed=True, now=7.0)
    assert (first.released_at, first.release_index, first.state) == (7.0, 1, RUNNING)
    # another part of the same layer: the row already there, nothing appended
    again = release_of_pass(RUNNING, 0, {0: 7.0}, allowed=False, now=9.0)
    assert (again.released_at, again.release_index, again.state) == (7.0, None, RUNNING)
    third = release_of_pass(RUNNING, 2, {0: 7.0, 1: 8.0}, allowed=True, now=9.0)
    assert (third.released_at, third.release_index) == (9.0, 3)


def test_a_release_over_the_budget_stops_the_session() -> None:
    refused = release_of_pass(RUNNING, 1, {0: 7.0}, allowed=False, now=9.0)
    assert (refused.released_at, refused.release_index, refused.state) == (
        None,
        None,
        BUDGET_EXHAUSTED,
    )
    with pytest.raises(IllegalTransition):  # a stopped session releases nothing more
        release_of_pass(CLOSED, 1, {0: 7.0}, allowed=False, now=9.0)


def test_a_completed_pass_goes_on_finishes_or_stops_at_the_budget() -> None:
    assert pass_end(RUNNING, 2, 2, passes_total=5, next_release_allowed=None) == PassEnd(3, RUNNING)
    assert pass_end(RUNNING, 2, 2, passes_total=5, next_release_allowed=True) == PassEnd(3, RUNNING)
    stopped = pass_end(RUNNING, 2, 2, passes_total=5, next_release_allowed=False)
    assert stopped == PassEnd(3, BUDGET_EXHAUSTED)
    # the last pass finishes the session, whatever the budget says
    for allowed in (None, True, False):
        finished = pass_end(RUNNING, 4, 4, passes_total=5, next_release_allowed=allowed)
        assert finished == PassEnd(5, FINISHED)


def test_only_the_running_pass_of_a_running_session_completes() -> None:
    with pytest.raises(IllegalTransition):
        pass_end(RUNNING, 3, 2, passes_total=5, next_release_allowed=None)  # an older pass
    for state in (FINISHED, BUDGET_EXHAUSTED, CLOSED):
        with pytest.raises(IllegalTransition):
            pass_end(state, 2, 2, passes_total=5, next_release_allowed=None)


def test_a_pass_is_done_past_the_schedule_or_from_where_the_session_stopped() -> None:
    assert pass_is_done(RUNNING, 2, 5, 5)
    assert not pass_is_done(RUNNING, 2, 4, 5)
    assert not pass_is_done(FINISHED, 5, 4, 5)  # a finished session still describes its passes
    for state in (BUDGET_EXHAUSTED, CLOSED):
        assert pass_is_done(state, 2, 2, 5) and pass_is_done(state, 2, 3, 5)
        assert not pass_is_done(state, 2, 1, 5)
