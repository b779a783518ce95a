"""Online scoring sessions in the service (service/online.py, service/api/deps.py), without
HTTP: each request opens the next request session, one evaluation pass over the asked nodes with
the online session's settings; nodes the online session does not cover are refused by number
and nothing is opened; only the answering party's token asks, and the online session's tokens
act in its request sessions only."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from fastapi.security import HTTPAuthorizationCredentials
from service_testkit import session_request

from secure.wire.request_signature import RequestSignature, nodes_sha256
from secure.wire.sessions import SessionCreate, online_session_of, request_session_id
from service.api.deps import SESSION_CLIENTS, require_asker
from service.context import ServiceContext, build_context
from service.domain_errors import InvalidSessionRequest, SessionClosed
from service.errors import ProblemError
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
