"""Prometheus metrics, one :class:`CollectorRegistry` per app so that apps do not share counters."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Telemetry:
    def __init__(self, count_running_sessions: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.passes_completed = Counter(
            "glasu_passes_completed",
            "Passes whose last aggregation layer has been summed.",
            ["kind"],
            registry=self.registry,
        )
        self.bytes_received = Counter(
            "glasu_bytes_received",
            "Binary body bytes received from clients.",
            ["kind"],
            registry=self.registry,
        )
        self.bytes_sent = Counter(
            "glasu_bytes_sent",
            "Binary body bytes sent to clients.",
            ["kind"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "glasu_request_duration_seconds",
            "Request latency (long polls included) by route template.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.active_sessions = Gauge(
            "glasu_active_sessions", "Sessions in state 'running'.", registry=self.registry
        )
        self.active_sessions.set_function(count_running_sessions)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimingMiddleware:
    """Pure ASGI (no response buffering): observes latency under the matched route's template."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.telemetry.request_seconds.labels(
                method=scope["method"], route=template, status=str(status)
            ).observe(time.perf_counter() - started)
