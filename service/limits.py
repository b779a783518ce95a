"""Request body limits.

- :class:`BodySizeLimitMiddleware`, for every route: the declared Content-Length is checked
  before the app runs, and the bytes actually received are counted while the body streams in
  (chunked uploads and lying Content-Length headers). A response that starts before the body
  has been received (a 401 before any byte is read, a 413, a 503) closes the connection, and
  the rest of the body is read and discarded first (up to :data:`DRAIN_LIMITS` times the body
  limit, see :meth:`BodySizeLimitMiddleware.drain`): closing a socket with unread bytes in it
  resets the connection, and a proxy in front (HAProxy) then drops the answer it had not yet
  forwarded, so that the client sees a broken connection instead of the refusal.
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
#: After answering before the body was read, at most this many times the body limit is read and
#: discarded; a longer body is cut off (its connection reset).
DRAIN_LIMITS = 2
#: ... and the discarding stops once the client sends nothing for this long, or after this long
#: in all (a client trickling bytes holds no connection open past it).
DRAIN_IDLE_SECONDS = 5.0
DRAIN_TOTAL_SECONDS = 30.0


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
        received = 0
        unread = bool(declared and declared > 0) or _is_chunked(scope)
        if declared == -1 or (declared is not None and declared > self.limit):
            bad = declared == -1
            refused = ProblemError(
                400 if bad else 413,
                "bad-header" if bad else "payload-too-large",
                "Content-Length is not a non-negative integer" if bad else too_large(self.limit),
                headers={"Connection": "close"},
            )
            response = problem_response(refused, instance=scope.get("path", ""))

            async def draining_send(message: Message) -> None:
                await self._send_then_drain(message, send, receive, scope, declared, 0, unread)

            await response(scope, receive, draining_send)
            return

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
            elif message["type"] == "http.disconnect":
                unread = False  # nothing more will come: nothing to discard
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await self._send_then_drain(message, send, receive, scope, declared, received, unread)

        await self.app(scope, counting_receive, closing_send)

    async def _send_then_drain(
        self,
        message: Message,
        send: Send,
        receive: Receive,
        scope: Scope,
        declared: int | None,
        received: int,
        unread: bool,
    ) -> None:
        """Send ``message``; if it ends a response while the request's body is unread, end the
        response only once the rest of the body is discarded (:meth:`drain`). The answer is
        out before: the response's last bytes are sent, only its end (which lets the server
        close the connection) waits."""
        ends = message["type"] == "http.response.body" and not message.get("more_body", False)
        if not (ends and unread):
            await send(message)
            return
        if self._no_drain(scope, declared):
            await send(message)
            return
        await send({**message, "more_body": True})
        await self.drain(receive, already=received)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _no_drain(self, scope: Scope, declared: int | None) -> bool:
        # a body longer than the drain's bound is cut off anyway: not worth reading; a client
        # that waits for "100 Continue" sends no body after an answer
        too_long = declared is not None and declared > DRAIN_LIMITS * self.limit
        return too_long or _expects_continue(scope)

    async def drain(self, receive: Receive, *, already: int) -> None:
        """Read and discard the rest of the request's body (up to :data:`DRAIN_LIMITS` times
        the limit, ``already`` bytes of it read; until the client pauses for
        :data:`DRAIN_IDLE_SECONDS`, for :data:`DRAIN_TOTAL_SECONDS` at most), so that closing
        the connection afterwards sends a FIN rather than a reset. The chunks are dropped as
        they come: nothing accumulates."""
        drained = already
        try:
            async with asyncio.timeout(DRAIN_TOTAL_SECONDS):
                while drained <= DRAIN_LIMITS * self.limit:
                    async with asyncio.timeout(DRAIN_IDLE_SECONDS):
                        message = await receive()
                    if message["type"] != "http.request":  # http.disconnect
                        return
                    drained += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return
        except TimeoutError:
            return


def content_length(scope: Scope) -> int | None:
    """The declared length, None if absent, -1 if garbled."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else -1
    return None


def _expects_continue(scope: Scope) -> bool:
    return any(
        name == b"expect" and value.lower().startswith(b"100")
        for name, value in scope.get("headers", [])
    )


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
