"""The store's side of the round state machine: what a pass and its slots hold (who uploaded,
who is still in the pass, how many rows and parts a layer has), read inside the caller's
transaction and handed to :mod:`service.session_state`, which decides; and the absences it
decides, written. Decisions are never taken here.

A layer's shares and sums travel in parts (``secure.protocol.part_span``); each part is a slot
of its own (:class:`service.store.Slot`: uploads, their progress and the stragglers' rules are
per part), and a layer is summed once every part is (:func:`layer_summed`)."""

from __future__ import annotations

from secure.protocol import part_count, part_span
from service import session_state
from service.domain_errors import NotReady
from service.plan import SessionPlan
from service.session_state import SlotProgress
from service.store import ResultKind, SessionRow, Slot, Transaction, UploadKind

# Each result is formed from one kind of upload.
UPLOAD_KIND: dict[ResultKind, UploadKind] = {"union": "nodes", "sum": "share"}


def participants(tx: Transaction, plan: SessionPlan, pass_index: int) -> list[int]:
    """The clients still in a pass (:func:`service.session_state.participants`)."""
    continues = plan.config.stragglers == "continue"
    return session_state.participants(
        plan.clients,
        plan.config.stragglers,
        absent=tx.absent_clients(plan.session_id, pass_index) if continues else (),
        closed_slots_uploaders=[
            tx.uploaders(plan.session_id, pass_index, layer, UPLOAD_KIND[kind], part)
            for layer, kind, part in tx.result_slots(plan.session_id, pass_index)
        ]
        if continues
        else (),
    )


def slot_progress(tx: Transaction, plan: SessionPlan, slot: Slot, kind: UploadKind) -> SlotProgress:
    """Where the ``kind`` uploads of a slot stand, and whether it closes now
    (:func:`service.session_state.slot_progress`)."""
    received = tx.uploaders(slot.session_id, slot.pass_index, slot.layer, kind, slot.part)
    continues = plan.config.stragglers == "continue"
    first = tx.first_upload_at(*slot[:3], kind, slot.part) if continues and received else None
    return session_state.slot_progress(
        received,
        participants(tx, plan, slot.pass_index),
        clients=plan.clients,
        stragglers=plan.config.stragglers,
        straggler_wait_seconds=plan.config.straggler_wait_seconds,
        first_upload_at=first,
        now=tx.now(),
        masked=masked(plan),
    )


def masked(plan: SessionPlan) -> bool:
    """The session masks its shares (secure aggregation 'masks')."""
    return plan.config.secure_aggregation == "masks"


def stated_participants(
    tx: Transaction, plan: SessionPlan, row: SessionRow, pass_index: int
) -> list[int] | None:
    """The participants of a masked pass, once the service may state them
    (:func:`service.session_state.stated_participants`)."""
    return session_state.stated_participants(
        participants(tx, plan, pass_index),
        masked=masked(plan),
        stragglers=plan.config.stragglers,
        pass_index=pass_index,
        current_pass=row.current_pass,
    )


def sum_pending(tx: Transaction, row: SessionRow, slot: Slot) -> bool:
    """The session still runs the slot's pass and the slot has no sum yet."""
    stored = tx.result(row.id, slot.pass_index, slot.layer, "sum", slot.part) is not None
    return session_state.sum_pending(
        row.state, row.current_pass, slot.pass_index, sum_stored=stored
    )


def mark_left_out(
    tx: Transaction, plan: SessionPlan, pass_index: int, contributors: list[int]
) -> None:
    """A slot of ``pass_index`` closed with ``contributors`` only: the pass's other participants
    are absent from the next pass on (:func:`service.session_state.left_out`)."""
    for client in session_state.left_out(participants(tx, plan, pass_index), contributors):
        tx.mark_absent(plan.session_id, client, from_pass=pass_index + 1)


def rejoin(tx: Transaction, plan: SessionPlan, row: SessionRow, client: int) -> int:
    """Record that ``client`` asks to take part again; the pass from which it does
    (:func:`service.session_state.rejoin_pass`)."""
    back_at = session_state.rejoin_pass(
        row.state,
        row.current_pass,
        participating=client in participants(tx, plan, row.current_pass),
        absent=client in tx.absent_clients(plan.session_id, row.current_pass),
        slots_closed=bool(tx.result_slots(plan.session_id, row.current_pass)),
        stated=stated_participants(tx, plan, row, row.current_pass) is not None,
    )
    if back_at is None:
        return row.current_pass
    tx.mark_back(plan.session_id, client, at_pass=back_at)
    return back_at


def layer_rows(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> int:
    """Rows of the layer's embeddings: in an evaluation pass over all nodes every aligned node
    (``num_nodes``, at every layer); else (a pass that samples: ``SessionPlan.samples``) the
    output nodes at the top (and for the gradient above it), and the node union below (which
    must be complete); a scoring session's answer, and every layer of a scoring session of a
    kept release, one row per output node."""
    if layer == plan.answer_layer or plan.post_processing:
        return plan.output_rows(pass_index)
    if not plan.samples(pass_index):
        return plan.config.num_nodes
    if layer >= plan.top_layer:
        return plan.output_rows(pass_index)
    union = tx.result(plan.session_id, pass_index, layer, "union")
    if union is None:
        progress = slot_progress(tx, plan, Slot(plan.session_id, pass_index, layer), "nodes")
        raise NotReady.union(pass_index, layer, progress.missing)
    return union.rows


def layer_parts(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> int:
    """How many parts the layer's shares and sum travel in (its rows must be known)."""
    return part_count(layer_rows(tx, plan, pass_index, layer), plan.widths[layer], plan.part_values)


def layer_summed(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> bool:
    """Whether the sum of every part of the layer is stored."""
    summed = tx.result_parts(plan.session_id, pass_index, layer, "sum")
    return summed > 0 and session_state.layer_summed(
        summed, layer_parts(tx, plan, pass_index, layer)
    )


def part_rows_of(tx: Transaction, plan: SessionPlan, slot: Slot) -> int:
    """Rows of the slot's part of the layer's shares and sum."""
    start, stop = part_span(
        slot.part,
        rows=layer_rows(tx, plan, slot.pass_index, slot.layer),
        cols=plan.widths[slot.layer],
        part_values=plan.part_values,
    )
    return stop - start
