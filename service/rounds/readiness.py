"""The join gate of a session with ``ready_gate``: each worker says, once its own checks passed
(its data, its model, its owner's policy), that it is ready, or refuses the session saying why.
No share is accepted before every client said ready (:func:`check_every_client_ready`, called by
the uploads), and a refusal closes the session at once, so that no client releases anything
into a session another one refused and none waits on it: a client waiting for the others
(``GET .../readiness``) is answered 409 ``session-refused`` with the refusal's reason.

Its table lives in the service's database with its own numbered migrations (component
``readiness``, ``service/store/migrations.py``), like the alignments'."""

from __future__ import annotations

from collections.abc import Callable

from secure.wire.passes import ReadinessReport, ReadinessStatus
from secure.wire.status import ClientReadiness
from service.domain_errors import ClientsNotReady, SessionRefused
from service.notify import Pending
from service.plan import PlanCache, SessionPlan
from service.rounds.gate import load_session, open_session
from service.rounds.types import Caller
from service.session_state import SessionState
from service.store import Store, Transaction
from service.store.migrations import Migration, schema
from service.store.queries import SESSION_ID_COLUMN

READINESS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS client_readiness (
    {SESSION_ID_COLUMN},
    client_index INTEGER NOT NULL,
    ready INTEGER NOT NULL,
    reason TEXT,
    reported_at REAL NOT NULL,
    PRIMARY KEY (session_id, client_index)
);
"""

READINESS_MIGRATIONS = (Migration(1, "each client's readiness at join", schema(READINESS_SCHEMA)),)


def _rows(tx: Transaction, session_id: str) -> dict[int, tuple[bool, str | None, float]]:
    """Each client's answer: (ready, reason, reported_at) by client index."""
    rows = tx.connection.execute(
        "SELECT client_index, ready, reason, reported_at FROM client_readiness"
        " WHERE session_id = ?",
        (session_id,),
    ).fetchall()
    return {int(client): (bool(ready), reason, at) for client, ready, reason, at in rows}


def _reports(tx: Transaction, session_id: str) -> dict[int, tuple[bool, str | None]]:
    return {m: (ready, reason) for m, (ready, reason, _) in _rows(tx, session_id).items()}


def client_readiness(tx: Transaction, plan: SessionPlan) -> list[ClientReadiness] | None:
    """Each client's answer at join, for the session's status (None without the gate)."""
    if not plan.config.ready_gate:
        return None
    said = _rows(tx, plan.session_id)
    answers = []
    for m in range(plan.clients):
        if m not in said:
            answers.append(ClientReadiness(client=m, state="waiting"))
            continue
        ready, reason, at = said[m]
        state = "ready" if ready else "refused"
        answers.append(ClientReadiness(client=m, state=state, reason=reason, reported_at=at))
    return answers


def _refusal(session_id: str, reports: dict[int, tuple[bool, str | None]]) -> None:
    """``SessionRefused`` for the first client that refused, if one did."""
    for client, (ready, reason) in sorted(reports.items()):
        if not ready:
            raise SessionRefused(session_id, client, reason or "no reason given")


def check_every_client_ready(tx: Transaction, plan: SessionPlan) -> None:
    """Inside an upload's transaction: ``ClientsNotReady`` unless every client of a session
    with ``ready_gate`` said it is ready (nothing to check in a session without it)."""
    if not plan.config.ready_gate:
        return
    reports = _reports(tx, plan.session_id)
    missing = [m for m in range(plan.clients) if not reports.get(m, (False, None))[0]]
    if missing:
        raise ClientsNotReady(plan.session_id, missing)


class ReadinessGate:
    """``report`` a client's readiness or refusal; ``check`` whether every client is ready."""

    def __init__(self, store: Store, plans: PlanCache, close: Callable[[str], object]) -> None:
        """``close(session_id)``: close a session (``SessionManager.close``)."""
        self.store = store
        self.plans = plans
        self.close = close
        store.migrate("readiness", READINESS_MIGRATIONS)

    def report(self, caller: Caller, report: ReadinessReport) -> None:
        """Keep the client's answer (its first: a resumed worker's later one changes nothing);
        a refusal closes the session. ``SessionRefused`` once another client refused."""
        with self.store.transaction() as tx:
            load_session(tx, self.plans, caller.session_id)
            _refusal(caller.session_id, _reports(tx, caller.session_id))
            open_session(tx, self.plans, caller.session_id)
            tx.connection.execute(
                "INSERT INTO client_readiness (session_id, client_index, ready, reason,"
                " reported_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (caller.session_id, caller.client_index, int(report.ready), report.reason,
                 tx.now()),
            )  # fmt: skip
        if not report.ready:
            self.close(caller.session_id)

    def check(self, caller: Caller) -> ReadinessStatus | Pending:
        """``ReadinessStatus`` once every client said ready, ``Pending`` naming those that did
        not yet; ``SessionRefused`` once one refused, ``SessionClosed`` for a session closed
        otherwise."""
        with self.store.transaction() as tx:
            row, plan = load_session(tx, self.plans, caller.session_id)
            reports = _reports(tx, caller.session_id)
            _refusal(caller.session_id, reports)
            if row.state == SessionState.CLOSED:
                open_session(tx, self.plans, caller.session_id)  # raises SessionClosed
        ready = sorted(m for m, (said_ready, _) in reports.items() if said_ready)
        missing = [m for m in range(plan.clients) if m not in ready]
        if missing:
            return Pending(missing=missing, received=ready)
        return ReadinessStatus(ready=ready)
