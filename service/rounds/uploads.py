"""Accepting uploads: node sets (the union is formed when the M-th arrives), embedding shares
(each part validated once and added into the running sum of its (layer, part); the M-th
completes it) and per-pass metrics.

Each upload is checked twice: once before the (possibly slow) payload validation and again,
atomically, with the insert. A slot is written once; an identical re-upload is answered without
validation.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

from secure.aggregation import PayloadError
from secure.protocol import part_count, part_span
from secure.wire.passes import Metrics
from service.domain_errors import (
    BadPayload,
    Conflict,
    MetricsRefused,
    NotReady,
    WrongEncoding,
    WrongPart,
    WrongPass,
    WrongShape,
)
from service.payloads import (
    MatrixHeader,
    parse_matrix_headers,
    parse_node_headers,
    union_of,
    validate_node_set,
)
from service.plan import SessionPlan
from service.rounds.gate import (
    check_current_pass,
    check_in_pass,
    check_pass_in_schedule,
    open_layer,
    open_session,
)
from service.rounds.readiness import check_every_client_ready
from service.rounds.services import RoundComponent, RoundServices
from service.rounds.slots import (
    layer_rows,
    layer_summed,
    mark_left_out,
    masked,
    rejoin,
    slot_progress,
    sum_pending,
)
from service.rounds.sums import ShareSums, void_pass
from service.rounds.types import Caller, UploadOutcome
from service.session_state import voids_pass
from service.store import KIND_NAME, Slot, Transaction, UploadKind


@dataclass(frozen=True, slots=True)
class _UploadTarget:
    """An upload slot that passed its checks: the plan and, for embeddings, the part's shape
    and its rows ``span`` of the layer's ``layer_rows``."""

    plan: SessionPlan
    duplicate: bool
    rows: int = 0
    cols: int = 0
    layer_rows: int = 0
    span: tuple[int, int] = (0, 0)


class Uploads(RoundComponent):
    def __init__(self, services: RoundServices, sums: ShareSums) -> None:
        super().__init__(services)
        self.sums = sums

    def put(
        self,
        kind: UploadKind,
        caller: Caller,
        pass_index: int,
        layer: int,
        *,
        shape: str | None,
        encoding: str | None,
        body: bytes,
        part: int = 0,
        parts: int = 1,
    ) -> UploadOutcome:
        """Store a node set or part ``part`` of ``parts`` of an embedding share; the headers
        are checked first."""
        slot = Slot(caller.session_id, pass_index, layer, part)
        if kind == "nodes":
            declared = parse_node_headers(shape, encoding)
            return self._accept_node_set(caller, slot, declared, body)
        header = parse_matrix_headers(shape, encoding)
        return self._accept_share(caller, slot, parts, header, body)

    def rejoin(self, caller: Caller) -> int:
        """The pass from which the caller takes part again after a pass went on without it
        (stragglers "continue"); the current pass for a client that was never left out."""
        with self.store.transaction() as tx:
            row, plan = open_session(tx, self.plans, caller.session_id)
            return rejoin(tx, plan, row, caller.client_index)

    def put_metrics(self, caller: Caller, pass_index: int, metrics: Metrics) -> None:
        """Store a client's metrics of a pass; refused in a session with differential privacy
        (even an empty report: the route is not part of a private session's protocol)."""
        with self.store.transaction() as tx:
            row, plan = open_session(tx, self.plans, caller.session_id)
            if plan.privacy is not None:
                raise MetricsRefused(caller.session_id)
            check_pass_in_schedule(plan, pass_index)
            if pass_index > row.current_pass:
                raise WrongPass("metrics-too-early", pass_index, row.current_pass)
            if metrics.empty:
                return
            tx.upsert_metrics(
                caller.session_id, pass_index, caller.client_index, **metrics.model_dump()
            )

    def _accept_node_set(
        self, caller: Caller, slot: Slot, declared: int, body: bytes
    ) -> UploadOutcome:
        """Check, validate outside the lock (``declared``: the node count of its header), then
        check again, insert and (with the M-th) form the union atomically."""
        sha256 = hashlib.sha256(body).digest()
        with self.store.transaction() as tx:
            target = self._check_slot(tx, caller, "nodes", sha256, slot)
        if not target.duplicate:
            validate_node_set(body, declared=declared, num_nodes=target.plan.config.num_nodes)
        return self._record(caller, "nodes", sha256, body, slot, keep_body=True)

    def _accept_share(
        self, caller: Caller, slot: Slot, parts: int, header: MatrixHeader, body: bytes
    ) -> UploadOutcome:
        """Check; validate and parse the share's part once, outside the lock (CKKS parsing is
        slow); write its body to the bodies; then, holding the part's running sum, check
        again, insert and add it. The upload that completes the part (or repeats one whose sum
        was not stored) stores the part's sum."""
        sha256 = hashlib.sha256(body).digest()
        with self.store.transaction() as tx:
            target = self._check_slot(tx, caller, "share", sha256, slot, parts)
        if target.duplicate:
            outcome = self._record(caller, "share", sha256, body, slot, declared_parts=parts)
        else:
            share = self._read_share(target, header, slot, body)
            self.bodies.write_share(slot, caller.client_index, sha256, body)
            with self.sums.forming(
                target.plan, slot, rows=target.rows, cols=target.cols
            ) as running:
                outcome = self._record(caller, "share", sha256, body, slot, declared_parts=parts)
                if outcome.created and running is not None:
                    running.add(caller.client_index, share)
        if not outcome.missing:
            self.sums.complete(slot, wait=True)
        return outcome

    def _read_share(
        self, target: _UploadTarget, header: MatrixHeader, slot: Slot, body: bytes
    ) -> Any:
        """The share's part, validated against the slot and parsed by the session's
        aggregator."""
        plan = target.plan
        if header.encoding != plan.encoding:
            raise WrongEncoding(plan.encoding, header.encoding)
        if (header.rows, header.cols) != (target.rows, target.cols):
            start, stop = target.span
            raise WrongShape.embedding(
                slot.pass_index,
                slot.layer,
                expected=(target.rows, target.cols),
                declared=(header.rows, header.cols),
                rows_are=f"rows {start}..{stop - 1} (part {slot.part}) of the layer's"
                f" {target.layer_rows}, {_layer_nodes(plan, slot.pass_index, slot.layer)}",
            )
        try:
            return self.aggregators.for_session(plan).read_share(
                body, rows=target.rows, cols=target.cols
            )
        except PayloadError as exc:
            raise BadPayload(str(exc)) from exc

    def _record(
        self,
        caller: Caller,
        kind: UploadKind,
        sha256: bytes,
        body: bytes,
        slot: Slot,
        *,
        declared_parts: int = 1,
        keep_body: bool = False,
    ) -> UploadOutcome:
        """Check the slot again and insert the upload (its body too if ``keep_body``), count the
        traffic and, with the M-th node set, store the union: one transaction."""
        with self.store.transaction() as tx:
            target = self._check_slot(tx, caller, kind, sha256, slot, declared_parts)
            if not target.duplicate:
                tx.insert_upload(
                    caller.session_id,
                    slot.pass_index,
                    slot.layer,
                    kind,
                    caller.client_index,
                    sha256=sha256,
                    size=len(body),
                    body=body if keep_body else None,
                    part=slot.part,
                )
            tx.add_traffic(caller.session_id, caller.client_index, up=len(body))
            progress = slot_progress(tx, target.plan, slot, kind)
            outcome = UploadOutcome(
                not target.duplicate,
                progress.received,
                progress.missing,
                wakes_waiters=not progress.missing or target.plan.config.stragglers == "continue",
            )
            if kind == "nodes" and outcome.created:
                close_union(tx, target.plan, slot)
        self.telemetry.bytes_received.labels(kind=KIND_NAME[kind]).inc(len(body))
        return outcome

    def _check_slot(
        self,
        tx: Transaction,
        caller: Caller,
        kind: UploadKind,
        sha256: bytes,
        slot: Slot,
        declared_parts: int = 1,
    ) -> _UploadTarget:
        """Everything an upload must satisfy apart from its body (``declared_parts``: the
        layer's part count its upload names; a node set is part 0 of 1)."""
        pass_index, layer, part = slot.pass_index, slot.layer, slot.part
        row, plan = open_layer(tx, self.plans, caller.session_id, pass_index, layer, kind)
        existing = tx.upload(caller.session_id, pass_index, layer, kind, caller.client_index, part)
        if existing is not None:
            if hmac.compare_digest(existing.sha256, sha256):
                return _UploadTarget(plan, duplicate=True)
            raise Conflict(caller.client_index, KIND_NAME[kind], pass_index, layer)
        check_current_pass(row, pass_index)
        check_every_client_ready(tx, plan)
        check_in_pass(tx, plan, caller.client_index, pass_index, layer, kind)
        if kind == "nodes":
            return _UploadTarget(plan, duplicate=False)
        for lower in plan.agg_layers_below(layer):
            if not layer_summed(tx, plan, pass_index, lower):
                raise NotReady.lower_sum(pass_index, lower)
        rows, cols = layer_rows(tx, plan, pass_index, layer), plan.widths[layer]
        parts = part_count(rows, cols, plan.part_values)
        if declared_parts != parts:
            raise WrongPart.count(pass_index, layer, expected=parts, declared=declared_parts)
        if not 0 <= part < parts:
            raise WrongPart.out_of_range(pass_index, layer, part=part, parts=parts)
        start, stop = part_span(part, rows=rows, cols=cols, part_values=plan.part_values)
        return _UploadTarget(
            plan, duplicate=False, rows=stop - start, cols=cols, layer_rows=rows, span=(start, stop)
        )


def _layer_nodes(plan: SessionPlan, pass_index: int, layer: int) -> str:
    """What a layer's rows are (``slots.layer_rows``), in words."""
    if plan.post_processing:
        return "the pass's output nodes"
    if not plan.samples(pass_index):
        return "all num_nodes aligned nodes"
    if layer >= plan.top_layer:
        return "the pass's output nodes"
    return f"the node union of layer {layer}"


def close_union(tx: Transaction, plan: SessionPlan, slot: Slot) -> bool:
    """Store the layer's node union if its slot closes now (``session_state.slot_progress``),
    or void the pass of a masked slot that closes without a participant
    (:func:`service.rounds.sums.void_pass`); whether it did either."""
    if tx.result(*slot[:3], "union") is not None:
        return False
    progress = slot_progress(tx, plan, slot, "nodes")
    if not progress.closes:
        return False
    if voids_pass(progress, masked=masked(plan)):
        row = tx.session(plan.session_id)
        assert row is not None
        if not sum_pending(tx, row, slot):  # the session runs another pass, or stopped
            return False
        void_pass(tx, row, plan, slot.pass_index, progress, release=False)
        return True
    mark_left_out(tx, plan, slot.pass_index, progress.received)
    union = union_of(tx.upload_bodies(*slot[:3], "nodes"))
    tx.insert_result(
        *slot[:3],
        "union",
        rows=len(union) // 8,
        cols=0,
        count=len(progress.received),
        body=union,
    )
    return True
