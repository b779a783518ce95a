"""Admin side of sessions: create (tokens, privacy plan), list, status, privacy report, close."""

from __future__ import annotations

import uuid

import numpy as np

from secure.body_limits import BodyLimitTooSmall, share_part_bytes, share_part_values
from secure.privacy import PrivacyPlanError, SessionPrivacy, check_private_arrangement
from secure.protocol import PART_VALUES, part_count
from secure.schedule import ONE_PASS_KINDS, passes_total
from secure.wire.request_signature import RequestSignature
from secure.wire.sessions import (
    MAX_PART_VALUES,
    ScoringRequestOpened,
    SessionCreate,
    SessionCreated,
    SessionSummary,
    request_session_id,
)
from secure.wire.status import (
    ClientTraffic,
    LayerProgress,
    LedgerEntry,
    MetricsRecord,
    PassProgress,
    PrivacyReport,
    SessionStatus,
)
from service.aggregators import Aggregators
from service.domain_errors import InvalidSessionRequest, SessionNotFound
from service.notify import Pending
from service.online import asker_of, open_request, request_opened
from service.plan import PlanCache, PlanOutline, SessionPlan
from service.rounds import RoundEngine
from service.rounds.readiness import client_readiness
from service.rounds.slots import layer_rows, layer_summed
from service.session_state import SessionState
from service.store import LedgerRow, SessionRow, Store, Transaction
from service.tokens import new_tokens, token_sha256


class SessionManager:
    def __init__(
        self,
        store: Store,
        plans: PlanCache,
        aggregators: Aggregators,
        engine: RoundEngine,
        *,
        max_body_bytes: int | None = None,
        score_foreign_models: bool = False,
    ) -> None:
        self.store = store
        self.plans = plans
        self.aggregators = aggregators
        self.engine = engine
        self.max_body_bytes = max_body_bytes  # what share parts are sized to (None: not sized)
        self.score_foreign_models = score_foreign_models

    def create(self, request: SessionCreate) -> SessionCreated:
        total = passes_total(
            scoring=request.kind in ONE_PASS_KINDS,
            rounds=request.rounds,
            eval_every=request.eval_every,
        )
        self._check_model_session(request)
        context_sha256 = None
        if request.secure_aggregation == "masks":
            self.aggregators.check_masked_session(request.clients)
        elif request.encryption == "ckks":
            context_sha256 = self.aggregators.check_ckks_session(request.clients).sha256
        config, source = self._with_part_values(request), "given"
        if request.privacy is not None:
            try:
                # The one place the service refuses a DP session the workers could not run
                # privately: the release layer must be the only aggregation layer.
                check_private_arrangement([a.layer for a in request.agg_layers])
                privacy = SessionPrivacy.plan(
                    **request.privacy.model_dump(),
                    clients=request.clients,
                    passes_total=total,
                    encrypted=request.encryption == "ckks",
                    masked=request.secure_aggregation == "masks",
                )
            except PrivacyPlanError as exc:
                raise InvalidSessionRequest(f"privacy: {exc}") from exc
            settings = request.privacy.model_copy(
                update={"noise_multiplier": privacy.noise_multiplier}
            )
            config = config.model_copy(update={"privacy": settings})
            source = privacy.noise_multiplier_source
        session_id = uuid.uuid4().hex
        plan = SessionPlan.build(
            session_id,
            config,
            noise_multiplier_source=source,
            public_context_sha256=context_sha256,
        )
        tokens = new_tokens(request.clients)
        with self.store.transaction() as tx:
            tx.insert_session(session_id, plan.to_json(), [token_sha256(t) for t in tokens])
        self.plans.put(plan)
        return SessionCreated(
            session_id=session_id,
            client_tokens=tokens,
            passes_total=plan.passes_total,
            noise_multiplier=plan.privacy.noise_multiplier if plan.privacy else None,
        )

    def open_request(
        self, online_id: str, nodes: np.ndarray, signature: RequestSignature | None = None
    ) -> ScoringRequestOpened:
        """A request of an online scoring session: its request session (``service/online.py``)."""
        opened, plan = open_request(self.store, self.engine, online_id, nodes, signature)
        self.plans.put(plan)
        return opened

    def next_request(self, online_id: str, number: int) -> SessionStatus | Pending:
        """Request ``number`` of an online session, once it is opened (its status); Pending,
        owed by the answering party, until then (``service/online.py``, ``request_opened``)."""
        with self.store.transaction() as tx:
            if not request_opened(tx, self.engine, online_id, number):
                return Pending(missing=[asker_of(self.engine.session(tx, online_id)[1])])
        return self.status(request_session_id(online_id, number))

    def answering_client(self, session_id: str) -> int:
        with self.store.transaction() as tx:
            _, plan = self.engine.session(tx, session_id)
        return asker_of(plan)

    def _check_model_session(self, request: SessionCreate) -> None:
        """A scoring session names the training session whose models score: one of this
        service's (unless it scores foreign models), over, with the same clients and layers."""
        named = request.model_session
        if request.kind != "scoring":
            if named is not None:
                raise InvalidSessionRequest("model_session is for scoring sessions only")
            return
        if named is None:
            raise InvalidSessionRequest(
                "a scoring session names the training session whose models score (model_session)"
            )
        with self.store.transaction() as tx:
            row = tx.session(named)
            if row is None:
                if self.score_foreign_models:
                    return
                raise InvalidSessionRequest(
                    f"model_session {named!r} is not a session of this service (models trained"
                    " on another are scored where GLASU_SCORE_FOREIGN_MODELS is on)"
                )
            _, trained = self.engine.session(tx, named)
        if trained.config.kind != request.model_kind:
            raise InvalidSessionRequest(
                f"model_session {named!r} is a {trained.config.kind} session, not a "
                f"{request.model_kind} session (model_kind)"
            )
        if row.state == SessionState.RUNNING:
            raise InvalidSessionRequest(
                f"model_session {named!r} is still training: score once it is over"
            )
        for field in ("clients", "layers", "agg_layers", "nodes", "label_holder"):
            given, kept = getattr(request, field), getattr(trained.config, field)
            if given != kept:
                raise InvalidSessionRequest(
                    f"{field} differs from model_session {named!r}'s, whose models score:"
                    f" {_shown(given)} here, {_shown(kept)} there"
                )

    def _with_part_values(self, request: SessionCreate) -> SessionCreate:
        """The request with the ``part_values`` its shares travel in: the most whose upload
        fits the body limit (up to ``PART_VALUES``), or the request's own if it fits."""
        if self.max_body_bytes is None:
            return request
        widest = max(
            a.width + (request.nodes == "union") for a in request.agg_layers
        )  # the presence column of a count-aware share
        given = request.part_values
        try:
            fitting = share_part_values(
                self.max_body_bytes,
                encoding=request.encoding,
                widest=widest,
                most=MAX_PART_VALUES if given is not None else PART_VALUES,
            )
        except BodyLimitTooSmall as exc:
            raise InvalidSessionRequest(str(exc)) from None
        if given is None:
            return request.model_copy(update={"part_values": fitting})
        largest = share_part_bytes(given, encoding=request.encoding)
        if given > fitting:
            raise InvalidSessionRequest(
                f"part_values {given} makes {request.encoding} parts of up to"
                f" {largest} bytes, over this service's body limit of {self.max_body_bytes}"
                f" (GLASU_MAX_BODY_BYTES): at most {fitting}"
            )
        if given < widest:
            raise InvalidSessionRequest(
                f"part_values {given} is less than one row of the widest layer ({widest} values)"
            )
        return request

    def client_of_token(self, token_hash: bytes) -> tuple[str, int] | None:
        """The (session, client index) a client token's hash belongs to."""
        with self.store.transaction() as tx:
            return tx.token_owner(token_hash)

    def exists(self, session_id: str) -> bool:
        with self.store.transaction() as tx:
            return tx.session(session_id) is not None

    def list(self, *, limit: int, after: str | None = None) -> tuple[list[SessionSummary], bool]:
        """Up to ``limit`` sessions, oldest first, from the one created after session ``after``,
        and whether more follow. Only the rows are read under the store's lock; their plans are
        read outside it (and not built: a listing must not evict the plans of running
        sessions from their cache)."""
        with self.store.transaction() as tx:
            if after is not None and tx.session(after) is None:
                raise SessionNotFound(after)
            page = tx.sessions_page(after=after, limit=limit + 1)
        summaries = [
            self._summary(row, PlanOutline.from_json(config)) for row, config in page[:limit]
        ]
        return summaries, len(page) > limit

    def close(self, session_id: str) -> SessionSummary:
        with self.store.transaction() as tx:
            row, plan = self.engine.session(tx, session_id)
            if row.state != SessionState.CLOSED:
                tx.set_session_state(session_id, SessionState.CLOSED)
                tx.discard_payloads(session_id)
                row = tx.session(session_id)
                assert row is not None
            summary = self._summary(row, plan.outline)
        self.engine.discard_payloads(session_id)  # the shares and sums kept outside SQLite
        return summary

    def status(self, session_id: str) -> SessionStatus:
        with self.store.transaction() as tx:
            row, plan = self.engine.session(tx, session_id)
            progress = self._progress(tx, row, plan)
            metrics = tx.metrics(session_id)
            traffic = tx.traffic(session_id)
            ledger = tx.ledger(session_id)
            readiness = client_readiness(tx, plan)
        per_client = [
            ClientTraffic(client=m, bytes_up=up, bytes_down=down)
            for m, (up, down) in sorted(traffic.items())
        ]
        return SessionStatus(
            session_id=row.id,
            label=plan.config.label,
            state=row.state,  # type: ignore[arg-type]
            created_at=row.created_at,
            config=plan.config_view(),
            max_body_bytes=self.max_body_bytes,
            passes_total=plan.passes_total,
            current_pass=row.current_pass,
            progress=progress,
            metrics=[
                MetricsRecord(
                    pass_index=m.pass_index,
                    kind=plan.passes[m.pass_index].kind,
                    round=plan.passes[m.pass_index].round,
                    reports=m.reports,
                    loss=m.loss,
                    val_accuracy=m.val_accuracy,
                    test_accuracy=m.test_accuracy,
                    train_accuracy=m.train_accuracy,
                )
                for m in metrics
            ],
            bytes_up=sum(t.bytes_up for t in per_client),
            bytes_down=sum(t.bytes_down for t in per_client),
            traffic=per_client,
            privacy=self._privacy_report(plan, ledger),
            readiness=readiness,
        )

    def report_page(self, session_id: str, *, now: float) -> str:
        """The operator's read-only privacy page of the session (HTML, ``secure.report``)."""
        from secure.report import session_content
        from secure.report_html import render_html

        status = self.status(session_id)
        with self.store.transaction() as tx:
            _, plan = self.engine.session(tx, session_id)
        content = session_content(
            status.model_dump(mode="json"),
            pass_kinds=[p.kind for p in plan.passes],
            generated_at=now,
        )
        return render_html(content)

    def privacy_report(self, session_id: str) -> PrivacyReport:
        with self.store.transaction() as tx:
            _, plan = self.engine.session(tx, session_id)
            ledger = tx.ledger(session_id)
        return self._privacy_report(plan, ledger)

    @staticmethod
    def _summary(row: SessionRow, outline: PlanOutline) -> SessionSummary:
        return SessionSummary(
            session_id=row.id,
            label=outline.label,
            state=row.state,  # type: ignore[arg-type]
            created_at=row.created_at,
            clients=outline.clients,
            passes_total=outline.passes_total,
            current_pass=row.current_pass,
        )

    @staticmethod
    def _progress(tx: Transaction, row: SessionRow, plan: SessionPlan) -> PassProgress | None:
        p = row.current_pass
        if p >= plan.passes_total or row.state != SessionState.RUNNING:
            return None
        layers = []
        exchanges_nodes = plan.samples(p)  # an evaluation over all nodes: no node sets
        for agg in plan.config.agg_layers:
            has_union = exchanges_nodes and agg.layer < plan.top_layer
            union = tx.result(row.id, p, agg.layer, "union") if has_union else None
            rows = None if has_union and union is None else layer_rows(tx, plan, p, agg.layer)
            layers.append(
                LayerProgress(
                    layer=agg.layer,
                    width=agg.width,
                    rows=rows,
                    nodes_received=tx.uploaders(row.id, p, agg.layer, "nodes")
                    if has_union
                    else None,
                    union_ready=not has_union or union is not None,
                    embeddings_received=_shares_received(tx, plan, p, agg.layer, rows),
                    aggregated=rows is not None and layer_summed(tx, plan, p, agg.layer),
                )
            )
        spec = plan.passes[p]
        return PassProgress(
            pass_index=p,
            kind=spec.kind,
            round=spec.round,
            layers=layers,
            absent=sorted(tx.absent_clients(row.id, p)),
        )

    @staticmethod
    def _privacy_report(plan: SessionPlan, ledger: list[LedgerRow]) -> PrivacyReport:
        if plan.privacy is None:
            return PrivacyReport(enabled=False)
        entries = [
            LedgerEntry(
                release=r.release_index,
                pass_index=r.pass_index,
                epsilon=r.epsilon,
                released_at=r.released_at,
                clients=list(range(plan.clients)) if r.clients is None else r.clients,
            ).model_dump()
            for r in ledger
        ]
        return PrivacyReport.model_validate(
            plan.privacy.report(releases=len(entries), ledger=entries)
        )


def _shown(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    if hasattr(value, "model_dump"):
        return str(value.model_dump())
    return repr(value)


def _shares_received(
    tx: Transaction, plan: SessionPlan, pass_index: int, layer: int, rows: int | None
) -> list[int]:
    """The clients whose every part of the layer's share is in (none before its rows are
    known)."""
    if rows is None:
        return []
    received: set[int] | None = None
    for part in range(part_count(rows, plan.widths[layer], plan.part_values)):
        clients = set(tx.uploaders(plan.session_id, pass_index, layer, "share", part))
        received = clients if received is None else received & clients
    return sorted(received or ())
