"""The checks the round routes share, each inside the caller's transaction: the session exists
(and is open), the pass is in the schedule, the layer is one where this exchange happens, and
the pass is the current one (uploads) or still kept (downloads). Failures are domain errors.

A layer's shares and sums travel in parts (``secure.protocol.part_span``); each part is a slot
of its own (``part``: uploads, their progress and the stragglers' rules are per part), and a
layer is summed once every part is (:func:`layer_summed`)."""

from __future__ import annotations

from dataclasses import dataclass

from secure.protocol import MIN_CONTRIBUTORS, part_count, part_span
from service.domain_errors import (
    BudgetExhausted,
    Excluded,
    NotReady,
    SessionClosed,
    SessionNotFound,
    UnknownPass,
    WrongLayer,
    WrongPass,
)
from service.plan import PlanCache, SessionPlan
from service.session_state import SessionState
from service.store import ResultKind, SessionRow, Transaction, UploadKind

# Each result is formed from one kind of upload.
UPLOAD_KIND: dict[ResultKind, UploadKind] = {"union": "nodes", "aggregate": "embedding"}
_WHAT: dict[UploadKind, str] = {"nodes": "node sets", "embedding": "shares"}


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
        if plan.passes[pass_index].kind == "eval":
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


def uploaders(
    tx: Transaction,
    plan: SessionPlan,
    pass_index: int,
    layer: int,
    kind: UploadKind,
    part: int = 0,
) -> tuple[list[int], list[int]]:
    """The clients whose ``kind`` upload of this slot is in, and the pass's participants still
    missing."""
    received = tx.uploaders(plan.session_id, pass_index, layer, kind, part)
    have = set(received)
    return received, [m for m in participants(tx, plan, pass_index) if m not in have]


def participants(tx: Transaction, plan: SessionPlan, pass_index: int) -> list[int]:
    """The clients still in a pass: every client, except under stragglers "continue", where a
    slot closed without a client leaves it out of the rest of the pass, and out of the passes
    after it until it asks to rejoin (:func:`rejoin`)."""
    clients = set(range(plan.clients))
    if plan.config.stragglers == "continue":
        clients -= tx.absent_clients(plan.session_id, pass_index)
        for layer, kind, part in tx.result_slots(plan.session_id, pass_index):
            uploaded = tx.uploaders(plan.session_id, pass_index, layer, UPLOAD_KIND[kind], part)
            clients &= set(uploaded)
    return sorted(clients)


def leave_out(tx: Transaction, plan: SessionPlan, pass_index: int, missing: list[int]) -> None:
    """A slot of ``pass_index`` closed without the clients ``missing``: they are absent from the
    next pass on (later passes do not wait for them) until they ask to rejoin."""
    for client in missing:
        tx.mark_absent(plan.session_id, client, from_pass=pass_index + 1)


def rejoin(tx: Transaction, plan: SessionPlan, client: int, current_pass: int) -> int:
    """The pass from which ``client`` takes part again: the current one if none of its slots
    has closed without it, else the next; later passes wait for it from there."""
    back_at = current_pass
    if client not in participants(tx, plan, current_pass):
        absent = client in tx.absent_clients(plan.session_id, current_pass)
        if not absent or tx.result_slots(plan.session_id, current_pass):
            back_at = current_pass + 1
    tx.mark_back(plan.session_id, client, at_pass=back_at)
    return back_at


@dataclass(frozen=True, slots=True)
class SlotProgress:
    """Where the ``kind`` uploads of one (pass, layer, part) stand."""

    received: list[int]  # the clients whose upload is in
    missing: list[int]  # the pass's participants whose upload is not
    # When the slot may close without the missing: under stragglers "continue",
    # straggler_wait_seconds after its first upload once enough clients arrived; else never.
    closes_at: float | None
    closes: bool  # whether its result may be formed now from the uploads received


def slot_progress(
    tx: Transaction,
    plan: SessionPlan,
    pass_index: int,
    layer: int,
    kind: UploadKind,
    part: int = 0,
) -> SlotProgress:
    """The slot's uploads and whether it closes now: every participant's upload is in, or
    (stragglers "continue") the wait since its first upload is over and enough clients
    arrived."""
    received, missing = uploaders(tx, plan, pass_index, layer, kind, part)
    continues = plan.config.stragglers == "continue"
    at = None
    if continues and len(received) >= MIN_CONTRIBUTORS:
        first = tx.first_upload_at(plan.session_id, pass_index, layer, kind, part)
        at = None if first is None else first + plan.config.straggler_wait_seconds
    if continues and len(received) < min(MIN_CONTRIBUTORS, plan.clients):
        closes = False  # the others are absent: wait until one rejoins
    else:
        closes = not missing or (at is not None and tx.now() >= at)
    return SlotProgress(received, missing, at, closes)


def check_in_pass(
    tx: Transaction, plan: SessionPlan, client: int, pass_index: int, layer: int, kind: UploadKind
) -> None:
    """``Excluded`` if the pass went on without this client (stragglers "continue"). It may then
    neither upload nor fetch a result of the pass: a sum is served only to its contributors."""
    if client not in participants(tx, plan, pass_index):
        raise Excluded(client, pass_index, layer, _WHAT[kind])


def layer_rows(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> int:
    """Rows of the layer's embeddings: in an evaluation pass every aligned node (``num_nodes``,
    at every layer); else the output nodes at the top (and for the gradient above it), and the
    node union below (which must be complete)."""
    if plan.passes[pass_index].kind == "eval":
        return plan.config.num_nodes
    if layer >= plan.top_layer:
        return plan.output_rows(pass_index)
    union = tx.result(plan.session_id, pass_index, layer, "union")
    if union is None:
        _, missing = uploaders(tx, plan, pass_index, layer, "nodes")
        raise NotReady.union(pass_index, layer, missing)
    return union.rows


def layer_parts(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> int:
    """How many parts the layer's shares and sum travel in (its rows must be known)."""
    return part_count(layer_rows(tx, plan, pass_index, layer), plan.widths[layer], plan.part_values)


def layer_summed(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> bool:
    """Whether the sum of every part of the layer is stored."""
    summed = tx.result_parts(plan.session_id, pass_index, layer, "aggregate")
    return summed > 0 and summed == layer_parts(tx, plan, pass_index, layer)


def part_rows_of(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int, part: int) -> int:
    """Rows of part ``part`` of the layer's shares and sum."""
    start, stop = part_span(
        part,
        rows=layer_rows(tx, plan, pass_index, layer),
        cols=plan.widths[layer],
        part_values=plan.part_values,
    )
    return stop - start
