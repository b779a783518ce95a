"""Typed dependencies: the app context and bearer-token authentication.

Three kinds of caller: the admin (token from the settings), a client of a session (a token
bound to that pair) and, for read-only session routes, either of them. Order of checks: no or
unknown token -> 401, unknown session -> 404, token not allowed here -> 403.

The path parameters keep the wire protocol's names (``{sid}``, ``{m}``, docs/protocol.md) as
aliases; the Python names say what they are.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from secure.wire.common import MAX_CLIENTS
from service.context import ServiceContext
from service.domain_errors import SessionNotFound
from service.errors import ProblemError
from service.rounds import Caller
from service.sessions import token_sha256

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="The admin token (admin routes) or a client token (client routes).",
)

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="glasu"'}


def get_context(request: Request) -> ServiceContext:
    return request.app.state.glasu  # type: ignore[no-any-return]


ContextDep = Annotated[ServiceContext, Depends(get_context)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
SessionIdPath = Annotated[
    str, Path(alias="sid", min_length=1, max_length=64, description="Session id.")
]
ClientIndexPath = Annotated[
    int, Path(alias="m", ge=0, lt=MAX_CLIENTS, description="Client index m (0-based).")
]


def token_hash_of(credentials: HTTPAuthorizationCredentials | None) -> bytes:
    """The SHA-256 of the bearer token; 401 if there is none."""
    if credentials is None or not credentials.credentials:
        raise ProblemError(
            401,
            "unauthorized",
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers=UNAUTHORIZED_HEADERS,
        )
    return token_sha256(credentials.credentials)


def invalid_token() -> ProblemError:
    return ProblemError(
        401, "unauthorized", "the bearer token is not valid", headers=UNAUTHORIZED_HEADERS
    )


def is_admin(context: ServiceContext, token_hash: bytes) -> bool:
    return hmac.compare_digest(token_hash, context.admin_token_sha256)


def require_admin(context: ContextDep, credentials: CredentialsDep) -> None:
    token_hash = token_hash_of(credentials)
    if is_admin(context, token_hash):
        return
    with context.store.transaction() as tx:
        owner = tx.token_owner(token_hash)
    if owner is None:
        raise invalid_token()
    raise ProblemError(403, "forbidden", "a client token cannot use admin routes")


def require_client(
    context: ContextDep,
    credentials: CredentialsDep,
    session_id: SessionIdPath,
    client: ClientIndexPath,
) -> Caller:
    token_hash = token_hash_of(credentials)
    if is_admin(context, token_hash):
        raise ProblemError(
            403, "forbidden", "the admin token cannot act as a client; use that client's token"
        )
    owner = _client_of_session(context, token_hash, session_id)
    if owner != client:
        raise ProblemError(
            403,
            "forbidden",
            f"this token belongs to client {owner}; it cannot act as client {client}",
        )
    return Caller(session_id=session_id, client_index=client)


def require_session_reader(
    context: ContextDep, credentials: CredentialsDep, session_id: SessionIdPath
) -> None:
    """The admin, or any client of the session."""
    token_hash = token_hash_of(credentials)
    if not is_admin(context, token_hash):
        _client_of_session(context, token_hash, session_id)


def _client_of_session(context: ServiceContext, token_hash: bytes, session_id: str) -> int:
    """The client index of a (non-admin) token of session ``session_id``: 401 for an unknown
    token, then 404 for an unknown session, then 403 for a token of another session."""
    with context.store.transaction() as tx:
        owner = tx.token_owner(token_hash)
        session_exists = tx.session(session_id) is not None
    if owner is None:
        raise invalid_token()
    if not session_exists:
        raise SessionNotFound(session_id)
    if owner[0] != session_id:
        raise ProblemError(403, "forbidden", "this token belongs to another session")
    return owner[1]


AdminDep = Annotated[None, Depends(require_admin)]
ClientDep = Annotated[Caller, Depends(require_client)]
SessionReaderDep = Annotated[None, Depends(require_session_reader)]
