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
from pathlib import Path
from typing import Any

import httpx
import numpy as np

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


class ServiceError(RuntimeError):
    """The service answered with an error that retrying will not fix."""

    def __init__(self, status: int, problem: dict[str, Any], method: str, url: str) -> None:
        self.status = status
        self.problem = problem
        slug = str(problem.get("type", "")).rsplit("/", 1)[-1]
        detail = problem.get("detail") or problem.get("title") or "no detail"
        super().__init__(f"{method} {url} -> {status} {slug}: {detail}")

    @property
    def slug(self) -> str:
        return str(self.problem.get("type", "")).rsplit("/", 1)[-1]


class ServiceUnavailable(RuntimeError):
    """The service could not be reached, or kept failing, within the retry budget."""


class PeersMissing(RuntimeError):
    """Other clients did not deliver their part of a step within the wait limit."""


def tls_verification(ca_file: Path | None) -> ssl.SSLContext | bool:
    """Verify the service's certificate against ``ca_file``, else against the system CAs."""
    if ca_file is None:
        return True
    if not Path(ca_file).is_file():
        raise FileNotFoundError(f"CA file {ca_file} not found")
    return ssl.create_default_context(cafile=str(ca_file))


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    first_delay: float = 0.2
    max_delay: float = 5.0


@dataclass
class Traffic:
    """Bytes of request and response bodies, as sent and received."""

    up: int = 0
    down: int = 0


class ServiceClient:
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
        self.retry = retry or RetryPolicy()
        self.poll_seconds = poll_seconds
        self.peer_wait_seconds = peer_wait_seconds
        self.traffic = Traffic()
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            verify=verify,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _client_path(self) -> str:
        return f"/v1/sessions/{self.session_id}/clients/{self.client_index}"

    # -- calls ----------------------------------------------------------------------------------

    def session(self) -> dict[str, Any]:
        return self._request("GET", f"/v1/sessions/{self.session_id}").json()

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
        base = f"{self._client_path}/passes/{pass_index}/layers/{layer}"
        self._request(
            "PUT",
            f"{base}/embedding",
            content=payload,
            headers={
                "Content-Type": "application/octet-stream",
                ENCODING_HEADER: encoding,
                SHAPE_HEADER: f"{rows},{cols}",
            },
        )
        response = self._wait_for(f"{base}/aggregate")
        return Aggregate(payload=response.content, count=int(response.headers[COUNT_HEADER]))

    def report_metrics(self, pass_index: int, metrics: dict[str, float | None]) -> None:
        clean = {k: v for k, v in metrics.items() if v is not None and v == v}  # drop None/NaN
        self._request("POST", f"{self._client_path}/passes/{pass_index}/metrics", json=clean)

    # -- plumbing -------------------------------------------------------------------------------

    def _wait_for(self, path: str) -> httpx.Response:
        """Long-poll until the service has the union or the sum (200); 202 means still waiting.
        Gives up after ``peer_wait_seconds`` naming the clients that never delivered."""
        deadline = time.monotonic() + self.peer_wait_seconds
        while True:
            response = self._request("GET", path, params={"wait": self.poll_seconds})
            if response.status_code == 200:
                return response
            missing = response.json().get("missing")
            if time.monotonic() >= deadline:
                raise PeersMissing(
                    f"gave up after {self.peer_wait_seconds:.0f} s at {path}: clients {missing} "
                    "never delivered (is their worker running and connected?)"
                )
            log.info("waiting for clients %s at %s", missing, path)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        delay = self.retry.first_delay
        for attempt in range(1, self.retry.attempts + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    self._count(kwargs.get("content"), kwargs.get("json"), response)
                    if response.status_code >= 400:
                        raise ServiceError(response.status_code, _problem(response), method, path)
                    return response
                failure = f"{response.status_code} {_problem(response).get('detail', '')}"
            if attempt == self.retry.attempts:
                break
            log.warning(
                "%s %s failed (%s); retry %d in %.1f s", method, path, failure, attempt, delay
            )
            self._sleep(delay)
            delay = min(delay * 2, self.retry.max_delay)
        raise ServiceUnavailable(
            f"{method} {path} failed after {self.retry.attempts} attempts: {failure}"
        )

    def _count(self, content: bytes | None, json_body: object, response: httpx.Response) -> None:
        if content is not None:
            self.traffic.up += len(content)
        elif json_body is not None:
            self.traffic.up += len(response.request.content)
        self.traffic.down += len(response.content)


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {"detail": response.text[:200]}
    return body if isinstance(body, dict) else {"detail": str(body)}
