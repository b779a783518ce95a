"""The checks the round routes share, each inside the caller's transaction: the session exists
(and is open), the pass is in the schedule, the layer is one where this exchange happens, the
pass is the current one (uploads) or still kept (downloads), and the caller is still in it.
Failures are domain errors."""

from __future__ import annotations

from service.domain_errors import (
    BudgetExhausted,
    Excluded,
    SessionClosed,
    SessionNotFound,
    UnknownPass,
    WrongLayer,
    WrongPass,
)
from service.plan import PlanCache, SessionPlan
from service.rounds.slots import participants
from service.session_state import SessionState
from service.store import SessionRow, Transaction, UploadKind

_WHAT: dict[UploadKind, str] = {"nodes": "node sets", "share": "shares"}


def load_session(
    tx: Transaction, plans: PlanCache, session_id: str
) -> tuple[SessionRow, SessionPlan]:
    row = tx.session(session_id)
    if row is None:
        raise SessionNotFound(session_id)
    return row, plans.get(session_id, lambda: tx.session_config(session_id))


def open_session(
    tx: Transaction, plans: PlanCache, session_id: str
) -> tuple[SessionRow, SessionPlan]:
    row, plan = load_session(tx, plans, session_id)
    if row.state == SessionState.CLOSED:
        raise SessionClosed(session_id)
    return row, plan


def open_layer(
    tx: Transaction,
    plans: PlanCache,
    session_id: str,
    pass_index: int,
    layer: int,
    kind: UploadKind,
) -> tuple[SessionRow, SessionPlan]:
    """An open session, a pass of its schedule and a layer where ``kind`` is exchanged."""
    row, plan = open_session(tx, plans, session_id)
    check_pass_in_schedule(plan, pass_index)
    if kind == "nodes":
        check_node_layer(plan, layer)
        if not plan.samples(pass_index):
            raise WrongLayer.nodes_in_evaluation(layer, pass_index)
    else:
        check_aggregation_layer(plan, layer)
        if layer == plan.gradient_layer and plan.passes[pass_index].kind != "train":
            raise WrongLayer.gradient_on_evaluation(layer, pass_index)
    return row, plan


def check_pass_in_schedule(plan: SessionPlan, pass_index: int) -> None:
    if pass_index >= plan.passes_total:
        raise UnknownPass.not_in_schedule(pass_index, plan.passes_total)


def check_aggregation_layer(plan: SessionPlan, layer: int) -> None:
    if layer not in plan.widths:
        raise WrongLayer.not_aggregation(layer, plan.widths)


def check_node_layer(plan: SessionPlan, layer: int) -> None:
    """Node sets are exchanged at the aggregation layers below the top."""
    check_aggregation_layer(plan, layer)
    if layer >= plan.top_layer:
        raise WrongLayer.top_layer(layer)


def check_current_pass(row: SessionRow, pass_index: int) -> None:
    """Uploads go to the current pass of a running session."""
    if row.state == SessionState.BUDGET_EXHAUSTED and pass_index >= row.current_pass:
        raise BudgetExhausted(row.id, pass_index)
    if row.state == SessionState.FINISHED:
        raise WrongPass("session-finished", pass_index, row.current_pass)
    if pass_index != row.current_pass:
        raise WrongPass("not-current", pass_index, row.current_pass)


def check_downloadable(row: SessionRow, pass_index: int) -> None:
    """Downloads come from the current pass or the previous one (the service keeps two)."""
    if row.state == SessionState.BUDGET_EXHAUSTED and pass_index >= row.current_pass:
        raise BudgetExhausted(row.id, pass_index)
    if pass_index > row.current_pass:
        raise WrongPass("not-started", pass_index, row.current_pass)
    if pass_index < row.current_pass - 1:
        raise WrongPass("too-old", pass_index, row.current_pass)


def check_in_pass(
    tx: Transaction, plan: SessionPlan, client: int, pass_index: int, layer: int, kind: UploadKind
) -> None:
    """``Excluded`` if the pass went on without this client (stragglers "continue"). It may then
    neither upload nor fetch a result of the pass: a sum is served only to its contributors."""
    if client not in participants(tx, plan, pass_index):
        raise Excluded(client, pass_index, layer, _WHAT[kind])
