"""What every component of the round engine works with, built once by :class:`RoundEngine`."""

from __future__ import annotations

from dataclasses import dataclass

from service.aggregators import Aggregators
from service.plan import PlanCache
from service.rounds.payload_store import PayloadStore
from service.store import Store
from service.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class RoundServices:
    store: Store
    plans: PlanCache
    aggregators: Aggregators
    telemetry: Telemetry
    bodies: PayloadStore  # share and sum bodies: files beside SQLite, a table of PostgreSQL


class RoundComponent:
    """Base of the engine's components (uploads, sums, downloads): the services as
    attributes."""

    def __init__(self, services: RoundServices) -> None:
        self.store = services.store
        self.plans = services.plans
        self.aggregators = services.aggregators
        self.telemetry = services.telemetry
        self.bodies = services.bodies
