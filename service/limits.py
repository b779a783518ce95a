"""Request body size limit for every route: the declared Content-Length is checked before the app
runs, and the bytes actually received are counted while the body streams in (chunked uploads and
lying Content-Length headers)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ProblemError, problem_response


def _too_large(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes (GLASU_MAX_BODY_BYTES)"


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1 or (declared is not None and declared > self.limit):
            bad = declared == -1
            response = problem_response(
                status=400 if bad else 413,
                slug="bad-header" if bad else "payload-too-large",
                detail="Content-Length is not a non-negative integer"
                if bad
                else _too_large(self.limit),
                instance=scope.get("path", ""),
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return

        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # Raised inside the route's body read; ProblemError is an HTTPException, which
                    # FastAPI passes through to the problem-details handler.
                    raise ProblemError(413, "payload-too-large", _too_large(self.limit))
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared length, None if absent, -1 if garbled."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None
