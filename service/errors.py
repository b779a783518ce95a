"""RFC 9457 problem details: the one JSON shape the service sends for every error.

Two kinds of error become problem details: :class:`ProblemError`, raised by the HTTP layer for
what only HTTP knows (tokens, media types, body sizes), and the
:class:`service.domain_errors.DomainError` subclasses raised by the code that decides, which
:data:`DOMAIN_PROBLEMS` pairs with a status and a slug. The app's handlers render both.

:class:`ProblemError` subclasses Starlette's ``HTTPException`` on purpose: FastAPI re-raises
``HTTPException`` from body parsing untouched, so a 413 raised while a JSON body is being read
reaches our handler instead of becoming a generic 400.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from service import domain_errors as domain

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://glasu.dev/problems/"

TITLES: dict[str, str] = {
    "alignment-not-found": "Alignment not found",
    "bad-header": "Missing or malformed header",
    "bad-payload": "Invalid payload",
    "bad-request": "Malformed request",
    "clients-not-ready": "Not every client said it is ready",
    "conflict": "Slot already holds a different body",
    "encryption-unavailable": "Encryption unavailable",
    "excluded": "The pass went on without this client",
    "forbidden": "Forbidden",
    "internal-error": "Internal server error",
    "method-not-allowed": "Method not allowed",
    "metrics-refused": "Metrics refused under differential privacy",
    "not-found": "Not found",
    "not-ready": "Not ready",
    "payload-too-large": "Payload too large",
    "privacy-budget-exhausted": "Privacy budget exhausted",
    "session-closed": "Session closed",
    "session-refused": "A client refused the session at join",
    "session-not-found": "Session not found",
    "unauthorized": "Unauthorized",
    "unavailable": "Service unavailable",
    "unsupported-media-type": "Unsupported media type",
    "validation-error": "Validation error",
    "wrong-encoding": "Wrong encoding",
    "wrong-layer": "Wrong layer",
    "wrong-pass": "Wrong pass",
    "wrong-shape": "Wrong shape",
    "wrong-part": "Wrong part",
}

# Slugs for errors that Starlette/FastAPI raise themselves (unknown route, wrong method, ...).
SLUG_BY_STATUS: dict[int, str] = {
    400: "bad-payload",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    409: "conflict",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "validation-error",
}


# Every domain error class and the (status, slug) it is answered with; a subclass without an
# entry of its own takes its nearest base's.
DOMAIN_PROBLEMS: dict[type[domain.DomainError], tuple[int, str]] = {
    domain.SessionNotFound: (404, "session-not-found"),
    domain.SessionClosed: (409, "session-closed"),
    domain.SessionRefused: (409, "session-refused"),
    domain.ClientsNotReady: (409, "clients-not-ready"),
    domain.BudgetExhausted: (409, "privacy-budget-exhausted"),
    domain.MetricsRefused: (409, "metrics-refused"),
    domain.InvalidSessionRequest: (422, "validation-error"),
    domain.EncryptionUnavailable: (409, "encryption-unavailable"),
    domain.UnknownPass: (404, "wrong-pass"),
    domain.WrongPass: (409, "wrong-pass"),
    domain.WrongLayer: (404, "wrong-layer"),
    domain.NotReady: (409, "not-ready"),
    domain.Conflict: (409, "conflict"),
    domain.Excluded: (409, "excluded"),
    domain.BadHeader: (400, "bad-header"),
    domain.BadPayload: (422, "bad-payload"),
    domain.WrongShape: (422, "wrong-shape"),
    domain.WrongPart: (422, "wrong-part"),
    domain.WrongEncoding: (422, "wrong-encoding"),
    domain.AlignmentNotFound: (404, "alignment-not-found"),
    domain.AlignmentSlotForbidden: (403, "forbidden"),
    domain.AlignmentNotReady: (409, "not-ready"),
    domain.AlignmentConflict: (409, "conflict"),
}


def domain_problem(error: domain.DomainError) -> tuple[int, str]:
    """The (status, slug) of a domain error; one missing from the table is a bug (the app then
    answers a generic 500)."""
    for cls in type(error).__mro__:
        if cls in DOMAIN_PROBLEMS:
            return DOMAIN_PROBLEMS[cls]  # type: ignore[index]
    raise LookupError(f"no problem type for {type(error).__name__}")


class ProblemError(HTTPException):
    """An error with a stable slug; rendered as problem details by the app's handler."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status_code=status, detail=detail, headers=headers)
        self.slug = slug
        self.extensions = extensions or {}


def problem_response(problem: ProblemError, *, instance: str) -> JSONResponse:
    """``problem`` as problem details about ``instance`` (the request's path), with its
    headers."""
    slug = problem.slug
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": TITLES.get(slug, slug.replace("-", " ").capitalize()),
        "status": problem.status_code,
        "detail": problem.detail,
        "instance": instance,
        **problem.extensions,
    }
    return JSONResponse(
        body,
        status_code=problem.status_code,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=problem.headers,
    )
