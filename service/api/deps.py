"""Typed dependencies: the app context and bearer-token authentication.

Three kinds of caller: the admin (token from the settings), client m of session sid (a token
bound to that pair) and, for read-only session routes, either of them. Order of checks: no or
unknown token -> 401, unknown session -> 404, token not allowed here -> 403.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.context import ServiceContext
from service.errors import ProblemError, session_not_found
from service.rounds import ClientSlot
from service.schemas import MAX_CLIENTS
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
SessionIdPath = Annotated[str, Path(min_length=1, max_length=64, description="Session id.")]
ClientIndexPath = Annotated[
    int, Path(ge=0, lt=MAX_CLIENTS, description="Client index m (0-based).")
]


def _token_hash(credentials: HTTPAuthorizationCredentials | None) -> bytes:
    if credentials is None or not credentials.credentials:
        raise ProblemError(
            401,
            "unauthorized",
            "missing bearer token: send 'Authorization: Bearer <token>'",
            headers=UNAUTHORIZED_HEADERS,
        )
    return token_sha256(credentials.credentials)


def _invalid_token() -> ProblemError:
    return ProblemError(
        401, "unauthorized", "the bearer token is not valid", headers=UNAUTHORIZED_HEADERS
    )


def _is_admin(context: ServiceContext, token_hash: bytes) -> bool:
    return hmac.compare_digest(token_hash, context.admin_token_sha256)


def require_admin(context: ContextDep, credentials: CredentialsDep) -> None:
    token_hash = _token_hash(credentials)
    if _is_admin(context, token_hash):
        return
    with context.store.transaction() as tx:
        owner = tx.token_owner(token_hash)
    if owner is None:
        raise _invalid_token()
    raise ProblemError(403, "forbidden", "a client token cannot use admin routes")


def require_client(
    context: ContextDep, credentials: CredentialsDep, sid: SessionIdPath, m: ClientIndexPath
) -> ClientSlot:
    token_hash = _token_hash(credentials)
    if _is_admin(context, token_hash):
        raise ProblemError(
            403, "forbidden", "the admin token cannot act as a client; use that client's token"
        )
    with context.store.transaction() as tx:
        expected = tx.client_token_hash(sid, m)
        if expected is not None and hmac.compare_digest(expected, token_hash):
            return ClientSlot(session_id=sid, client_index=m)
        owner = tx.token_owner(token_hash)
        session_exists = tx.session(sid) is not None
    if owner is None:
        raise _invalid_token()
    if not session_exists:
        raise session_not_found(sid)
    if owner[0] != sid:
        raise ProblemError(403, "forbidden", "this token belongs to another session")
    raise ProblemError(
        403, "forbidden", f"this token belongs to client {owner[1]}; it cannot act as client {m}"
    )


def require_session_reader(
    context: ContextDep, credentials: CredentialsDep, sid: SessionIdPath
) -> None:
    """The admin, or any client of session ``sid``."""
    token_hash = _token_hash(credentials)
    if _is_admin(context, token_hash):
        return
    with context.store.transaction() as tx:
        owner = tx.token_owner(token_hash)
        session_exists = tx.session(sid) is not None
    if owner is None:
        raise _invalid_token()
    if not session_exists:
        raise session_not_found(sid)
    if owner[0] != sid:
        raise ProblemError(403, "forbidden", "this token belongs to another session")


AdminDep = Annotated[None, Depends(require_admin)]
ClientDep = Annotated[ClientSlot, Depends(require_client)]
SessionReaderDep = Annotated[None, Depends(require_session_reader)]
