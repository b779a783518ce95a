"""What every part of the round engine works with, built once by :class:`RoundEngine`."""

from __future__ import annotations

from dataclasses import dataclass

from service.aggregators import Aggregators
from service.plan import PlanCache
from service.store import Store
from service.store.bodies import Bodies
from service.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class RoundParts:
    store: Store
    plans: PlanCache
    aggregators: Aggregators
    telemetry: Telemetry
    bodies: Bodies  # share and sum bodies


class RoundPart:
    """Base of the engine's parts (uploads, sums, downloads): the shared parts as attributes."""

    def __init__(self, parts: RoundParts) -> None:
        self.store = parts.store
        self.plans = parts.plans
        self.aggregators = parts.aggregators
        self.telemetry = parts.telemetry
        self.bodies = parts.bodies
