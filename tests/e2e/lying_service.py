"""A service that lies: a real HTTP reverse proxy (uvicorn, loopback) in front of the real
``glasu serve``, whose ``handler`` sees every request of the workers behind it and may forward
it, change the answer or make one up. The threat model's "malicious operator" (docs/threat-
model.md) is exactly this: the workers cannot tell it from the service."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from clients.local.processes import free_port

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Exchange:
    """One request to the service, as the proxy received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    upstream: httpx.Client = field(repr=False)

    def forward(self, *, body: bytes | None = None) -> httpx.Response:
        return self.upstream.request(
            self.method,
            self.path + (f"?{self.query}" if self.query else ""),
            headers=self.headers,
            content=self.body if body is None else body,
        )


Handler = Callable[[Exchange], httpx.Response]


def problem(status: int, slug: str, detail: str) -> httpx.Response:
    """A problem detail as the service would send it."""
    return httpx.Response(
        status,
        json={"type": f"https://glasu.dev/problems/{slug}", "title": slug, "status": status,
              "detail": detail},
        headers={"Content-Type": "application/problem+json"},
    )  # fmt: skip


@contextmanager
def lying_service(upstream: str, handler: Handler) -> Iterator[str]:
    """Serve the proxy on a free loopback port while the block runs; yields its base URL."""
    client = httpx.Client(base_url=upstream, timeout=300)

    async def proxy(request: Request) -> Response:
        exchange = Exchange(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers={k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS},
            body=await request.body(),
            upstream=client,
        )
        answer = await run_in_threadpool(handler, exchange)  # long polls block a thread
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS}
        headers.pop("content-encoding", None)  # httpx has decoded the body
        return Response(answer.content, status_code=answer.status_code, headers=headers)

    app = Starlette(routes=[Route("/{path:path}", proxy, methods=["GET", "PUT", "POST", "DELETE"])])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the lying proxy did not start")
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        client.close()
