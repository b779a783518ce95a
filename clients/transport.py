"""The worker's HTTP side: one client's calls to the aggregation service (docs/protocol.md).

``ServiceClient`` takes an ``httpx`` transport, so the same code talks to an in-process ASGI app
in tests (``httpx.ASGITransport``) and to a real server in production.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from clients.service_http import (
    BearerConnection,
    RetryPolicy,
    ServiceError,
    ServiceUnavailable,
    problem_of,
    send_with_retries,
    tls_verification,
)
from secure.protocol import (
    COUNT_HEADER,
    ENCODING_HEADER,
    NODE_ENCODING,
    SHAPE_HEADER,
    Aggregate,
    decode_nodes,
    encode_nodes,
)

log = logging.getLogger(__name__)


# Shared with the operator's AdminClient (clients/admin.py); re-exported here, where the worker's
# code and tests have always found them.
__all__ = [
    "PeersMissing",
    "RetryPolicy",
    "ServiceClient",
    "ServiceError",
    "ServiceUnavailable",
    "Traffic",
    "tls_verification",
]


class PeersMissing(RuntimeError):
    """Other clients did not deliver their part of a step within the wait limit."""


@dataclass
class Traffic:
    """Bytes of request and response bodies, as sent and received."""

    up: int = 0
    down: int = 0


class PeerConnection(BearerConnection):
    """A party's connection to the service: bounded retries, the bytes it sends and receives,
    and long polls for what the other parties deliver (the worker's passes, the alignment's
    sets)."""

    #: how the long poll names the others, and what to check when they never deliver
    peers = "clients"
    peers_hint = "is their worker running and connected?"

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        transport: httpx.BaseTransport | None,
        verify: ssl.SSLContext | bool,
        retry: RetryPolicy | None,
        poll_seconds: float,
        peer_wait_seconds: float,
        timeout: float,
        sleep: Callable[[float], None],
    ) -> None:
        super().__init__(
            base_url=base_url, token=token, transport=transport, verify=verify, timeout=timeout
        )
        self.retry = retry or RetryPolicy()
        self.poll_seconds = poll_seconds
        self.peer_wait_seconds = peer_wait_seconds
        self.traffic = Traffic()
        self._sleep = sleep

    def _wait_for(self, path: str) -> httpx.Response:
        """Long-poll until the service has it (200; 202 means still waiting). Gives up after
        ``peer_wait_seconds`` naming the parties that never delivered."""
        deadline = time.monotonic() + self.peer_wait_seconds
        while True:
            response = self._request("GET", path, params={"wait": self.poll_seconds})
            if response.status_code == 200:
                return response
            missing = response.json().get("missing")
            if time.monotonic() >= deadline:
                raise PeersMissing(
                    f"gave up after {self.peer_wait_seconds:.0f} s at {path}: {self.peers} "
                    f"{missing} never delivered ({self.peers_hint})"
                )
            log.info("waiting for %s %s at %s", self.peers, missing, path)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = send_with_retries(
            self._http, method, path, retry=self.retry, sleep=self._sleep, **kwargs
        )
        self.traffic.up += len(response.request.content)
        self.traffic.down += len(response.content)
        if response.status_code >= 400:
            raise ServiceError(response.status_code, problem_of(response), method, path)
        return response


class ServiceClient(PeerConnection):
    def __init__(
        self,
        *,
        base_url: str,
        session_id: str,
        client_index: int,
        token: str,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        retry: RetryPolicy | None = None,
        poll_seconds: float = 30.0,
        peer_wait_seconds: float = 900.0,
        timeout: float = 120.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.session_id = session_id
        self.client_index = client_index
        super().__init__(
            base_url=base_url,
            token=token,
            transport=transport,
            verify=verify,
            retry=retry,
            poll_seconds=poll_seconds,
            peer_wait_seconds=peer_wait_seconds,
            timeout=timeout,
            sleep=sleep,
        )

    @property
    def _client_path(self) -> str:
        return f"/v1/sessions/{self.session_id}/clients/{self.client_index}"

    # -- calls ----------------------------------------------------------------------------------

    def session(self) -> dict[str, Any]:
        return self._request("GET", f"/v1/sessions/{self.session_id}").json()

    def rejoin(self) -> int:
        """After a pass went on without this client (stragglers "continue"): the pass from
        which the others wait for it again."""
        return int(self._request("POST", f"{self._client_path}/rejoin").json()["pass"])

    def pass_info(self, pass_index: int) -> dict[str, Any]:
        return self._request("GET", f"{self._client_path}/passes/{pass_index}").json()

    def exchange_nodes(self, pass_index: int, layer: int, nodes: np.ndarray) -> np.ndarray:
        body = encode_nodes(nodes)
        path = f"{self._client_path}/passes/{pass_index}/layers/{layer}/nodes"
        self._request(
            "PUT",
            path,
            content=body,
            headers={
                "Content-Type": "application/octet-stream",
                ENCODING_HEADER: NODE_ENCODING,
                SHAPE_HEADER: str(len(nodes)),
            },
        )
        response = self._wait_for(path)
        return decode_nodes(response.content)

    def exchange_embedding(
        self, pass_index: int, layer: int, payload: bytes, *, rows: int, cols: int, encoding: str
    ) -> Aggregate:
        self.put_embedding(pass_index, layer, payload, rows=rows, cols=cols, encoding=encoding)
        return self.fetch_aggregate(pass_index, layer)

    def put_embedding(
        self, pass_index: int, layer: int, payload: bytes, *, rows: int, cols: int, encoding: str
    ) -> None:
        """Upload this client's share of (pass, layer); :class:`ServiceError` 409 ``conflict``
        if the slot already holds a different body."""
        self._request(
            "PUT",
            f"{self._client_path}/passes/{pass_index}/layers/{layer}/embedding",
            content=payload,
            headers={
                "Content-Type": "application/octet-stream",
                ENCODING_HEADER: encoding,
                SHAPE_HEADER: f"{rows},{cols}",
            },
        )

    def fetch_aggregate(self, pass_index: int, layer: int) -> Aggregate:
        """The sum of (pass, layer), long-polling until every share is in."""
        path = f"{self._client_path}/passes/{pass_index}/layers/{layer}/aggregate"
        response = self._wait_for(path)
        return Aggregate(payload=response.content, count=int(response.headers[COUNT_HEADER]))

    def report_metrics(self, pass_index: int, metrics: dict[str, float | None]) -> None:
        clean = {k: v for k, v in metrics.items() if v is not None and v == v}  # drop None/NaN
        self._request("POST", f"{self._client_path}/passes/{pass_index}/metrics", json=clean)
