"""Admin routes: create, list, read and close sessions; read their privacy report."""

from __future__ import annotations

from fastapi import APIRouter, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import AdminDep, ContextDep, SessionIdPath, SessionReaderDep
from service.api.routes.docs import PROBLEM_RESPONSES
from service.schemas import (
    PrivacyReport,
    SessionCreate,
    SessionCreated,
    SessionStatus,
    SessionSummary,
)

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=PROBLEM_RESPONSES)


@router.post("", status_code=201, response_model=SessionCreated, summary="Create a session")
def create_session(
    _: AdminDep, context: ContextDep, request: SessionCreate, response: Response
) -> SessionCreated:
    """Admin only. Returns the client tokens once: the service keeps only their hashes."""
    created = context.sessions.create(request)
    response.headers["Location"] = f"/v1/sessions/{created.session_id}"
    return created


@router.get("", response_model=list[SessionSummary], summary="List sessions")
def list_sessions(_: AdminDep, context: ContextDep) -> list[SessionSummary]:
    return context.sessions.list()


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


@router.delete("/{sid}", response_model=SessionSummary, summary="Close a session")
async def close_session(
    _: AdminDep, context: ContextDep, session_id: SessionIdPath
) -> SessionSummary:
    """Admin only. Idempotent. Later client calls get 409 session-closed; payloads are dropped."""
    summary = await run_in_threadpool(context.sessions.close, session_id)
    context.notifier.notify(session_id)
    return summary
