"""The session states' one transition table, and the strings the database and the API hold."""

from __future__ import annotations

import pytest

from service.session_state import (
    ALLOWED_TRANSITIONS,
    IllegalTransition,
    SessionState,
    transition,
)


def test_the_stored_and_wire_strings_stay_as_they_were() -> None:
    assert [s.value for s in SessionState] == ["running", "finished", "budget_exhausted", "closed"]
    assert SessionState.BUDGET_EXHAUSTED.done_reason == "budget-exhausted"
    assert SessionState.RUNNING.done_reason == "finished"


def test_only_the_table_s_transitions_are_allowed() -> None:
    for current in SessionState:
        for target in SessionState:
            if target in ALLOWED_TRANSITIONS[current]:
                assert transition(current, target) is target
            else:
                with pytest.raises(IllegalTransition):
                    transition(current, target)
    assert transition(SessionState.RUNNING, SessionState.BUDGET_EXHAUSTED)
    with pytest.raises(IllegalTransition, match="closed"):
        transition(SessionState.CLOSED, SessionState.RUNNING)
    with pytest.raises(IllegalTransition):
        transition(SessionState.FINISHED, SessionState.BUDGET_EXHAUSTED)
