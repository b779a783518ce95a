"""What clients read: the pass descriptor, a layer's node union and the sum of a layer's part.

A download answers :class:`Pending` until its result is complete. Unions are read from the store,
sums from :class:`ShareSums` (memory, else the bodies). A download never sums shares while
another request is adding one or storing the sum; after a restart it stores a sum whose shares
were all acknowledged before (:meth:`ShareSums.complete`).
"""

from __future__ import annotations

from collections.abc import Callable

from secure.protocol import NODE_ENCODING
from secure.wire.passes import PassInfo
from service.domain_errors import NotReady, UnknownPass, WrongPart, WrongPass
from service.notify import Pending
from service.plan import SessionPlan
from service.rounds.gate import check_downloadable, check_in_pass, load_session, open_layer
from service.rounds.services import RoundComponent, RoundServices
from service.rounds.slots import (
    UPLOAD_KIND,
    layer_parts,
    masked,
    slot_progress,
    stated_participants,
)
from service.rounds.sums import ShareSums
from service.rounds.types import Caller, Payload
from service.rounds.uploads import close_union
from service.session_state import pass_is_done
from service.store import KIND_NAME, ResultKind, ResultRow, Slot, Transaction


class Downloads(RoundComponent):
    def __init__(
        self, services: RoundServices, sums: ShareSums, on_change: Callable[[str], None]
    ) -> None:
        """``on_change(session_id)``: a download formed a result (or stopped the session), which
        the other requests waiting on the session must see (called from a worker thread)."""
        super().__init__(services)
        self.sums = sums
        self.on_change = on_change

    def pass_info(self, session_id: str, pass_index: int) -> PassInfo:
        """Kind, round and output nodes of a pass (and a masked pass's participants, once they
        are fixed); kind 'done' once the session has no such pass."""
        with self.store.transaction() as tx:
            row, plan = load_session(tx, self.plans, session_id)
            members = None
            if pass_index < plan.passes_total:
                members = stated_participants(tx, plan, row, pass_index)
        if pass_index > plan.passes_total:
            raise UnknownPass.past_end(pass_index, plan.passes_total)
        if pass_is_done(row.state, row.current_pass, pass_index, plan.passes_total):
            return PassInfo(
                pass_index=pass_index,
                kind="done",
                round=None,
                output_nodes=[],
                reason=row.state.done_reason,
            )
        spec = plan.passes[pass_index]
        return PassInfo(
            pass_index=pass_index,
            kind=spec.kind,
            round=spec.round,
            output_nodes=plan.output_nodes(pass_index).tolist(),
            participants=members,
        )

    def get(
        self, kind: ResultKind, caller: Caller, pass_index: int, layer: int, part: int = 0
    ) -> Payload | Pending:
        """The node union or the sum of one layer's part (a union is part 0), or who is still
        missing."""
        slot = Slot(caller.session_id, pass_index, layer, part)
        answer = self._fetch(kind, caller, slot)
        if not isinstance(answer, Pending):
            return answer
        closes_now = answer.closes_at is not None and answer.closes_at <= self.store.clock.now()
        if kind == "sum" and (not answer.missing or closes_now):
            # All shares are in but no sum: the upload of the last one is storing it (then this
            # returns at once and the long poll waits to be notified), or it never did (a
            # restart, a failure), and the sum is stored here from the running sum or the
            # shares' bodies. Under stragglers "continue" the sum may also be due without them.
            changed = self.sums.complete(slot, wait=False)
        elif kind == "union" and closes_now:
            with self.store.transaction() as tx:
                _, plan = load_session(tx, self.plans, caller.session_id)
                changed = close_union(tx, plan, slot)
        else:
            return answer
        if changed:
            self.on_change(caller.session_id)
        return self._fetch(kind, caller, slot)

    def _fetch(self, kind: ResultKind, caller: Caller, slot: Slot) -> Payload | Pending:
        pass_index, layer, upload_kind = slot.pass_index, slot.layer, UPLOAD_KIND[kind]
        with self.store.transaction() as tx:
            row, plan = open_layer(
                tx, self.plans, caller.session_id, pass_index, layer, upload_kind
            )
            check_downloadable(row, pass_index)
            check_in_pass(tx, plan, caller.client_index, pass_index, layer, upload_kind)
            result = tx.result(*slot[:3], kind, slot.part)
            if result is None:
                _check_part(tx, plan, slot)
                if masked(plan) and pass_index < row.current_pass:
                    raise WrongPass("voided", pass_index, row.current_pass)  # ended without it
                progress = slot_progress(tx, plan, slot, upload_kind)
                return Pending(progress.missing, progress.received, progress.closes_at)
        body = result.body if kind == "union" else self.sums.sum_body(slot)
        if body is None:
            raise WrongPass("discarded", pass_index, row.current_pass)
        with self.store.transaction() as tx:
            tx.add_traffic(caller.session_id, caller.client_index, down=len(body))
        self.telemetry.bytes_sent.labels(kind=KIND_NAME[kind]).inc(len(body))
        return _payload(kind, plan, result, body)


def _check_part(tx: Transaction, plan: SessionPlan, slot: Slot) -> None:
    """``WrongPart`` if the layer has no such part, once its rows are known (the union of a
    layer below the top in a training pass may still be missing: then the answer waits)."""
    if slot.part == 0:
        return
    try:
        parts = layer_parts(tx, plan, slot.pass_index, slot.layer)
    except NotReady:
        return
    if slot.part >= parts:
        raise WrongPart.out_of_range(slot.pass_index, slot.layer, part=slot.part, parts=parts)


def _payload(kind: ResultKind, plan: SessionPlan, result: ResultRow, body: bytes) -> Payload:
    if kind == "union":
        return Payload(body=body, shape=str(result.rows), encoding=NODE_ENCODING)
    return Payload(
        body=body,
        shape=f"{result.rows},{result.cols}",
        encoding=plan.encoding,
        count=result.count,
    )
