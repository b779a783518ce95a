"""RFC 9457 problem details: the one error type the service raises and the one JSON shape it sends.

:class:`ProblemError` subclasses Starlette's ``HTTPException`` on purpose: FastAPI re-raises
``HTTPException`` from body parsing untouched, so a 413 raised while a JSON body is being read
reaches our handler instead of becoming a generic 400.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://glasu.dev/problems/"

TITLES: dict[str, str] = {
    "bad-header": "Missing or malformed header",
    "bad-payload": "Invalid payload",
    "conflict": "Slot already holds a different body",
    "encryption-unavailable": "Encryption unavailable",
    "forbidden": "Forbidden",
    "internal-error": "Internal server error",
    "method-not-allowed": "Method not allowed",
    "not-found": "Not found",
    "not-ready": "Not ready",
    "payload-too-large": "Payload too large",
    "privacy-budget-exhausted": "Privacy budget exhausted",
    "privacy-unavailable": "Privacy accounting unavailable",
    "session-closed": "Session closed",
    "session-not-found": "Session not found",
    "unauthorized": "Unauthorized",
    "unavailable": "Service unavailable",
    "unsupported-media-type": "Unsupported media type",
    "validation-error": "Validation error",
    "wrong-encoding": "Wrong encoding",
    "wrong-layer": "Wrong layer",
    "wrong-pass": "Wrong pass",
    "wrong-shape": "Wrong shape",
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


def problem_body(
    *,
    status: int,
    slug: str,
    detail: str,
    instance: str,
    extensions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": TITLES.get(slug, slug.replace("-", " ").capitalize()),
        "status": status,
        "detail": detail,
        "instance": instance,
    }
    if extensions:
        body.update(extensions)
    return body


def problem_response(
    *,
    status: int,
    slug: str,
    detail: str,
    instance: str,
    headers: dict[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
) -> JSONResponse:
    return JSONResponse(
        problem_body(
            status=status, slug=slug, detail=detail, instance=instance, extensions=extensions
        ),
        status_code=status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


# Constructors for the errors raised in more than one place, so status and slug stay paired.


def session_not_found(session_id: str) -> ProblemError:
    return ProblemError(404, "session-not-found", f"no session with id {session_id!r}")


def session_closed(session_id: str) -> ProblemError:
    return ProblemError(409, "session-closed", f"session {session_id!r} has been closed")


def budget_exhausted(session_id: str, pass_index: int) -> ProblemError:
    return ProblemError(
        409,
        "privacy-budget-exhausted",
        f"session {session_id!r}: the release of pass {pass_index} would exceed the session's"
        " privacy budget; the session stops here (see GET /v1/sessions/{sid}/privacy)",
    )
