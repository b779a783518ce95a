"""Accepting uploads: node sets (the union is formed when the M-th arrives), embedding shares
(summed when the M-th arrives) and per-pass metrics.

Each upload is checked twice: once before the (possibly slow) payload validation and again,
atomically, with the insert. A slot is written once; an identical re-upload is answered without
validation.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from secure.aggregation import PayloadError
from service.aggregators import Aggregators
from service.domain_errors import (
    BadPayload,
    Conflict,
    MetricsRefused,
    NotReady,
    WrongEncoding,
    WrongPass,
    WrongShape,
)
from service.payloads import (
    parse_matrix_headers,
    parse_node_headers,
    union_of,
    validate_node_set,
)
from service.plan import PlanCache, SessionPlan
from service.rounds.gate import (
    check_current_pass,
    check_pass_in_schedule,
    layer_rows,
    open_layer,
    open_session,
    uploaders,
)
from service.rounds.sums import ShareSums
from service.rounds.types import Caller, UploadOutcome
from service.schemas import Metrics
from service.store import Store, Transaction, UploadKind
from service.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class _UploadTarget:
    """An upload slot that passed its checks: the plan and, for embeddings, the shape."""

    plan: SessionPlan
    duplicate: bool
    rows: int = 0
    cols: int = 0


Validator = Callable[[_UploadTarget], None]


class Uploads:
    def __init__(
        self,
        store: Store,
        plans: PlanCache,
        aggregators: Aggregators,
        telemetry: Telemetry,
        sums: ShareSums,
    ) -> None:
        self.store = store
        self.plans = plans
        self.aggregators = aggregators
        self.telemetry = telemetry
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
    ) -> UploadOutcome:
        """Store a node set or an embedding share; the headers are checked first."""
        if kind == "nodes":
            validate = self._node_set_validator(shape, encoding, body)
        else:
            validate = self._embedding_validator(pass_index, layer, shape, encoding, body)
        outcome = self._accept(caller, pass_index, layer, kind, body, validate)
        if kind == "embedding" and outcome.created and not outcome.missing:
            self.sums.sum_shares(caller.session_id, pass_index, layer)
        return outcome

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

    @staticmethod
    def _node_set_validator(shape: str | None, encoding: str | None, body: bytes) -> Validator:
        declared = parse_node_headers(shape, encoding)

        def validate(target: _UploadTarget) -> None:
            validate_node_set(body, declared=declared, num_nodes=target.plan.config.num_nodes)

        return validate

    def _embedding_validator(
        self, pass_index: int, layer: int, shape: str | None, encoding: str | None, body: bytes
    ) -> Validator:
        header = parse_matrix_headers(shape, encoding)

        def validate(target: _UploadTarget) -> None:
            plan = target.plan
            if header.encoding != plan.encoding:
                raise WrongEncoding(plan.encoding, header.encoding)
            if (header.rows, header.cols) != (target.rows, target.cols):
                raise WrongShape.embedding(
                    pass_index,
                    layer,
                    expected=(target.rows, target.cols),
                    declared=(header.rows, header.cols),
                    rows_are="the pass's output nodes"
                    if layer == plan.top_layer
                    else f"the node union of layer {layer}",
                )
            try:
                self.aggregators.for_session(plan).validate(
                    body, rows=target.rows, cols=target.cols
                )
            except PayloadError as exc:
                raise BadPayload(str(exc)) from exc

        return validate

    def _accept(
        self,
        caller: Caller,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        body: bytes,
        validate: Validator,
    ) -> UploadOutcome:
        """Check, validate outside the lock (CKKS parsing is slow), then check again and insert
        atomically. An identical re-upload is answered without validation."""
        sha256 = hashlib.sha256(body).digest()
        with self.store.transaction() as tx:
            target = self._check_slot(tx, caller, pass_index, layer, kind, sha256)
        if not target.duplicate:
            validate(target)
        with self.store.transaction() as tx:
            target = self._check_slot(tx, caller, pass_index, layer, kind, sha256)
            if not target.duplicate:
                tx.insert_upload(
                    caller.session_id,
                    pass_index,
                    layer,
                    kind,
                    caller.client_index,
                    sha256=sha256,
                    body=body,
                )
            tx.add_traffic(caller.session_id, caller.client_index, up=len(body))
            received, missing = uploaders(tx, target.plan, pass_index, layer, kind)
            outcome = UploadOutcome(not target.duplicate, received, missing)
            if kind == "nodes" and outcome.created and not missing:
                _store_union(tx, target.plan, pass_index, layer)
        self.telemetry.bytes_received.labels(kind=kind).inc(len(body))
        return outcome

    def _check_slot(
        self,
        tx: Transaction,
        caller: Caller,
        pass_index: int,
        layer: int,
        kind: UploadKind,
        sha256: bytes,
    ) -> _UploadTarget:
        """Everything an upload must satisfy apart from its body."""
        row, plan = open_layer(tx, self.plans, caller.session_id, pass_index, layer, kind)
        existing = tx.upload(caller.session_id, pass_index, layer, kind, caller.client_index)
        if existing is not None:
            if hmac.compare_digest(existing.sha256, sha256):
                return _UploadTarget(plan, duplicate=True)
            raise Conflict(caller.client_index, kind, pass_index, layer)
        check_current_pass(row, pass_index)
        if kind == "nodes":
            return _UploadTarget(plan, duplicate=False)
        for lower in plan.agg_layers_below(layer):
            if tx.result(caller.session_id, pass_index, lower, "aggregate") is None:
                raise NotReady.lower_sum(pass_index, lower)
        rows = layer_rows(tx, plan, pass_index, layer)
        return _UploadTarget(plan, duplicate=False, rows=rows, cols=plan.widths[layer])


def _store_union(tx: Transaction, plan: SessionPlan, pass_index: int, layer: int) -> None:
    union = union_of(tx.upload_bodies(plan.session_id, pass_index, layer, "nodes"))
    tx.insert_result(
        plan.session_id,
        pass_index,
        layer,
        "union",
        rows=len(union) // 8,
        cols=0,
        count=plan.clients,
        body=union,
    )
