"""The operator's HTTP side: the admin calls to the aggregation service (docs/api.md).

One class for every admin call the ``glasu`` command makes (``glasu session``, ``glasu budget``
and the local federation of ``glasu train``). Like the worker's ``SessionClient`` it takes an
``httpx`` transport, so tests drive it against the app in process; it shares that client's TLS
verification, retries and problem details (``clients/service_http.py``). Failures are
:class:`ServiceError` (the service refused: :meth:`ServiceError.describe` is one sentence) or
:class:`ServiceUnavailable` ("cannot reach the service at URL: ..."). Imports neither numpy nor
torch.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from clients.service_http import (
    BearerConnection,
    ConnectionOptions,
    RetryPolicy,
    ServiceError,
    ServiceUnavailable,
    describe_problem,
    problem_of,
    send_with_retries,
    tls_verification,
)

__all__ = [
    "ADMIN_RETRY",
    "AdminClient",
    "ServiceError",
    "ServiceUnavailable",
    "describe_problem",
    "tls_verification",
]

# A person (or the local federation's poll loop) is waiting: a few quick attempts, not the
# worker's patient back-off.
ADMIN_RETRY = RetryPolicy(attempts=3, first_delay=0.2, max_delay=1.0)


class AdminClient(BearerConnection):
    """Admin calls with one bearer token: the admin token, or for :meth:`privacy` a client
    token of that session (the service allows both there)."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
        retry: RetryPolicy | None = None,
        timeout: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        options = ConnectionOptions(transport=transport, verify=verify, timeout=timeout)
        super().__init__(base_url=base_url, token=token, options=options)
        self.retry = retry or ADMIN_RETRY
        self._sleep = sleep

    # -- calls ----------------------------------------------------------------------------------

    def healthy(self, *, timeout: float = 2.0) -> bool:
        """One ``GET /healthz``: True when the service answers 200, False otherwise (not
        reachable yet, or not healthy). Never raises for the service's state."""
        try:
            return self._http.get("/healthz", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def create_session(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/sessions``: the ``SessionCreated`` body (session id, client tokens, ...).
        Not retried once sent: a second POST would create a second session."""
        return self._call(
            "POST", "/v1/sessions", "to create the session", json=dict(body), retry_sent=False
        )

    def session(self, session_id: str) -> dict[str, Any]:
        """``GET /v1/sessions/{id}``: state, progress, metrics, privacy summary."""
        return self._call("GET", self._path(session_id), f"to show session {session_id!r}")

    def close_session(self, session_id: str) -> dict[str, Any]:
        """``DELETE /v1/sessions/{id}``: close it (waiting workers are woken and stop)."""
        return self._call("DELETE", self._path(session_id), f"to close session {session_id!r}")

    def privacy(self, session_id: str) -> dict[str, Any]:
        """``GET /v1/sessions/{id}/privacy``: the (epsilon, delta) spent, target and ledger."""
        return self._call(
            "GET",
            f"{self._path(session_id)}/privacy",
            f"to show the privacy budget of session {session_id!r}",
        )

    def create_alignment(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/alignments``: the alignment id and one token per party. Not retried once
        sent."""
        return self._call(
            "POST", "/v1/alignments", "to create the alignment", json=dict(body), retry_sent=False
        )

    def alignment(self, alignment_id: str) -> dict[str, Any]:
        """``GET /v1/alignments/{id}``: set sizes, progress and, once done, the shared nodes."""
        if not alignment_id:
            raise ValueError("an alignment id is required")
        return self._call(
            "GET",
            f"/v1/alignments/{quote(alignment_id, safe='')}",
            f"to show alignment {alignment_id!r}",
        )

    # -- plumbing -------------------------------------------------------------------------------

    @staticmethod
    def _path(session_id: str) -> str:
        if not session_id:
            raise ValueError("a session id is required")
        return f"/v1/sessions/{quote(session_id, safe='')}"

    def sessions(self, *, page_size: int = 100) -> Iterator[dict[str, Any]]:
        """``GET /v1/sessions``, oldest first, page after page (``Link: rel="next"``)."""
        path: str | None = f"/v1/sessions?limit={page_size}"
        while path is not None:
            response = self._send("GET", path, "to list the sessions")
            page = response.json()
            if not isinstance(page, list):
                raise self._not_glasu("GET", path, response)
            yield from page
            path = response.links.get("next", {}).get("url")

    def _call(
        self, method: str, path: str, action: str, *, retry_sent: bool = True, **kwargs: Any
    ) -> dict[str, Any]:
        response = self._send(method, path, action, retry_sent=retry_sent, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise self._not_glasu(method, path, response)
        return body

    def _not_glasu(self, method: str, path: str, response: httpx.Response) -> ServiceUnavailable:
        failure = f"{response.status_code} {response.text[:80]!r}"
        return ServiceUnavailable(
            f"the server at {self.base_url} does not answer like a glasu service "
            f"({method} {path} -> {failure})",
            failure=failure,
            answered=True,
        )

    def _send(
        self, method: str, path: str, action: str, *, retry_sent: bool = True, **kwargs: Any
    ) -> httpx.Response:
        retry = self.retry if retry_sent else RetryPolicy(attempts=1)
        try:
            response = send_with_retries(
                self._http,
                method,
                path,
                retry=retry,
                sleep=self._sleep,
                retry_log_level=logging.INFO,  # the one-line failure says enough
                **kwargs,
            )
        except ServiceUnavailable as exc:
            if exc.answered:
                raise ServiceUnavailable(
                    f"the service at {self.base_url} kept failing {action}: {exc.failure}",
                    failure=exc.failure,
                    answered=True,
                ) from None
            raise ServiceUnavailable(
                f"cannot reach the service at {self.base_url}: {exc.failure}",
                failure=exc.failure,
            ) from None
        if response.status_code >= 400:
            raise ServiceError(
                response.status_code, problem_of(response), method, path, action=action
            )
        return response
