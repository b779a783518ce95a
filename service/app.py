"""The app factory: ``create_app(settings)`` builds one independent service instance."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path

from service.api.body import media_type
from service.api.routes import alignment, health, rounds, sessions
from service.api.routes.docs import mark_required_headers
from service.clock import Clock
from service.context import ServiceContext, build_context
from service.domain_errors import DomainError
from service.errors import SLUG_BY_STATUS, ProblemError, domain_problem, problem_response
from service.limits import BodySizeLimitMiddleware
from service.settings import ServiceSettings
from service.telemetry import RequestTimingMiddleware

logger = logging.getLogger("glasu.service")

#: nginx's "client closed request": never sent (the client is gone), but logged and counted.
CLIENT_CLOSED_REQUEST = 499

DESCRIPTION = """\
Aggregation service of GLASU vertical federated GNN training. Clients exchange node sets and
(CKKS-encrypted) embedding shares at the aggregation layers; the service forms unions, adds shares
it cannot read and keeps the differential-privacy ledger. Errors are RFC 9457 problem details.
See docs/api.md (guide) and docs/protocol.md (specification).
"""


def create_app(settings: ServiceSettings, *, clock: Clock | None = None) -> FastAPI:
    """``clock``: the system's by default (see :mod:`service.clock`)."""
    context = build_context(settings, clock)

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
    app.include_router(alignment.router)
    _install_problem_handlers(app)
    _install_openapi(app)
    # Added last = outermost: timing sees every response, 413s included.
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(RequestTimingMiddleware, telemetry=context.telemetry)
    return app


def service_context(app: FastAPI) -> ServiceContext:
    return app.state.glasu  # type: ignore[no-any-return]


def _install_openapi(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = mark_required_headers(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _install_problem_handlers(app: FastAPI) -> None:
    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc, ProblemError):
            problem = exc
        else:
            slug = SLUG_BY_STATUS.get(exc.status_code, "error")
            detail = _framework_detail(request, exc)
            problem = ProblemError(exc.status_code, slug, detail, headers=exc.headers)
        if problem.status_code == 405:  # Starlette names only the first matching route's methods
            allowed = ", ".join(_allowed_methods(app, request))
            problem.headers = {**(problem.headers or {}), "Allow": allowed}
        return problem_response(problem, instance=request.url.path)

    async def on_client_disconnect(request: Request, exc: Exception) -> Response:
        # The client went away mid-body: its error, not ours. Logged, counted as 499.
        logger.info("client disconnected during %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def on_domain_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DomainError)
        status, slug = domain_problem(exc)
        return problem_response(ProblemError(status, slug, exc.detail), instance=request.url.path)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if _json_body_with_wrong_media_type(request, exc):
            sent_as = request.headers.get("content-type") or "no Content-Type"
            unsupported = ProblemError(
                415,
                "unsupported-media-type",
                f"this route takes a JSON body (Content-Type: application/json), not {sent_as}",
            )
            return problem_response(unsupported, instance=request.url.path)
        errors: list[dict[str, Any]] = []
        for e in exc.errors():
            message = e["msg"]
            if e["type"] == "json_invalid":  # loc is ("body", character offset)
                reason = (e.get("ctx") or {}).get("error", "malformed")
                message = f"the body is not valid JSON ({reason} at character {e['loc'][-1]})"
            error = {"loc": [str(part) for part in e["loc"]], "msg": message, "type": e["type"]}
            if error not in errors:  # a path parameter read by a dependency and the route
                errors.append(error)
        detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors)
        invalid = ProblemError(
            422, "validation-error", detail or "invalid request", extensions={"errors": errors}
        )
        return problem_response(invalid, instance=request.url.path)

    async def on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        unexpected = ProblemError(
            500, "internal-error", "an unexpected error occurred; it has been logged"
        )
        return problem_response(unexpected, instance=request.url.path)

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
    app.add_exception_handler(DomainError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected_error)


def _allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method the API accepts at this path, from the OpenAPI schema (its one public map
    of paths to methods)."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        pattern, _, _ = compile_path(template)
        if pattern.match(request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


def _json_body_with_wrong_media_type(request: Request, exc: RequestValidationError) -> bool:
    """A JSON route whose body failed to parse because it was not sent as JSON."""
    sent_as = media_type(request)
    if sent_as == "application/json" or sent_as.endswith("+json"):
        return False
    return any(e["loc"] and e["loc"][0] == "body" for e in exc.errors())


def _framework_detail(request: Request, exc: StarletteHTTPException) -> str:
    if exc.status_code == 404:
        return f"no route for {request.method} {request.url.path}"
    if exc.status_code == 405:
        return f"method {request.method} is not allowed on {request.url.path}"
    return str(exc.detail)
