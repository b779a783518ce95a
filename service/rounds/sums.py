"""Summing a layer's shares once all M are in, recording the pass's release in the privacy
ledger, and advancing the session to the next pass.

With DP on, summing the first aggregation layer of a pass is its release: the ledger row and the
stored sum are written in one durable transaction (synced to disk before ``COMMIT`` returns, see
service/store.py), and nothing of the pass is served before.
"""

from __future__ import annotations

import time

from service.aggregators import Aggregators
from service.plan import PlanCache, SessionPlan
from service.rounds.gate import layer_rows, load_session
from service.store import SessionRow, Store, Transaction
from service.telemetry import Telemetry


class ShareSums:
    def __init__(
        self, store: Store, plans: PlanCache, aggregators: Aggregators, telemetry: Telemetry
    ) -> None:
        self.store = store
        self.plans = plans
        self.aggregators = aggregators
        self.telemetry = telemetry

    def sum_shares(self, session_id: str, pass_index: int, layer: int) -> None:
        """Add the M shares in client order (outside the lock: CKKS is slow), then store the sum
        if nothing changed meanwhile. Does nothing if the slot is not complete or already summed,
        so a second caller is harmless."""
        with self.store.transaction() as tx:
            row, plan = load_session(tx, self.plans, session_id)
            if not _sum_pending(tx, row, pass_index, layer):
                return
            bodies = tx.upload_bodies(session_id, pass_index, layer, "embedding")
            if len(bodies) < plan.clients:
                return
            rows = layer_rows(tx, plan, pass_index, layer)
        cols = plan.widths[layer]
        total = self.aggregators.for_session(plan).add(bodies, rows=rows, cols=cols)
        completed_kind = None
        # A release's ledger row must be on disk before its sum can be served: a durable
        # transaction's COMMIT returns only once the WAL is synced (service/store.py).
        is_release = plan.privacy is not None and layer == plan.first_agg_layer
        with self.store.transaction(durable=is_release) as tx:
            row, _ = load_session(tx, self.plans, session_id)
            if not _sum_pending(tx, row, pass_index, layer):
                return
            released_at = None
            if is_release:
                released_at = _record_release(tx, plan, pass_index)
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
                _advance(tx, plan, pass_index)
        if completed_kind is not None:
            self.telemetry.passes_completed.labels(kind=completed_kind).inc()


def _sum_pending(tx: Transaction, row: SessionRow, pass_index: int, layer: int) -> bool:
    """The session still runs this pass and the layer has no sum yet."""
    return (
        row.state == "running"
        and row.current_pass == pass_index
        and tx.result(row.id, pass_index, layer, "aggregate") is None
    )


def _record_release(tx: Transaction, plan: SessionPlan, pass_index: int) -> float | None:
    """Append the ledger row of this pass's release; None (and the session stops) if it does not
    fit. Normally the check at the start of the pass already stopped it."""
    privacy = plan.privacy
    assert privacy is not None
    releases = len(tx.ledger(plan.session_id))
    if not privacy.release_allowed(releases):
        tx.set_session_state(plan.session_id, "budget_exhausted")
        return None
    now = time.time()
    tx.append_ledger(
        plan.session_id,
        release_index=releases + 1,
        pass_index=pass_index,
        epsilon=privacy.epsilon_after(releases + 1),
        at=now,
    )
    return now


def _advance(tx: Transaction, plan: SessionPlan, finished_pass: int) -> None:
    next_pass = finished_pass + 1
    tx.set_current_pass(plan.session_id, next_pass)
    tx.discard_payloads(plan.session_id, before_pass=finished_pass)
    if next_pass == plan.passes_total:
        tx.set_session_state(plan.session_id, "finished")
    elif plan.privacy is not None and not plan.privacy.release_allowed(
        len(tx.ledger(plan.session_id))
    ):
        # Stop before the clients compute a pass whose release would be refused.
        tx.set_session_state(plan.session_id, "budget_exhausted")
