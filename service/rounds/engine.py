"""The round engine: the one object the routes and the session manager talk to. It wires the
parts of the pass/round state machine together and adds nothing of its own."""

from __future__ import annotations

from service.aggregators import Aggregators
from service.plan import PlanCache, SessionPlan
from service.rounds.downloads import Downloads
from service.rounds.gate import load_session
from service.rounds.sums import ShareSums
from service.rounds.types import ClientSlot, Payload, UploadOutcome, Waiting
from service.rounds.uploads import Uploads
from service.schemas import Metrics, PassInfo
from service.store import ResultKind, SessionRow, Store, Transaction, UploadKind
from service.telemetry import Telemetry


class RoundEngine:
    def __init__(
        self, store: Store, plans: PlanCache, aggregators: Aggregators, telemetry: Telemetry
    ) -> None:
        self.plans = plans
        sums = ShareSums(store, plans, aggregators, telemetry)
        self.uploads = Uploads(store, plans, aggregators, telemetry, sums)
        self.downloads = Downloads(store, plans, telemetry, sums)

    def session(self, tx: Transaction, session_id: str) -> tuple[SessionRow, SessionPlan]:
        """A session's row and plan; ``SessionNotFound`` if there is none."""
        return load_session(tx, self.plans, session_id)

    def pass_info(self, session_id: str, pass_index: int) -> PassInfo:
        return self.downloads.pass_info(session_id, pass_index)

    def upload(
        self,
        kind: UploadKind,
        slot: ClientSlot,
        pass_index: int,
        layer: int,
        *,
        shape: str | None,
        encoding: str | None,
        body: bytes,
    ) -> UploadOutcome:
        return self.uploads.put(
            kind, slot, pass_index, layer, shape=shape, encoding=encoding, body=body
        )

    def download(
        self, kind: ResultKind, slot: ClientSlot, pass_index: int, layer: int
    ) -> Payload | Waiting:
        return self.downloads.get(kind, slot, pass_index, layer)

    def put_metrics(self, slot: ClientSlot, pass_index: int, metrics: Metrics) -> None:
        self.uploads.put_metrics(slot, pass_index, metrics)
