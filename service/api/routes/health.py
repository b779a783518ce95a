"""Unauthenticated routes: liveness and Prometheus metrics."""

from __future__ import annotations

import sqlite3

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from secure.wire.common import Health
from service.api.deps import ContextDep
from service.errors import ProblemError

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness and database check")
def healthz(context: ContextDep) -> Health:
    try:
        context.store.ping()
    except sqlite3.Error as exc:
        raise ProblemError(503, "unavailable", f"database unavailable: {exc}") from exc
    return Health(
        status="ok",
        encryption=context.aggregators.context is not None,
        max_body_bytes=context.settings.max_body_bytes,
    )


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
def metrics(context: ContextDep) -> Response:
    return Response(context.telemetry.render(), media_type=CONTENT_TYPE_LATEST)
