"""The states of a session and the one function that moves a session between them (the h11
``_state.py`` habit: a table of the allowed transitions, an error on any other).

::

    running --> finished           (its last pass completed)
    running --> budget_exhausted   (the next release would exceed the privacy budget)
    any but closed --> closed      (the admin closed it)

The values are the strings stored in the database and returned by the API (``SessionStatus``
.state); :attr:`SessionState.done_reason` is the reason a client reads in a pass descriptor of
kind 'done' (``PassInfo.reason``), which spells the budget with a hyphen.
"""

from __future__ import annotations

from enum import StrEnum


class SessionState(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CLOSED = "closed"

    @property
    def done_reason(self) -> str:
        """Why a session has no pass to give (a running one has run out of passes)."""
        return _DONE_REASON[self]


_DONE_REASON = {
    SessionState.RUNNING: "finished",
    SessionState.FINISHED: "finished",
    SessionState.BUDGET_EXHAUSTED: "budget-exhausted",
    SessionState.CLOSED: "closed",
}

ALLOWED_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.RUNNING: frozenset(
        {SessionState.FINISHED, SessionState.BUDGET_EXHAUSTED, SessionState.CLOSED}
    ),
    SessionState.FINISHED: frozenset({SessionState.CLOSED}),
    SessionState.BUDGET_EXHAUSTED: frozenset({SessionState.CLOSED}),
    SessionState.CLOSED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug: the service tried to move a session along a transition the table does not have."""


def transition(current: SessionState, target: SessionState) -> SessionState:
    """``target``, if a session in state ``current`` may move there; else
    :class:`IllegalTransition`."""
    if target not in ALLOWED_TRANSITIONS[current]:
        raise IllegalTransition(f"a session cannot go from {current!r} to {target!r}")
    return target
