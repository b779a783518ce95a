"""Request body limits.

- :class:`BodySizeLimitMiddleware`, for every route: the declared Content-Length is checked
  before the app runs, and the bytes actually received are counted while the body streams in
  (chunked uploads and lying Content-Length headers). A response that starts before the body
  has been received (a 401 before any byte is read, a 413, a 503) closes the connection, so
  the rest of the body is never read either.
- :class:`ByteBudget`: the bytes of large bodies held at once across requests.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ProblemError, problem_response

#: Bodies up to this size (node sets of small graphs, JSON control messages) are not counted
#: against the byte budget: they cannot exhaust memory, and must not wait behind large ones.
SMALL_BODY_BYTES = 64 * 1024
MAX_BODY_SETTING = "GLASU_MAX_BODY_BYTES"


def too_large(limit: int, setting: str = MAX_BODY_SETTING) -> str:
    return f"request body exceeds the limit of {limit} bytes ({setting})"


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared == -1 or (declared is not None and declared > self.limit):
            bad = declared == -1
            response = problem_response(
                status=400 if bad else 413,
                slug="bad-header" if bad else "payload-too-large",
                detail="Content-Length is not a non-negative integer"
                if bad
                else too_large(self.limit),
                instance=scope.get("path", ""),
                headers={"Connection": "close"},
            )
            await response(scope, receive, send)
            return

        received = 0
        unread = bool(declared) or _is_chunked(scope)

        async def counting_receive() -> Message:
            nonlocal received, unread
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                unread = unread and bool(message.get("more_body", False))
                if received > self.limit:
                    # Raised inside the route's body read; ProblemError is an HTTPException, which
                    # FastAPI passes through to the problem-details handler.
                    raise ProblemError(413, "payload-too-large", too_large(self.limit))
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, counting_receive, closing_send)


def content_length(scope: Scope) -> int | None:
    """The declared length, None if absent, -1 if garbled."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None


def _is_chunked(scope: Scope) -> bool:
    return any(
        name == b"transfer-encoding" and b"chunked" in value.lower()
        for name, value in scope.get("headers", [])
    )


class ByteBudget:
    """The bytes of large request bodies held at once, across requests: a body is counted from
    before its first byte is read until its request is done with it. One that does not fit waits
    its turn (first come, first served) for up to ``wait_seconds``, then is refused with 503 and
    Retry-After. Used from the event loop only."""

    def __init__(self, capacity: int, wait_seconds: float) -> None:
        self.capacity = capacity
        self.wait_seconds = wait_seconds
        self.held = 0
        self._queue: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @asynccontextmanager
    async def reserve(self, size: int) -> AsyncIterator[None]:
        """Hold ``size`` bytes (all of the budget at most) while the block runs; nothing for a
        small body."""
        if size <= SMALL_BODY_BYTES:
            yield
            return
        size = min(size, self.capacity)
        await self._acquire(size)
        try:
            yield
        finally:
            self._release(size)

    @property
    def waiting(self) -> int:
        """Bodies waiting for room."""
        return len(self._queue)

    async def _acquire(self, size: int) -> None:
        if not self._queue and self.held + size <= self.capacity:
            self.held += size
            return
        entry = (size, asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        try:
            async with asyncio.timeout(self.wait_seconds):
                await entry[1]
        except BaseException as exc:
            granted = entry[1].done() and not entry[1].cancelled()
            if granted:  # granted as the wait ended: give it back
                self._release(size)
            else:
                with contextlib.suppress(ValueError):  # _grant may have dropped it already
                    self._queue.remove(entry)
                self._grant()  # it may have been the head blocking the others
            if isinstance(exc, TimeoutError):
                raise self._busy() from None
            raise

    def _release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        while self._queue and self.held + self._queue[0][0] <= self.capacity:
            size, waiter = self._queue.popleft()
            if not waiter.done():  # not cancelled while it waited
                self.held += size
                waiter.set_result(None)

    def _busy(self) -> ProblemError:
        retry_after = max(1, math.ceil(self.wait_seconds))
        return ProblemError(
            503,
            "unavailable",
            f"the service holds {self.capacity} bytes of request bodies at once"
            " (GLASU_MAX_INFLIGHT_BODY_BYTES) and no room came free in"
            f" {self.wait_seconds:g} s; send it again after {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )
