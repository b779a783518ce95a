"""The round engine: the one object the routes and the session manager hold. It wires the
components of the rounds together (``uploads``, ``downloads``, and the ``sums`` both
trigger) and adds nothing of its own."""

from __future__ import annotations

from collections.abc import Callable

from service.aggregators import Aggregators
from service.plan import PlanCache, SessionPlan
from service.rounds.downloads import Downloads
from service.rounds.gate import load_session
from service.rounds.payload_store import payload_store_for
from service.rounds.services import RoundServices
from service.rounds.sums import ShareSums
from service.rounds.uploads import Uploads
from service.store import SessionRow, Store, Transaction
from service.telemetry import Telemetry


class RoundEngine:
    def __init__(
        self,
        store: Store,
        plans: PlanCache,
        aggregators: Aggregators,
        telemetry: Telemetry,
        on_change: Callable[[str], None],
    ) -> None:
        """``on_change(session_id)``: see :class:`Downloads` (uploads say it in their
        outcome)."""
        self.plans = plans
        services = RoundServices(store, plans, aggregators, telemetry, payload_store_for(store))
        self.sums = ShareSums(services)
        self.uploads = Uploads(services, self.sums)
        self.downloads = Downloads(services, self.sums, on_change)

    def session(self, tx: Transaction, session_id: str) -> tuple[SessionRow, SessionPlan]:
        """A session's row and plan; ``SessionNotFound`` if there is none."""
        return load_session(tx, self.plans, session_id)

    def discard_payloads(self, session_id: str) -> None:
        """Drop every share and sum of a session (closed) that the store does not hold itself
        (after ``Transaction.discard_payloads`` committed): files, or the payload table."""
        self.sums.discard(session_id)
