"""The app factory: ``create_app(settings)`` builds one independent service instance."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.routes import health, rounds, sessions
from service.context import ServiceContext, build_context
from service.domain_errors import DomainError
from service.errors import SLUG_BY_STATUS, ProblemError, domain_problem, problem_response
from service.limits import BodySizeLimitMiddleware
from service.settings import ServiceSettings
from service.telemetry import RequestTimingMiddleware

logger = logging.getLogger("glasu.service")

DESCRIPTION = """\
Aggregation service of GLASU vertical federated GNN training. Clients exchange node sets and
(CKKS-encrypted) embedding shares at the aggregation layers; the service forms unions, adds shares
it cannot read and keeps the differential-privacy ledger. Errors are RFC 9457 problem details.
See docs/api.md (guide) and docs/protocol.md (specification).
"""


def create_app(settings: ServiceSettings) -> FastAPI:
    context = build_context(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            context.close()

    app = FastAPI(
        title="glasu aggregation service",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.glasu = context
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(rounds.router)
    _install_problem_handlers(app)
    # Added last = outermost: timing sees every response, 413s included.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimingMiddleware, telemetry=context.telemetry)
    return app


def service_context(app: FastAPI) -> ServiceContext:
    return app.state.glasu  # type: ignore[no-any-return]


def _install_problem_handlers(app: FastAPI) -> None:
    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc, ProblemError):
            slug, detail, extensions = exc.slug, exc.detail, exc.extensions
        else:
            slug = SLUG_BY_STATUS.get(exc.status_code, "error")
            detail, extensions = _framework_detail(request, exc), None
        return problem_response(
            status=exc.status_code,
            slug=slug,
            detail=detail,
            instance=request.url.path,
            headers=exc.headers,
            extensions=extensions,
        )

    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DomainError)
        status, slug = domain_problem(exc)
        return problem_response(
            status=status, slug=slug, detail=exc.detail, instance=request.url.path
        )

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors: list[dict[str, Any]] = []
        for e in exc.errors():
            error = {"loc": [str(part) for part in e["loc"]], "msg": e["msg"], "type": e["type"]}
            if error not in errors:  # a path parameter read by a dependency and the route
                errors.append(error)
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors)
        return problem_response(
            status=422,
            slug="validation-error",
            detail=detail or "invalid request",
            instance=request.url.path,
            extensions={"errors": errors},
        )

    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(
            status=500,
            slug="internal-error",
            detail="an unexpected error occurred; it has been logged",
            instance=request.url.path,
        )

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(DomainError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected_error)


def _framework_detail(request: Request, exc: StarletteHTTPException) -> str:
    if exc.status_code == 404:
        return f"no route for {request.method} {request.url.path}"
    if exc.status_code == 405:
        return f"method {request.method} is not allowed on {request.url.path}"
    return str(exc.detail)
