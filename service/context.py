"""Everything one app instance owns, built once by :func:`build_context` and shared by routes."""

from __future__ import annotations

from dataclasses import dataclass

from service.aggregators import Aggregators, PublicContext
from service.alignment import AlignmentManager
from service.clock import Clock
from service.limits import ByteBudget
from service.notify import SessionNotifier
from service.plan import PlanCache
from service.rounds import RoundEngine
from service.rounds.readiness import ReadinessGate
from service.session_state import SessionState
from service.sessions import SessionManager
from service.settings import ServiceSettings
from service.store import Store
from service.telemetry import Telemetry
from service.tokens import token_sha256


@dataclass
class ServiceContext:
    settings: ServiceSettings
    store: Store
    aggregators: Aggregators
    telemetry: Telemetry
    notifier: SessionNotifier
    engine: RoundEngine
    sessions: SessionManager
    alignments: AlignmentManager
    readiness: ReadinessGate
    clock: Clock
    admin_token_sha256: bytes
    body_budget: ByteBudget

    def close(self) -> None:
        self.notifier.close()
        self.store.close()


def database_url(settings: ServiceSettings) -> str | None:
    """The PostgreSQL URL the settings name (several replicas share it), None for an SQLite
    file (one process)."""
    url = getattr(settings, "database_url", None)
    if url is None and isinstance(settings.database, str):
        url = settings.database
    return url if url is not None and url.startswith(("postgresql://", "postgres://")) else None


def build_context(settings: ServiceSettings, clock: Clock | None = None) -> ServiceContext:
    """``clock``: the store's by default (the system's, or on PostgreSQL the database's; tests
    pass a :class:`~service.clock.ManualClock`)."""
    admin_token = settings.admin_token_value
    if not admin_token:  # settings validation already refuses this; never run without a token
        raise RuntimeError("refusing to start without an admin token")
    # Load the context before touching the database, so a secret context stops us early.
    context = PublicContext.read(settings.public_context) if settings.public_context else None
    store = Store(settings.database, clock)
    clock = store.clock
    aggregators = Aggregators(context)
    plans = PlanCache()

    def count_running_sessions() -> int:
        with store.transaction() as tx:
            return tx.count_sessions(SessionState.RUNNING)

    telemetry = Telemetry(count_running_sessions)
    notifier = _notifier(settings, clock)
    engine = RoundEngine(store, plans, aggregators, telemetry, notifier.notify_threadsafe)
    sessions = SessionManager(
        store,
        plans,
        aggregators,
        engine,
        max_body_bytes=settings.max_body_bytes,
        score_foreign_models=settings.score_foreign_models,
    )
    return ServiceContext(
        settings=settings,
        store=store,
        aggregators=aggregators,
        telemetry=telemetry,
        notifier=notifier,
        engine=engine,
        sessions=sessions,
        readiness=ReadinessGate(store, plans, sessions.close),
        alignments=AlignmentManager(store, max_body_bytes=settings.max_body_bytes),
        clock=clock,
        admin_token_sha256=token_sha256(admin_token),
        body_budget=ByteBudget(settings.max_inflight_body_bytes, settings.body_queue_seconds),
    )


def _notifier(settings: ServiceSettings, clock: Clock) -> SessionNotifier:
    """In-process wake-ups on SQLite; across replicas through LISTEN/NOTIFY on PostgreSQL."""
    url = database_url(settings)
    if url is None:
        return SessionNotifier(clock)
    from service.notify_postgres import PostgresNotifier  # psycopg only where it is used

    return PostgresNotifier(clock, url)
