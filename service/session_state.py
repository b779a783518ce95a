"""The state machine of a session and of its rounds, as pure functions: every decision that
moves a session, a pass or a slot is taken here (the h11 ``_state.py`` habit), from values the
callers read from the store; the callers (``service/rounds/``) write what these decide.

A session's states, the one table of the allowed transitions and an error on any other::

    running --> finished           (its last pass completed)
    running --> budget_exhausted   (the next release would exceed the privacy budget)
    any but closed --> closed      (the admin closed it)

Within a running session: a pass's slots (one layer's part, see :class:`service.store.Slot`)
close when every participant's upload is in, or, under stragglers "continue", once the wait
after the first upload is over (:func:`slot_progress`); the clients a closed slot lacks are left
out of the rest of the pass and of the passes after it (:func:`left_out`) until they rejoin
(:func:`rejoin_pass`). A masked session's slot that closes without a participant voids its pass
instead (:func:`voids_pass`): the masks would not cancel in a sum of the others, so none is
formed, and the next pass is masked over the clients still in, which the service states to them
(:func:`stated_participants`). A sum is stored once per slot (:func:`sum_pending`); with
differential privacy the first aggregation layer's sum of a pass is its release
(:func:`release_of_pass`). Once every part of its last layer is summed the pass ends
(:func:`pass_end`).

The state values are the strings stored in the database and returned by the API (``SessionStatus``
.state, ``secure.wire.sessions.SessionStateName``); :attr:`SessionState.done_reason` is the reason
a client reads in a pass descriptor of kind 'done' (``PassInfo.reason``), which spells the budget
with a hyphen.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from secure.masking.participants import MIN_SHARES_IN_SUM
from secure.protocol import MIN_CONTRIBUTORS, StragglerPolicy


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
    """A bug: the service tried to move a session along a transition the table does not have,
    or a pass that is not the running one."""


def transition(current: SessionState, target: SessionState) -> SessionState:
    """``target``, if a session in state ``current`` may move there; else
    :class:`IllegalTransition`."""
    if target not in ALLOWED_TRANSITIONS[current]:
        raise IllegalTransition(f"a session cannot go from {current!r} to {target!r}")
    return target


def pass_is_done(
    state: SessionState, current_pass: int, pass_index: int, passes_total: int
) -> bool:
    """Whether the session has no pass ``pass_index`` to give (its descriptor is kind 'done'):
    past the schedule, or at or after the pass where it was closed or stopped at its budget."""
    stopped = state in (SessionState.CLOSED, SessionState.BUDGET_EXHAUSTED)
    return pass_index == passes_total or (stopped and pass_index >= current_pass)


# A pass's slots and its participants


def participants(
    clients: int,
    stragglers: StragglerPolicy,
    *,
    absent: Collection[int],
    closed_slots_uploaders: Iterable[Collection[int]],
) -> list[int]:
    """The clients still in a pass: every client, except under stragglers "continue", where the
    clients ``absent`` from it (left out of an earlier pass, not back yet) and those missing from
    any slot of the pass that closed (``closed_slots_uploaders``: each closed slot's uploaders)
    are out."""
    members = set(range(clients))
    if stragglers == "continue":
        members -= set(absent)
        for uploaded in closed_slots_uploaders:
            members &= set(uploaded)
    return sorted(members)


@dataclass(frozen=True, slots=True)
class SlotProgress:
    """Where the uploads of one slot stand."""

    received: list[int]  # the clients whose upload is in
    missing: list[int]  # the pass's participants whose upload is not
    # When the slot may close without the missing: under stragglers "continue",
    # straggler_wait_seconds after its first upload once enough clients arrived; else never.
    closes_at: float | None
    closes: bool  # whether its result may be formed now from the uploads received


def slot_progress(
    received: list[int],
    participants: Collection[int],
    *,
    clients: int,
    stragglers: StragglerPolicy,
    straggler_wait_seconds: float,
    first_upload_at: float | None,
    now: float,
    masked: bool = False,
) -> SlotProgress:
    """The slot's progress, given the clients whose upload is in and the pass's participants:
    it closes once every participant's upload is in, or (stragglers "continue") once the wait
    since its first upload is over and enough clients arrived. A ``masked`` session's slot
    closes after the wait whoever arrived (its pass is then void: :func:`voids_pass`), and
    never while the pass has fewer than ``MIN_SHARES_IN_SUM`` participants (a sum of two tells
    each the other's share): it waits until one rejoins."""
    have = set(received)
    missing = [m for m in sorted(participants) if m not in have]
    continues = stragglers == "continue"
    enough = 1 if masked else MIN_CONTRIBUTORS
    at = None
    if continues and len(received) >= enough and first_upload_at is not None:
        at = first_upload_at + straggler_wait_seconds
    if masked and len(participants) < MIN_SHARES_IN_SUM:
        closes, at = False, None
    elif continues and not masked and len(received) < min(MIN_CONTRIBUTORS, clients):
        closes = False  # the others are absent: wait until one rejoins
    else:
        closes = not missing or (at is not None and now >= at)
    return SlotProgress(received, missing, at, closes)


def voids_pass(progress: SlotProgress, *, masked: bool) -> bool:
    """Whether a closing slot voids its pass: masked shares without every participant's, whose
    masks would not cancel. No sum is formed; the missing are left out as by any closed slot
    (:func:`left_out`) and the pass ends (:func:`pass_end`), its other participants going on
    with the next pass, masked over the clients still in."""
    return masked and progress.closes and bool(progress.missing)


def stated_participants(
    participants: list[int],
    *,
    masked: bool,
    stragglers: StragglerPolicy,
    pass_index: int,
    current_pass: int,
) -> list[int] | None:
    """The participants of a masked pass as the service states them (``PassInfo.participants``:
    every share of the pass is masked over them), or None while they may still change: a
    pass after the current one (a pass before it may be void and leave clients out) or one with
    fewer than ``MIN_SHARES_IN_SUM`` (it waits for a rejoin, which joins it while its set is not
    stated). Under stragglers "wait" every client, always; None without masks."""
    if not masked:
        return None
    if stragglers == "wait":
        return participants
    if pass_index > current_pass or len(participants) < MIN_SHARES_IN_SUM:
        return None
    return participants


def left_out(participants: Iterable[int], contributors: Collection[int]) -> list[int]:
    """The participants a slot closed without: they are absent from the next pass on (later
    passes do not wait for them) until they rejoin."""
    return [m for m in participants if m not in contributors]


def rejoin_pass(
    state: SessionState,
    current_pass: int,
    *,
    participating: bool,
    absent: bool,
    slots_closed: bool,
    stated: bool = False,
) -> int | None:
    """The pass from which a rejoining client takes part again, or None if there is nothing to
    record (the session no longer runs). The current pass if none of its slots closed without
    the client (``participating``, or ``absent`` from a pass before with nothing of this one
    closed yet), else the next; later passes wait for it from there. A masked pass whose
    participants were ``stated`` (:func:`stated_participants`) takes no one more: its shares
    are masked over them."""
    if state != SessionState.RUNNING:
        return None
    if participating or (absent and not slots_closed and not stated):
        return current_pass
    return current_pass + 1


# Sums, releases and the end of a pass


def sum_pending(
    state: SessionState, current_pass: int, pass_index: int, *, sum_stored: bool
) -> bool:
    """Whether a slot's sum is still to be stored: the session runs this pass and has none."""
    return state == SessionState.RUNNING and current_pass == pass_index and not sum_stored


def layer_summed(summed_parts: int, parts: int) -> bool:
    """Whether a layer is summed: the sum of every one of its ``parts`` is stored."""
    return summed_parts > 0 and summed_parts == parts


@dataclass(frozen=True, slots=True)
class Release:
    """What storing the sum that releases a pass does to the privacy ledger and the session."""

    released_at: float | None  # the time of the pass's ledger row (None: nothing released)
    release_index: int | None = None  # the ledger row to append (None: none to append)
    state: SessionState = SessionState.RUNNING  # BUDGET_EXHAUSTED: the session stops


def release_of_pass(
    state: SessionState,
    pass_index: int,
    released: Mapping[int, float],
    *,
    allowed: bool,
    now: float,
) -> Release:
    """The release of pass ``pass_index``'s sum, given the ledger (``released``: the time of
    each pass's release, one row per pass) and whether one more release fits the budget
    (``allowed``): the pass's row if another part of the layer appended it already; else a new
    row, if it fits; else none, and the session stops at its budget (normally the end of the
    pass before already stopped it)."""
    if pass_index in released:
        return Release(released[pass_index], state=state)
    if not allowed:
        return Release(None, state=transition(state, SessionState.BUDGET_EXHAUSTED))
    return Release(now, release_index=len(released) + 1, state=state)


@dataclass(frozen=True, slots=True)
class PassEnd:
    """Where a session goes once its current pass completed."""

    next_pass: int
    state: SessionState  # RUNNING, or the state it stops in


def pass_end(
    state: SessionState,
    current_pass: int,
    completed_pass: int,
    *,
    passes_total: int,
    next_release_allowed: bool | None,
) -> PassEnd:
    """The next pass and state once ``completed_pass`` completed (every part of its last layer
    summed): finished after the last pass; stopped at its budget if the next pass's release
    would be refused (``next_release_allowed``; None without differential privacy), before the
    clients compute it; else running the next pass. Only the running pass of a running session
    completes (:class:`IllegalTransition` otherwise)."""
    if state != SessionState.RUNNING or completed_pass != current_pass:
        raise IllegalTransition(
            f"pass {completed_pass} cannot complete in a {state} session at pass {current_pass}"
        )
    next_pass = completed_pass + 1
    if next_pass == passes_total:
        return PassEnd(next_pass, transition(state, SessionState.FINISHED))
    if next_release_allowed is False:
        return PassEnd(next_pass, transition(state, SessionState.BUDGET_EXHAUSTED))
    return PassEnd(next_pass, state)
