"""Typed dependencies: the app context and bearer-token authentication, for every route.

Three kinds of caller: the admin (token from the settings); a member of a session or an
alignment (a client token bound to one session and client index, a party token bound to one
alignment and party index); and, for the read-only routes of a session or an alignment, either.
Order of checks: no or unknown token -> 401, unknown session or alignment -> 404, token not
allowed here -> 403. Tokens are compared by their SHA-256 (:mod:`service.tokens`).

The path parameters keep the wire protocol's names (``{sid}``, ``{aid}``, ``{m}``,
docs/protocol.md) as aliases; the Python names say what they are.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from secure.wire.common import MAX_CLIENTS
from secure.wire.headers import AUTHORIZATION_HEADER
from secure.wire.sessions import online_session_of
from service.alignment import AlignmentManager
from service.alignment.manager import PartyCaller
from service.context import ServiceContext
from service.domain_errors import AlignmentNotFound, DomainError, SessionNotFound
from service.errors import ProblemError
from service.rounds import Caller
from service.tokens import token_sha256

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="The admin token (admin routes) or a client token (client routes).",
)

UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="glasu"'}


def get_context(request: Request) -> ServiceContext:
    return request.app.state.glasu  # type: ignore[no-any-return]


def get_alignments(context: Annotated[ServiceContext, Depends(get_context)]) -> AlignmentManager:
    return context.alignments


ContextDep = Annotated[ServiceContext, Depends(get_context)]
AlignmentsDep = Annotated[AlignmentManager, Depends(get_alignments)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
SessionIdPath = Annotated[
    str, Path(alias="sid", min_length=1, max_length=64, description="Session id.")
]
ClientIndexPath = Annotated[
    int, Path(alias="m", ge=0, lt=MAX_CLIENTS, description="Client index m (0-based).")
]
AlignmentIdPath = Annotated[
    str, Path(alias="aid", min_length=1, max_length=64, description="Alignment id.")
]
PartyPath = Annotated[
    int, Path(alias="m", ge=0, lt=MAX_CLIENTS, description="Party index m (0-based).")
]


def token_hash_of(credentials: HTTPAuthorizationCredentials | None) -> bytes:
    """The SHA-256 of the bearer token; 401 if there is none."""
    if credentials is None or not credentials.credentials:
        raise ProblemError(
            401,
            "unauthorized",
            f"missing bearer token: send '{AUTHORIZATION_HEADER}: Bearer <token>'",
            headers=UNAUTHORIZED_HEADERS,
        )
    return token_sha256(credentials.credentials)


def invalid_token() -> ProblemError:
    return ProblemError(
        401, "unauthorized", "the bearer token is not valid", headers=UNAUTHORIZED_HEADERS
    )


def is_admin(context: ServiceContext, token_hash: bytes) -> bool:
    return hmac.compare_digest(token_hash, context.admin_token_sha256)


@dataclass(frozen=True)
class Membership:
    """Tokens bound to one member of a group: a client of a session, a party of an alignment."""

    group: str  # what the path's id names: "session", "alignment"
    member: str  # what the path's index names: "client", "party"
    owner_of: Callable[[ServiceContext, bytes], tuple[str, int] | None]  # token -> (id, index)
    exists: Callable[[ServiceContext, str], bool]
    not_found: Callable[[str], DomainError]
    # the group whose member tokens also act in ``group_id`` (an online session's, in its
    # request sessions: service/online.py), or None
    parent_of: Callable[[str], str | None] = lambda _: None

    def index_of(self, context: ServiceContext, token_hash: bytes, group_id: str) -> int:
        """The member index of a (non-admin) token of group ``group_id``: 401 for an unknown
        token, then 404 for an unknown group, then 403 for a token of another group."""
        owner = self.owner_of(context, token_hash)
        if owner is None:
            raise invalid_token()
        if not self.exists(context, group_id):
            raise self.not_found(group_id)
        if owner[0] != group_id and owner[0] != self.parent_of(group_id):
            raise ProblemError(403, "forbidden", f"this token belongs to another {self.group}")
        return owner[1]

    def require(
        self,
        context: ServiceContext,
        credentials: HTTPAuthorizationCredentials | None,
        group_id: str,
        index: int,
    ) -> None:
        """Only the token of member ``index`` of ``group_id``."""
        token_hash = token_hash_of(credentials)
        if is_admin(context, token_hash):
            if not self.exists(context, group_id):  # 404 before 403, as for any known token
                raise self.not_found(group_id)
            raise ProblemError(
                403,
                "forbidden",
                f"the admin token cannot act as a {self.member}; use that {self.member}'s token",
            )
        owner = self.index_of(context, token_hash, group_id)
        if owner != index:
            raise ProblemError(
                403,
                "forbidden",
                f"this token belongs to {self.member} {owner}; it cannot act as {self.member}"
                f" {index}",
            )

    def require_reader(
        self,
        context: ServiceContext,
        credentials: HTTPAuthorizationCredentials | None,
        group_id: str,
    ) -> None:
        """The admin, or any member of ``group_id``."""
        token_hash = token_hash_of(credentials)
        if not is_admin(context, token_hash):
            self.index_of(context, token_hash, group_id)

    def holds(self, context: ServiceContext, token_hash: bytes) -> bool:
        """Whether the token is one of this kind (of any group)."""
        return self.owner_of(context, token_hash) is not None


SESSION_CLIENTS = Membership(
    group="session",
    member="client",
    owner_of=lambda context, token_hash: context.sessions.client_of_token(token_hash),
    exists=lambda context, session_id: context.sessions.exists(session_id),
    not_found=SessionNotFound,
    parent_of=online_session_of,
)
ALIGNMENT_PARTIES = Membership(
    group="alignment",
    member="party",
    owner_of=lambda context, token_hash: context.alignments.party_of_token(token_hash),
    exists=lambda context, alignment_id: context.alignments.exists(alignment_id),
    not_found=AlignmentNotFound,
)


def _require_admin(
    context: ServiceContext,
    credentials: HTTPAuthorizationCredentials | None,
    refused: tuple[Membership, ...],
    refusal: str,
) -> None:
    """The admin token only: 403 ``refusal`` for a token of the kinds ``refused``, else 401."""
    token_hash = token_hash_of(credentials)
    if is_admin(context, token_hash):
        return
    if any(kind.holds(context, token_hash) for kind in refused):
        raise ProblemError(403, "forbidden", refusal)
    raise invalid_token()


def require_admin(context: ContextDep, credentials: CredentialsDep) -> None:
    _require_admin(
        context, credentials, (SESSION_CLIENTS,), "a client token cannot use admin routes"
    )


def require_client(
    context: ContextDep,
    credentials: CredentialsDep,
    session_id: SessionIdPath,
    client: ClientIndexPath,
) -> Caller:
    SESSION_CLIENTS.require(context, credentials, session_id, client)
    return Caller(session_id=session_id, client_index=client)


def require_session_reader(
    context: ContextDep, credentials: CredentialsDep, session_id: SessionIdPath
) -> None:
    """The admin, or any client of the session."""
    SESSION_CLIENTS.require_reader(context, credentials, session_id)


def require_asker(
    context: ContextDep, credentials: CredentialsDep, session_id: SessionIdPath
) -> None:
    """Only the answering party's token of an online session (``service/online.py``): the
    party whose head's prediction is the model's asks for predictions."""
    token_hash = token_hash_of(credentials)
    if is_admin(context, token_hash):
        raise ProblemError(
            403, "forbidden", "the admin token cannot ask for predictions: the answering party's"
        )
    index = SESSION_CLIENTS.index_of(context, token_hash, session_id)
    asker = context.sessions.answering_client(session_id)
    if index != asker:
        raise ProblemError(
            403,
            "forbidden",
            f"only the answering party (client {asker}) asks this session for predictions; "
            f"this token is client {index}'s",
        )


def require_alignment_admin(context: ContextDep, credentials: CredentialsDep) -> None:
    _require_admin(
        context,
        credentials,
        (SESSION_CLIENTS, ALIGNMENT_PARTIES),
        "only the admin token creates alignments",
    )


def require_party(
    context: ContextDep,
    credentials: CredentialsDep,
    alignment_id: AlignmentIdPath,
    party: PartyPath,
) -> PartyCaller:
    ALIGNMENT_PARTIES.require(context, credentials, alignment_id, party)
    return PartyCaller(alignment_id=alignment_id, party=party)


def require_alignment_reader(
    context: ContextDep, credentials: CredentialsDep, alignment_id: AlignmentIdPath
) -> None:
    """The admin, or any party of the alignment."""
    ALIGNMENT_PARTIES.require_reader(context, credentials, alignment_id)


AdminDep = Annotated[None, Depends(require_admin)]
ClientDep = Annotated[Caller, Depends(require_client)]
SessionReaderDep = Annotated[None, Depends(require_session_reader)]
AskerDep = Annotated[None, Depends(require_asker)]
AlignmentAdminDep = Annotated[None, Depends(require_alignment_admin)]
PartyDep = Annotated[PartyCaller, Depends(require_party)]
AlignmentReaderDep = Annotated[None, Depends(require_alignment_reader)]
