"""The join gate of a session with ``ready_gate`` (service/rounds/readiness.py), without HTTP:
no share is accepted before every client said it is ready, a refusal closes the session and
every later call of the others names the refusing client and its reason; and a scoring session
that shares its answer plans one more exchange at layer L + 1, one row per scored node."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from service_testkit import session_request

from secure.protocol import encode_nodes
from secure.wire.passes import ReadinessReport, ReadinessStatus
from secure.wire.sessions import SessionCreate
from service.context import ServiceContext, build_context
from service.domain_errors import ClientsNotReady, SessionRefused
from service.notify import Pending
from service.plan import SessionPlan
from service.rounds.types import Caller
from service.session_state import SessionState
from service.settings import ServiceSettings

READY = ReadinessReport(ready=True)


@pytest.fixture
def context(make_settings: Callable[..., ServiceSettings]) -> Iterator[ServiceContext]:
    built = build_context(make_settings())
    yield built
    built.close()


def _gated(context: ServiceContext, **overrides: object) -> str:
    created = context.sessions.create(
        SessionCreate.model_validate(session_request(ready_gate=True, **overrides))
    )
    return created.session_id


def _put_nodes(context: ServiceContext, caller: Caller) -> None:
    nodes = encode_nodes(np.array([0, 1, 2]))
    context.engine.uploads.put("nodes", caller, 0, 1, shape="3", encoding="int64", body=nodes)


def test_no_upload_before_every_client_said_ready(context: ServiceContext) -> None:
    session = _gated(context)
    first, second, third = (Caller(session, m) for m in range(3))
    context.readiness.report(first, READY)
    context.readiness.report(second, READY)
    with pytest.raises(ClientsNotReady) as refused:
        _put_nodes(context, first)
    assert refused.value.missing == [2]
    waiting = context.readiness.check(first)
    assert isinstance(waiting, Pending) and waiting.missing == [2]
    context.readiness.report(third, READY)
    assert context.readiness.check(first) == ReadinessStatus(ready=[0, 1, 2])
    _put_nodes(context, first)  # the gate is open


def test_a_refusal_closes_the_session_and_names_the_refusing_client(
    context: ServiceContext,
) -> None:
    session = _gated(context)
    context.readiness.report(Caller(session, 0), READY)
    reason = "this worker's data has no label for 50 of the aligned nodes"
    context.readiness.report(Caller(session, 1), ReadinessReport(ready=False, reason=reason))
    with context.store.transaction() as tx:
        row = tx.session(session)
    assert row is not None and row.state == SessionState.CLOSED
    for call in (
        lambda: context.readiness.check(Caller(session, 0)),
        lambda: context.readiness.report(Caller(session, 2), READY),
    ):
        with pytest.raises(SessionRefused) as refused:
            call()
        assert refused.value.client == 1 and reason in str(refused.value)


def test_a_session_without_the_gate_takes_uploads_at_once(context: ServiceContext) -> None:
    created = context.sessions.create(SessionCreate.model_validate(session_request()))
    _put_nodes(context, Caller(created.session_id, 0))


def test_a_refusal_says_why() -> None:
    with pytest.raises(ValueError, match="says why"):
        ReadinessReport(ready=False)


def test_a_scoring_session_that_shares_its_answer_plans_layer_l_plus_1() -> None:
    scoring = {"kind": "scoring", "eval_nodes": [3, 7, 9], "label_holder": 1}
    shared = SessionPlan.build("s", SessionCreate.model_validate(
        session_request(**scoring, share_predictions="label-holder")
    ))  # fmt: skip
    assert shared.answer_layer == 4 and shared.widths[4] == 4  # the top aggregation width
    assert shared.last_layer(0) == 4 and shared.gradient_layer is None
    kept = SessionPlan.build("s", SessionCreate.model_validate(session_request(**scoring)))
    assert kept.answer_layer is None and 4 not in kept.widths and kept.last_layer(0) == 3
    with pytest.raises(ValueError, match="scoring session's setting"):
        SessionCreate.model_validate(session_request(share_predictions="label-holder"))


def test_the_status_shows_who_said_ready_who_refused_and_why(context: ServiceContext) -> None:
    session = _gated(context)
    assert [r.state for r in context.sessions.status(session).readiness] == ["waiting"] * 3
    context.readiness.report(Caller(session, 0), READY)
    why = "request 3 is not signed by the answering party 0"
    context.readiness.report(Caller(session, 2), ReadinessReport(ready=False, reason=why))
    shown = context.sessions.status(session).readiness
    assert [(r.client, r.state, r.reason) for r in shown] == [
        (0, "ready", None), (1, "waiting", None), (2, "refused", why),
    ]  # fmt: skip
    assert shown[0].reported_at is not None and shown[1].reported_at is None
    ungated = context.sessions.create(SessionCreate.model_validate(session_request()))
    assert context.sessions.status(ungated.session_id).readiness is None
