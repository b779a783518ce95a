"""A synchronous httpx transport in front of an ASGI app, without sockets: requests from any
thread run on one event loop of its own, so the app's long-poll wake-ups all live on that loop.
``glasu train --party`` runs the alignment through the service's routes this way."""

from __future__ import annotations

import asyncio
import threading

import httpx


class InProcessTransport(httpx.BaseTransport):
    def __init__(self, app) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        forwarded = httpx.Request(
            request.method, request.url, headers=request.headers, content=body
        )

        async def send() -> tuple[int, httpx.Headers, bytes]:
            response = await self._inner.handle_async_request(forwarded)
            content = await response.aread()
            return response.status_code, response.headers, content

        status, headers, content = asyncio.run_coroutine_threadsafe(send(), self._loop).result()
        headers = httpx.Headers(
            [(k, v) for k, v in headers.multi_items() if k.lower() != "content-length"]
        )
        return httpx.Response(status, headers=headers, content=content, request=request)

    def close(self) -> None:
        """Clients sharing this transport close it when they finish: keep serving the others."""

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
