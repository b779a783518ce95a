"""Online scoring sessions in the service (service/online.py, service/api/deps.py), without
HTTP: each request opens the next request session, one evaluation pass over the asked nodes with
the online session's settings; nodes the online session does not cover are refused by number
and nothing is opened; only the answering party's token asks, and the online session's tokens
act in its request sessions only. A request's pass samples the asked nodes' neighbourhoods
(node sets exchanged, rows grow with the nodes asked), and a worker waits for the next request
in a long poll that its opening wakes. A request of a kept private sign model's online session
(``model_kind`` 'release') is planned as its batch scoring: one pass over the asked nodes' kept
rows, no node sets, no release."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from fastapi.security import HTTPAuthorizationCredentials
from service_testkit import PRIVATE_AGG_LAYERS, session_request

from secure.wire.request_signature import RequestSignature, nodes_sha256
from secure.wire.sessions import SessionCreate, online_session_of, request_session_id
from secure.wire.status import SessionStatus
from service.api.deps import SESSION_CLIENTS, require_asker
from service.api.polling import poll
from service.clock import ManualClock
from service.context import ServiceContext, build_context
from service.domain_errors import InvalidSessionRequest, NotReady, SessionClosed, WrongLayer
from service.errors import ProblemError
from service.notify import Pending
from service.plan import SessionPlan
from service.rounds.gate import open_layer
from service.rounds.slots import layer_rows
from service.rounds.sums import _is_release
from service.settings import ServiceSettings
from service.tokens import token_sha256

SCORING = {"kind": "scoring", "model_session": "trained", "label_holder": 1, "ready_gate": True}


@pytest.fixture
def context(make_settings: Callable[..., ServiceSettings]) -> Iterator[ServiceContext]:
    built = build_context(make_settings(score_foreign_models=True))
    yield built
    built.close()


def _online(context: ServiceContext, **overrides: object) -> tuple[str, list[str]]:
    created = context.sessions.create(
        SessionCreate.model_validate(session_request(**SCORING, online=True, **overrides))
    )
    return created.session_id, created.client_tokens


def _bearer(token: str) -> HTTPAuthorizationCredentials:
    return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token)


def test_each_request_opens_the_next_request_session_over_the_asked_nodes(
    context: ServiceContext,
) -> None:
    online, _ = _online(context)
    plans = []
    for number, nodes in enumerate(([44, 41], [59], [41, 42, 43]), start=1):
        opened = context.sessions.open_request(online, np.array(nodes))
        assert opened.request == number
        assert opened.session_id == request_session_id(online, number)
        assert online_session_of(opened.session_id) == online
        with context.store.transaction() as tx:
            _, plan = context.engine.session(tx, opened.session_id)
        plans.append(plan)
        assert plan.passes_total == 1 and plan.passes[0].kind == "eval"
        assert plan.output_nodes(0).tolist() == sorted(nodes)
    for plan in plans:  # a batch scoring session of the online one's settings, not online
        assert not plan.config.online and plan.config.ready_gate
        assert plan.config.model_session == "trained" and plan.config.label_holder == 1
    assert online_session_of(online) is None


def test_nodes_the_online_session_does_not_cover_are_refused_by_number(
    context: ServiceContext,
) -> None:
    online, _ = _online(context)
    with pytest.raises(InvalidSessionRequest, match=r"not scored: 3, 39$"):
        context.sessions.open_request(online, np.array([45, 3, 39]))
    opened = context.sessions.open_request(online, np.array([45]))
    assert opened.request == 1  # nothing was opened by the refused request


def test_only_an_open_online_session_takes_requests(context: ServiceContext) -> None:
    batch = context.sessions.create(SessionCreate.model_validate(session_request(**SCORING)))
    with pytest.raises(InvalidSessionRequest, match="not an online scoring session"):
        context.sessions.open_request(batch.session_id, np.array([45]))
    online, _ = _online(context)
    context.sessions.close(online)
    with pytest.raises(SessionClosed):
        context.sessions.open_request(online, np.array([45]))
    with pytest.raises(ValueError, match="online is a scoring session's setting"):
        SessionCreate.model_validate(session_request(online=True))


def test_online_tokens_act_in_their_request_sessions_and_only_the_answerer_asks(
    context: ServiceContext,
) -> None:
    online, tokens = _online(context)
    other, _ = _online(context)
    request = context.sessions.open_request(online, np.array([45])).session_id
    elsewhere = context.sessions.open_request(other, np.array([45])).session_id
    for m, token in enumerate(tokens):
        assert SESSION_CLIENTS.index_of(context, token_sha256(token), request) == m
        with pytest.raises(ProblemError) as forbidden:
            SESSION_CLIENTS.index_of(context, token_sha256(token), elsewhere)
        assert forbidden.value.status_code == 403
    require_asker(context, _bearer(tokens[1]), online)  # the label holder answers
    for token in (tokens[0], tokens[2]):
        with pytest.raises(ProblemError, match="only the answering party"):
            require_asker(context, _bearer(token), online)


def test_the_answering_party_s_signature_is_kept_with_its_request_and_shown_to_workers(
    context: ServiceContext,
) -> None:
    online, _ = _online(context)
    signature = RequestSignature(
        party=1, nonce="ab" * 16, nodes_sha256=nodes_sha256(np.array([44, 41])),
        signed_at=1.5e9, signature="cd" * 64,
    )  # fmt: skip
    signed = context.sessions.open_request(online, np.array([41, 44]), signature).session_id
    unsigned = context.sessions.open_request(online, np.array([41])).session_id
    assert context.sessions.status(signed).config.request_signature == signature
    assert context.sessions.status(unsigned).config.request_signature is None
    with pytest.raises(ValueError, match="request_signature is a request session's setting"):
        SessionCreate.model_validate(
            session_request(request_signature=signature.model_dump(mode="json"))
        )


def test_a_request_pass_samples_the_asked_nodes_the_online_session_does_not(
    context: ServiceContext,
) -> None:
    """A request session's pass takes node sets below the top and its rows are the asked nodes
    and their union, as a training pass's; the online session and a batch scoring session
    over all nodes refuse node sets (every row is an aligned node)."""
    online, _ = _online(context)
    request = context.sessions.open_request(online, np.array([44, 41])).session_id
    batch = context.sessions.create(SessionCreate.model_validate(session_request(**SCORING)))
    with context.store.transaction() as tx:
        _, plan = open_layer(tx, context.engine.plans, request, 0, 1, "nodes")
        assert plan.samples(0) and plan.config.scoring_pass == "sampled"
        assert layer_rows(tx, plan, 0, plan.top_layer) == 2  # the asked nodes, not num_nodes
        with pytest.raises(NotReady):  # below the top: the union of the node sets
            layer_rows(tx, plan, 0, 1)
        for session_id in (online, batch.session_id):
            with pytest.raises(WrongLayer, match="exchanges no node sets"):
                open_layer(tx, context.engine.plans, session_id, 0, 1, "nodes")
            _, all_nodes = context.engine.session(tx, session_id)
            assert layer_rows(tx, all_nodes, 0, 1) == all_nodes.config.num_nodes
    with pytest.raises(ValueError, match="scoring_pass is a scoring session's setting"):
        SessionCreate.model_validate(session_request(scoring_pass="sampled"))


def test_the_next_request_is_waited_for_until_opened_and_refused_once_closed(
    context: ServiceContext,
) -> None:
    online, _ = _online(context)
    assert context.sessions.next_request(online, 1) == Pending(missing=[1])  # the asker's
    opened = context.sessions.open_request(online, np.array([45]))
    status = context.sessions.next_request(online, 1)
    assert isinstance(status, SessionStatus) and status.session_id == opened.session_id
    assert status.config.scoring_pass == "sampled" and status.config.eval_nodes_count == 1
    context.sessions.close(online)
    assert isinstance(context.sessions.next_request(online, 1), SessionStatus)  # opened before
    with pytest.raises(SessionClosed):
        context.sessions.next_request(online, 2)


@pytest.mark.anyio
async def test_a_worker_waiting_for_the_next_request_is_woken_by_its_opening(
    make_settings: Callable[..., ServiceSettings],
) -> None:
    """The long poll behind ``GET /v1/sessions/{id}/requests/{n}``: on a clock that never
    moves, only the request's opening (and its notification) can end the wait."""
    context = build_context(make_settings(score_foreign_models=True), clock=ManualClock())
    try:
        online, _ = _online(context)
        waiting = asyncio.ensure_future(
            poll(context, online, lambda: context.sessions.next_request(online, 1), wait=60)
        )
        await asyncio.sleep(0)  # let it check once and wait
        assert not waiting.done()
        await asyncio.to_thread(context.sessions.open_request, online, np.array([45]))
        context.notifier.notify(online)  # as the asking route does
        status = await waiting
        assert isinstance(status, SessionStatus)
        assert status.session_id == request_session_id(online, 1)
    finally:
        context.close()


KEPT_RELEASE = {
    "model_kind": "release", "agg_layers": PRIVATE_AGG_LAYERS,
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-5, "clip": 1.0},
}  # fmt: skip


def test_a_request_of_a_kept_private_sign_model_is_one_pass_over_the_asked_rows_no_release(
    context: ServiceContext,
) -> None:
    """The online session of a release session's models (model_kind 'release') takes
    requests; each request session is planned as the batch scoring of those models: no
    release (epsilon 0 planned and stated), one pass whose every share holds the asked nodes'
    rows, no node sets; the same after a reload from the store."""
    online, _ = _online(context, **KEPT_RELEASE)
    request = context.sessions.open_request(online, np.array([44, 41, 59])).session_id
    with context.store.transaction() as tx:
        _, plan = context.engine.session(tx, request)
        assert plan.config.model_kind == "release" and plan.post_processing
        assert plan.config.scoring_pass == "all-nodes" and not plan.samples(0)
        assert plan.passes_total == 1 and plan.output_nodes(0).tolist() == [41, 44, 59]
        assert layer_rows(tx, plan, 0, plan.first_agg_layer) == 3  # the asked rows, not N
        with pytest.raises(WrongLayer, match="exchanges no node sets"):
            open_layer(tx, context.engine.plans, request, 0, 1, "nodes")
    assert plan.privacy is not None and plan.privacy.planned_releases == 0
    assert not _is_release(plan, plan.first_agg_layer)  # its sum appends no ledger row
    report = plan.privacy.report(releases=0)
    assert (report["epsilon"], report["epsilon_planned"]) == (0.0, 0.0)
    reloaded = SessionPlan.from_json(request, plan.to_json())  # the validator takes it back
    assert reloaded.post_processing and reloaded.config.scoring_pass == "all-nodes"
    # a training session's models: the request samples and releases, as before
    trained, _ = _online(context, **{**KEPT_RELEASE, "model_kind": "training"})
    opened = context.sessions.open_request(trained, np.array([44])).session_id
    with context.store.transaction() as tx:
        _, sampled = context.engine.session(tx, opened)
    assert sampled.config.scoring_pass == "sampled" and not sampled.post_processing
    assert sampled.privacy is not None and sampled.privacy.planned_releases == 1
