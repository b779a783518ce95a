"""Admin routes: create, list, read and close sessions; read their privacy report. The answering
party's route of an online scoring session: ask it for predictions."""

from __future__ import annotations

from functools import partial
from typing import Annotated
from urllib.parse import urlencode

from fastapi import Path, Query, Response
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from secure.wire.common import MAX_COUNT
from secure.wire.sessions import (
    ScoringRequest,
    ScoringRequestOpened,
    SessionCreate,
    SessionCreated,
    SessionSummary,
)
from secure.wire.status import PrivacyReport, SessionStatus
from service.api.body import api_router, takes_large_json
from service.api.deps import AdminDep, AskerDep, ContextDep, SessionIdPath, SessionReaderDep
from service.api.polling import WaitQuery, long_poll_responses, poll_or_waiting

router = api_router("/v1/sessions", "sessions")

DEFAULT_PAGE = 100
MAX_PAGE = 1000


class PageQuery(BaseModel):
    """The page of a listing; any other query parameter is refused (422)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(
        DEFAULT_PAGE, ge=1, le=MAX_PAGE, description=f"Sessions per page (1..{MAX_PAGE})."
    )
    after: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="The id of the last session of the previous page (the next page's link).",
    )


NEXT_PAGE_HEADER = {
    "description": 'While more sessions follow: `</v1/sessions?limit=..&after=..>; rel="next"`.',
    "schema": {"type": "string"},
}


@router.post("", status_code=201, response_model=SessionCreated, summary="Create a session")
@takes_large_json
def create_session(
    _: AdminDep, context: ContextDep, request: SessionCreate, response: Response
) -> SessionCreated:
    """Admin only. Returns the client tokens once: the service keeps only their hashes."""
    created = context.sessions.create(request)
    response.headers["Location"] = f"/v1/sessions/{created.session_id}"
    return created


@router.get(
    "",
    response_model=list[SessionSummary],
    responses={200: {"headers": {"Link": NEXT_PAGE_HEADER}}},
    summary="List sessions",
)
def list_sessions(
    _: AdminDep, context: ContextDep, response: Response, query: Annotated[PageQuery, Query()]
) -> list[SessionSummary]:
    """Oldest first, one page at a time: while more sessions follow, the `Link` header names
    the next page (`rel="next"`: the same limit, after the last session of this one)."""
    page, more = context.sessions.list(limit=query.limit, after=query.after)
    if more:
        next_page = urlencode({"limit": query.limit, "after": page[-1].session_id})
        response.headers["Link"] = f'</v1/sessions?{next_page}>; rel="next"'
    return page


@router.post(
    "/{sid}/requests",
    status_code=201,
    response_model=ScoringRequestOpened,
    summary="Ask an online scoring session for predictions",
)
@takes_large_json
def open_scoring_request(
    _: AskerDep,
    context: ContextDep,
    session_id: SessionIdPath,
    request: ScoringRequest,
    response: Response,
) -> ScoringRequestOpened:
    """The answering party's token only. Opens one scoring session over `nodes` (a request
    session, one evaluation pass: one release in every owner's ledger), which the online
    session's workers run; its answer is the answering party's worker's. The answering party's
    `signature` of the request is kept with it and shown in its configuration, for the workers
    to check at join. 422 for a node the online session does not cover (named), 409 once the
    online session is closed."""
    opened = context.sessions.open_request(session_id, request.nodes, request.signature)
    context.notifier.notify_threadsafe(session_id)  # the workers waiting for it
    response.headers["Location"] = f"/v1/sessions/{opened.session_id}"
    return opened


RequestPath = Annotated[int, Path(alias="n", ge=1, le=MAX_COUNT, description="Request number.")]
REQUEST_WAITS = long_poll_responses(
    waiting="Not opened yet (owed by the answering party).",
    refused="`session-closed`: the online session takes no more requests.",
)


@router.get("/{sid}/requests/{n}", response_model=SessionStatus, responses=REQUEST_WAITS,
            summary="Wait for an online session's request n (long poll)")  # fmt: skip
async def get_scoring_request(
    _: SessionReaderDep, context: ContextDep, session_id: SessionIdPath, number: RequestPath,
    wait: WaitQuery = None,
) -> SessionStatus | JSONResponse:  # fmt: skip
    """The admin or any client of the online session: the status of its request session n
    (`<sid>-<n>`) once it is opened, woken by its opening; 202 until then. An online worker
    waits here for the next request instead of polling."""
    check = partial(context.sessions.next_request, session_id, number)
    return await poll_or_waiting(context, session_id, check, wait)


@router.get("/{sid}", response_model=SessionStatus, summary="Session status and progress")
def get_session(
    _: SessionReaderDep, context: ContextDep, session_id: SessionIdPath
) -> SessionStatus:
    """The admin or any client of the session."""
    return context.sessions.status(session_id)


@router.get("/{sid}/privacy", response_model=PrivacyReport, summary="Privacy budget and ledger")
def get_privacy(
    _: SessionReaderDep, context: ContextDep, session_id: SessionIdPath
) -> PrivacyReport:
    """The admin or any client of the session."""
    return context.sessions.privacy_report(session_id)


@router.get(
    "/{sid}/report",
    response_class=HTMLResponse,
    summary="The session's privacy report, for people (HTML)",
)
def get_report(_: SessionReaderDep, context: ContextDep, session_id: SessionIdPath) -> HTMLResponse:
    """The admin or any client of the session: a read-only page with who, when, what was
    released, epsilon against each adversary in plain words, the target and what is not
    protected (the sections of `glasu report`, from the service's own ledger; not signed)."""
    page = context.sessions.report_page(session_id, now=context.clock.now())
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


@router.delete("/{sid}", response_model=SessionSummary, summary="Close a session")
async def close_session(
    _: AdminDep, context: ContextDep, session_id: SessionIdPath
) -> SessionSummary:
    """Admin only. Idempotent. Later client calls get 409 session-closed; payloads are dropped."""
    summary = await run_in_threadpool(context.sessions.close, session_id)
    context.notifier.notify(session_id)
    return summary
