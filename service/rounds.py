"""The pass/round state machine of a session, independent of HTTP.

Per pass and aggregation layer l, clients upload node sets (l below the top layer L; the service
forms the sorted union once all M arrived) and then embedding shares (the service sums them in
client order 0..M-1 once all M arrived). The pass advances when its last aggregation layer is
summed. With DP on, summing the first aggregation layer of a pass is its release: the ledger row
and the stored sum are written in one transaction, and nothing of the pass is served before.

Every method is blocking (SQLite, CKKS); call them from a worker thread. Each upload is checked
twice: once before the (possibly slow) payload validation and again, atomically, with the insert.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

from secure.aggregation import PayloadError, SumAggregator
from service.encryption import Aggregators
from service.errors import ProblemError, budget_exhausted, session_closed, session_not_found
from service.payloads import (
    NODE_ENCODING,
    parse_matrix_headers,
    parse_node_headers,
    union_of,
    validate_node_set,
)
from service.plan import PlanCache, SessionPlan
from service.schemas import Metrics, PassInfo
from service.store import SessionRow, Store, Transaction, UploadKind
from service.telemetry import Telemetry

DONE_REASON = {
    "running": "finished",
    "finished": "finished",
    "budget_exhausted": "budget-exhausted",
    "closed": "closed",
}


@dataclass(frozen=True, slots=True)
class ClientSlot:
    """Who is calling: client ``client_index`` of session ``session_id`` (authenticated)."""

    session_id: str
    client_index: int


@dataclass(frozen=True, slots=True)
class Waiting:
    pass_index: int
    layer: int
    received: list[int]
    missing: list[int]


@dataclass(frozen=True, slots=True)
class Payload:
    body: bytes
    shape: str
    encoding: str
    count: int | None = None


@dataclass(frozen=True, slots=True)
class UploadOutcome:
    created: bool
    received: list[int]
    missing: list[int]


@dataclass(frozen=True, slots=True)
class _Slot:
    """An upload slot that passed its checks: the plan and, for embeddings, the shape."""

    plan: SessionPlan
    duplicate: bool
    rows: int = 0
    cols: int = 0


def _missing(received: list[int], clients: int) -> list[int]:
    have = set(received)
    return [m for m in range(clients) if m not in have]


class RoundEngine:
    def __init__(
        self, store: Store, plans: PlanCache, aggregators: Aggregators, telemetry: Telemetry
    ) -> None:
        self.store = store
        self.plans = plans
        self.aggregators = aggregators
        self.telemetry = telemetry

    # Session lookup and the checks shared by every route

    def session(self, tx: Transaction, session_id: str) -> tuple[SessionRow, SessionPlan]:
        row = tx.session(session_id)
        if row is None:
            raise session_not_found(session_id)
        return row, self.plans.get(session_id, lambda: tx.session_config(session_id))

    def _open_session(self, tx: Transaction, session_id: str) -> tuple[SessionRow, SessionPlan]:
        row, plan = self.session(tx, session_id)
        if row.state == "closed":
            raise session_closed(session_id)
        return row, plan

    @staticmethod
    def _pass_in_schedule(plan: SessionPlan, pass_index: int) -> None:
        if pass_index >= plan.passes_total:
            raise ProblemError(
                404,
                "wrong-pass",
                f"pass {pass_index} is not in this session's schedule"
                f" (passes 0..{plan.passes_total - 1})",
            )

    @staticmethod
    def _agg_layer(plan: SessionPlan, layer: int) -> None:
        if layer not in plan.widths:
            raise ProblemError(
                404,
                "wrong-layer",
                f"layer {layer} is not an aggregation layer of this session"
                f" (aggregation layers: {sorted(plan.widths)})",
            )

    @classmethod
    def _node_layer(cls, plan: SessionPlan, layer: int) -> None:
        cls._agg_layer(plan, layer)
        if layer == plan.top_layer:
            raise ProblemError(
                404,
                "wrong-layer",
                f"layer {layer} is the top layer: its rows are the pass's output nodes, so node"
                " sets are exchanged only for aggregation layers below it",
            )

    @staticmethod
    def _current_pass_only(row: SessionRow, pass_index: int) -> None:
        if row.state == "budget_exhausted" and pass_index >= row.current_pass:
            raise budget_exhausted(row.id, pass_index)
        if row.state == "finished":
            raise ProblemError(409, "wrong-pass", "the session has finished all its passes")
        if pass_index != row.current_pass:
            raise ProblemError(
                409,
                "wrong-pass",
                f"uploads go to the current pass {row.current_pass}, not pass {pass_index}",
            )

    @staticmethod
    def _downloadable(row: SessionRow, pass_index: int) -> None:
        if row.state == "budget_exhausted" and pass_index >= row.current_pass:
            raise budget_exhausted(row.id, pass_index)
        if pass_index > row.current_pass:
            raise ProblemError(
                409,
                "wrong-pass",
                f"pass {pass_index} has not started; the current pass is {row.current_pass}",
            )
        if pass_index < row.current_pass - 1:
            raise ProblemError(
                409,
                "wrong-pass",
                f"the payloads of pass {pass_index} were discarded: the service keeps the current"
                f" pass ({row.current_pass}) and the previous one",
            )

    # Pass descriptors

    def pass_info(self, session_id: str, pass_index: int) -> PassInfo:
        with self.store.transaction() as tx:
            row, plan = self.session(tx, session_id)
        if pass_index > plan.passes_total:
            raise ProblemError(
                404,
                "wrong-pass",
                f"pass {pass_index} is past the end of the schedule ({plan.passes_total} passes;"
                f" pass {plan.passes_total} means 'done')",
            )
        stopped = row.state in ("closed", "budget_exhausted") and pass_index >= row.current_pass
        if pass_index == plan.passes_total or stopped:
            return PassInfo(
                pass_index=pass_index,
                kind="done",
                round=None,
                output_nodes=[],
                reason=DONE_REASON[row.state],
            )
        spec = plan.passes[pass_index]
        return PassInfo(
            pass_index=pass_index,
            kind=spec.kind,
            round=spec.round,
            output_nodes=plan.output_nodes(pass_index).tolist(),
        )

    # Uploads

    def put_node_set(
        self,
        slot: ClientSlot,
        pass_index: int,
        layer: int,
        *,
        shape: str | None,
        encoding: str | None,
        body: bytes,
    ) -> UploadOutcome:
        declared = parse_node_headers(shape, encoding)

        def validate(target: _Slot) -> None:
            validate_node_set(body, declared=declared, num_nodes=target.plan.config.num_nodes)

        return self._accept(slot, pass_index, layer, "nodes", body, validate)

    def put_embedding(
        self,
        slot: ClientSlot,
        pass_index: int,
        layer: int,
        *,
        shape: str | None,
        encoding: str | None,
        body: bytes,
    ) -> UploadOutcome:
        header = parse_matrix_headers(shape, encoding)

        def validate(target: _Slot) -> None:
            plan = target.plan
            if header.encoding != plan.encoding:
                raise ProblemError(
                    422,
                    "wrong-encoding",
                    f"this session's embeddings are {plan.encoding!r}, the upload says"
                    f" {header.encoding!r}",
                )
            if (header.rows, header.cols) != (target.rows, target.cols):
                origin = (
                    "the pass's output nodes"
                    if layer == plan.top_layer
                    else f"the node union of layer {layer}"
                )
                raise ProblemError(
                    422,
                    "wrong-shape",
                    f"pass {pass_index} layer {layer} expects shape {target.rows},{target.cols}"
                    f" ({target.rows} rows: {origin}; {target.cols} columns: the layer's width),"
                    f" X-Glasu-Shape says {header.rows},{header.cols}",
                )
            try:
                self._aggregator(plan).validate(body, rows=target.rows, cols=target.cols)
            except PayloadError as exc:
                raise ProblemError(422, "bad-payload", str(exc)) from exc

        outcome = self._accept(slot, pass_index, layer, "embedding", body, validate)
        if outcome.created and not outcome.missing:
            self._sum_shares(slot.session_id, pass_index, layer)
        return outcome

    def _accept(
        self,
        slot: ClientSlot,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        body: bytes,
        validate: Callable[[_Slot], None],
    ) -> UploadOutcome:
        """Gate, validate outside the lock (CKKS parsing is slow), then gate again and insert
        atomically. An identical re-upload is answered without validation."""
        sha256 = hashlib.sha256(body).digest()
        with self.store.transaction() as tx:
            target = self._gate(tx, slot, pass_index, layer, kind, sha256)
        if not target.duplicate:
            validate(target)
        with self.store.transaction() as tx:
            target = self._gate(tx, slot, pass_index, layer, kind, sha256)
            if not target.duplicate:
                tx.insert_upload(
                    slot.session_id,
                    pass_index,
                    layer,
                    kind,
                    slot.client_index,
                    sha256=sha256,
                    body=body,
                )
            tx.add_traffic(slot.session_id, slot.client_index, up=len(body))
            received = tx.uploaders(slot.session_id, pass_index, layer, kind)
            outcome = UploadOutcome(
                not target.duplicate, received, _missing(received, target.plan.clients)
            )
            if kind == "nodes" and outcome.created and not outcome.missing:
                union = union_of(tx.upload_bodies(slot.session_id, pass_index, layer, kind))
                tx.insert_result(
                    slot.session_id,
                    pass_index,
                    layer,
                    "union",
                    rows=len(union) // 8,
                    cols=0,
                    count=target.plan.clients,
                    body=union,
                )
        self.telemetry.bytes_received.labels(kind=kind).inc(len(body))
        return outcome

    def _gate(
        self,
        tx: Transaction,
        slot: ClientSlot,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        sha256: bytes,
    ) -> _Slot:
        """Everything an upload must satisfy apart from its body; 4xx otherwise."""
        row, plan = self._open_session(tx, slot.session_id)
        self._pass_in_schedule(plan, pass_index)
        if kind == "nodes":
            self._node_layer(plan, layer)
        else:
            self._agg_layer(plan, layer)
        existing = tx.upload(slot.session_id, pass_index, layer, kind, slot.client_index)
        if existing is not None:
            if hmac.compare_digest(existing.sha256, sha256):
                return _Slot(plan, duplicate=True)
            raise ProblemError(
                409,
                "conflict",
                f"client {slot.client_index} already uploaded a different {kind} body for pass"
                f" {pass_index} layer {layer}; a slot is written once",
            )
        self._current_pass_only(row, pass_index)
        if kind == "nodes":
            return _Slot(plan, duplicate=False)
        for lower in plan.agg_layers_below(layer):
            if tx.result(slot.session_id, pass_index, lower, "aggregate") is None:
                raise ProblemError(
                    409,
                    "not-ready",
                    f"the sum of layer {lower} of pass {pass_index} is not complete yet;"
                    " embeddings go up the aggregation layers in ascending order",
                )
        rows = self._rows(tx, plan, pass_index, layer)
        return _Slot(plan, duplicate=False, rows=rows, cols=plan.widths[layer])

    def _rows(self, tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> int:
        if layer == plan.top_layer:
            return plan.output_rows(pass_index)
        union = tx.result(plan.session_id, pass_index, layer, "union")
        if union is None:
            received = tx.uploaders(plan.session_id, pass_index, layer, "nodes")
            raise ProblemError(
                409,
                "not-ready",
                f"the node union of pass {pass_index} layer {layer} is not complete (missing node"
                f" sets from clients {_missing(received, plan.clients)}); its rows are the union",
            )
        return union.rows

    def _aggregator(self, plan: SessionPlan) -> SumAggregator:
        return self.aggregators.for_encoding(
            plan.encoding, context_sha256=plan.public_context_sha256
        )

    # Downloads and sums

    def node_union(self, slot: ClientSlot, pass_index: int, layer: int) -> Payload | Waiting:
        with self.store.transaction() as tx:
            row, plan = self._open_session(tx, slot.session_id)
            self._pass_in_schedule(plan, pass_index)
            self._node_layer(plan, layer)
            self._downloadable(row, pass_index)
            union = tx.result(slot.session_id, pass_index, layer, "union")
            if union is None:
                received = tx.uploaders(slot.session_id, pass_index, layer, "nodes")
                return Waiting(pass_index, layer, received, _missing(received, plan.clients))
            body = self._served(tx, slot, pass_index, union.body)
        self.telemetry.bytes_sent.labels(kind="union").inc(len(body))
        return Payload(body=body, shape=str(union.rows), encoding=NODE_ENCODING)

    def aggregate(self, slot: ClientSlot, pass_index: int, layer: int) -> Payload | Waiting:
        for _attempt in range(2):
            with self.store.transaction() as tx:
                row, plan = self._open_session(tx, slot.session_id)
                self._pass_in_schedule(plan, pass_index)
                self._agg_layer(plan, layer)
                self._downloadable(row, pass_index)
                total = tx.result(slot.session_id, pass_index, layer, "aggregate")
                if total is not None:
                    body = self._served(tx, slot, pass_index, total.body)
                    self.telemetry.bytes_sent.labels(kind="aggregate").inc(len(body))
                    return Payload(
                        body=body,
                        shape=f"{total.rows},{total.cols}",
                        encoding=plan.encoding,
                        count=total.count,
                    )
                received = tx.uploaders(slot.session_id, pass_index, layer, "embedding")
                waiting = Waiting(pass_index, layer, received, _missing(received, plan.clients))
            if waiting.missing:
                return waiting
            # All shares are in but no sum: the summing request died (e.g. a restart). Redo it.
            self._sum_shares(slot.session_id, pass_index, layer)
        return waiting

    def _sum_shares(self, session_id: str, pass_index: int, layer: int) -> None:
        with self.store.transaction() as tx:
            row, plan = self.session(tx, session_id)
            if row.state != "running" or row.current_pass != pass_index:
                return
            if tx.result(session_id, pass_index, layer, "aggregate") is not None:
                return
            bodies = tx.upload_bodies(session_id, pass_index, layer, "embedding")
            if len(bodies) < plan.clients:
                return
            rows = self._rows(tx, plan, pass_index, layer)
        cols = plan.widths[layer]
        total = self._aggregator(plan).add(bodies, rows=rows, cols=cols)
        completed_kind = None
        with self.store.transaction() as tx:
            row, _ = self.session(tx, session_id)
            if row.state != "running" or row.current_pass != pass_index:
                return
            if tx.result(session_id, pass_index, layer, "aggregate") is not None:
                return
            released_at = None
            if plan.accounting is not None and layer == plan.first_agg_layer:
                released_at = self._record_release(tx, plan, pass_index)
                if released_at is None:
                    return
            tx.insert_result(
                session_id,
                pass_index,
                layer,
                "aggregate",
                rows=rows,
                cols=cols,
                count=plan.clients,
                body=total,
                released_at=released_at,
            )
            if layer == plan.last_agg_layer:
                completed_kind = plan.passes[pass_index].kind
                self._advance(tx, plan, pass_index)
        if completed_kind is not None:
            self.telemetry.passes_completed.labels(kind=completed_kind).inc()

    @staticmethod
    def _record_release(tx: Transaction, plan: SessionPlan, pass_index: int) -> float | None:
        """Append the ledger row of this pass's release; None (and the session stops) if it
        does not fit. Normally the check at the start of the pass already stopped it."""
        accounting = plan.accounting
        assert accounting is not None
        releases = len(tx.ledger(plan.session_id))
        if not accounting.release_allowed(releases):
            tx.set_session_state(plan.session_id, "budget_exhausted")
            return None
        now = time.time()
        tx.append_ledger(
            plan.session_id,
            release_index=releases + 1,
            pass_index=pass_index,
            epsilon=accounting.epsilon_after(releases + 1),
            at=now,
        )
        return now

    @staticmethod
    def _advance(tx: Transaction, plan: SessionPlan, finished_pass: int) -> None:
        next_pass = finished_pass + 1
        tx.set_current_pass(plan.session_id, next_pass)
        tx.discard_payloads(plan.session_id, before_pass=finished_pass)
        if next_pass == plan.passes_total:
            tx.set_session_state(plan.session_id, "finished")
        elif plan.accounting is not None and not plan.accounting.release_allowed(
            len(tx.ledger(plan.session_id))
        ):
            # Stop before the clients compute a pass whose release would be refused.
            tx.set_session_state(plan.session_id, "budget_exhausted")

    # Metrics

    def put_metrics(self, slot: ClientSlot, pass_index: int, metrics: Metrics) -> None:
        with self.store.transaction() as tx:
            row, plan = self._open_session(tx, slot.session_id)
            self._pass_in_schedule(plan, pass_index)
            if pass_index > row.current_pass:
                raise ProblemError(
                    409,
                    "wrong-pass",
                    f"pass {pass_index} has not started (current pass {row.current_pass})",
                )
            if metrics.empty:
                return
            tx.upsert_metrics(
                slot.session_id, pass_index, slot.client_index, **metrics.model_dump()
            )

    # Helpers

    def _served(
        self, tx: Transaction, slot: ClientSlot, pass_index: int, body: bytes | None
    ) -> bytes:
        if body is None:
            raise ProblemError(
                409, "wrong-pass", f"the payloads of pass {pass_index} have been discarded"
            )
        tx.add_traffic(slot.session_id, slot.client_index, down=len(body))
        return body
