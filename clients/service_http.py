"""What every HTTP client of the aggregation service shares: the worker's ``SessionClient``
(``clients/session_client.py``), a party's ``AlignmentClient`` (``clients/alignment.py``) and the
operator's ``AdminClient`` (``clients/admin.py``).

TLS verification, the two errors (the service refused; the service could not be reached),
RFC 9457 problem details turned into one sentence for people, bounded retries, the connection
options, and the parties' long polls for what the others deliver. Only ``httpx``, pydantic and
the standard library: the CLI's admin commands import this without numpy or torch.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import httpx

from secure.wire.common import Waiting
from secure.wire.headers import AUTHORIZATION_HEADER

log = logging.getLogger(__name__)


KEEPALIVE_SECONDS = 2.0  # below uvicorn's timeout_keep_alive (5 s) in service/server.py


class ServiceError(RuntimeError):
    """The service answered with an error that retrying will not fix.

    ``action`` (e.g. "to close session 'abc'") names what was asked, for :meth:`describe`;
    without it the request line is named."""

    def __init__(
        self,
        status: int,
        problem: dict[str, Any],
        method: str,
        url: str,
        *,
        action: str | None = None,
    ) -> None:
        self.status = status
        self.problem = problem
        self.method = method
        self.url = url
        self.action = action
        detail = problem.get("detail") or problem.get("title") or "no detail"
        super().__init__(f"{method} {url} -> {status} {problem_slug(problem)}: {detail}")

    @property
    def slug(self) -> str:
        return problem_slug(self.problem)

    def describe(self) -> str:
        """One sentence for people: "the service refused ... (status slug): detail"."""
        return describe_problem(
            self.problem, status=self.status, action=self.action or f"{self.method} {self.url}"
        )


class ServiceUnavailable(RuntimeError):
    """The service could not be reached, or kept failing, within the retry budget.

    ``answered`` is True when the last attempt got a 5xx answer (the service is there but
    failing), False when it never answered (connection refused, timeout, TLS failure)."""

    def __init__(self, message: str, *, failure: str = "", answered: bool = False) -> None:
        super().__init__(message)
        self.failure = failure
        self.answered = answered


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


@dataclass(frozen=True)
class ConnectionOptions:
    """How a client reaches the service and how patient it is: one object handed through the
    connection classes (the CLI fills it from its flags, tests put an in-process transport in
    it)."""

    transport: httpx.BaseTransport | None = None  # None: the network
    verify: ssl.SSLContext | bool = True
    retry: RetryPolicy = RetryPolicy()
    timeout: float = 120.0  # the HTTP read timeout of one request
    poll_seconds: float = 30.0  # how long one long poll asks the service to hold the answer
    peer_wait_seconds: float = 900.0  # how long a party waits for the others to deliver
    sleep: Callable[[float], None] = time.sleep  # between retries and polls (tests fake it)


class PeersMissing(RuntimeError):
    """Other parties did not deliver their part of a step within the wait limit."""


@dataclass
class Traffic:
    """Bytes of request and response bodies, as sent and received."""

    up: int = 0
    down: int = 0


# -- problem details (RFC 9457, service/errors.py) ------------------------------------------------


def problem_of(response: httpx.Response) -> dict[str, Any]:
    """The problem-details body of an error response (a stand-in when it is not JSON)."""
    try:
        body = response.json()
    except ValueError:
        return {"detail": response.text[:200]}
    return body if isinstance(body, dict) else {"detail": str(body)}


def problem_slug(problem: Mapping[str, Any]) -> str:
    return str(problem.get("type", "")).rsplit("/", 1)[-1]


def describe_problem(
    problem: Mapping[str, Any], *, status: int | None = None, action: str | None = None
) -> str:
    """One sentence for people from an RFC 9457 body::

        the service refused to create the session (422 validation-error): clients: Input
        should be less than or equal to 64

    ``action`` says what was asked ("to create the session"; default "the request"). A 422
    validation error lists each field and its message (the ``errors`` member the service
    adds); otherwise the ``detail`` (else the ``title``) is the reason."""
    status = status if status is not None else problem.get("status")
    slug = problem_slug(problem)
    label = " ".join(str(part) for part in (status, slug) if part)
    reason = _field_errors(problem.get("errors")) or str(
        problem.get("detail") or problem.get("title") or "no reason given"
    )
    asked = action or "the request"
    return f"the service refused {asked}" + (f" ({label})" if label else "") + f": {reason}"


def _field_errors(errors: object) -> str:
    if not isinstance(errors, list) or not errors:
        return ""
    described = []
    for error in errors:
        if not isinstance(error, Mapping):
            continue
        location = [str(part) for part in error.get("loc", [])]
        if location[:1] in (["body"], ["query"], ["path"], ["header"]) and len(location) > 1:
            location = location[1:]  # the field, not where FastAPI found it
        field = ".".join(location) or "request"
        described.append(f"{field}: {error.get('msg', 'invalid')}")
    return "; ".join(described)


# -- sending with bounded retries ------------------------------------------------------------------


def send_with_retries(
    http: httpx.Client,
    method: str,
    path: str,
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    retry_log_level: int = logging.WARNING,
    **kwargs: Any,
) -> httpx.Response:
    """Send a request, retrying transport errors and 5xx answers with exponential back-off
    (each retry logged at ``retry_log_level``).

    Returns the first answer below 500 (success or client error: the caller decides); raises
    :class:`ServiceUnavailable` after ``retry.attempts`` failures."""
    delay = retry.first_delay
    failure, hint = "no attempt made", ""
    answered = False
    attempt = 0
    for attempt in range(1, retry.attempts + 1):
        try:
            response = http.request(method, path, **kwargs)
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            failure, answered = f"{type(exc).__name__}: {exc}", False
            hint = transport_hint(exc, http.base_url)
            if untrusted_certificate(exc):
                break  # waiting does not make a certificate trusted
        else:
            if response.status_code < 500:
                return response
            failure = f"{response.status_code} {problem_of(response).get('detail', '')}".strip()
            answered, hint = True, ""
        if attempt == retry.attempts:
            break
        log.log(
            retry_log_level,
            "%s %s failed (%s); retry %d in %.1f s",
            method,
            path,
            failure,
            attempt,
            delay,
        )
        sleep(delay)
        delay = min(delay * 2, retry.max_delay)
    tries = "once" if attempt == 1 else f"after {attempt} attempts"
    if hint:
        failure += f" ({hint})"
    raise ServiceUnavailable(
        f"{method} {path} failed {tries}: {failure}",
        failure=failure,
        answered=answered,
    )


def untrusted_certificate(exc: Exception) -> bool:
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def transport_hint(exc: Exception, base_url: httpx.URL) -> str:
    """What to do about a transport failure with a usual cause: the service's TLS certificate
    is not trusted (no or the wrong --ca-file), or a plain-HTTP address for a TLS service
    (which hangs up on it without an answer). Empty when there is none."""
    if untrusted_certificate(exc):
        if "mismatch" in str(exc):
            return "the certificate does not name this host: use an address it names"
        return (
            "the service's certificate is not signed by a CA this client trusts: give the CA "
            "certificate that signed it with --ca-file"
        )
    if base_url.scheme == "http" and isinstance(exc, httpx.RemoteProtocolError):
        return (
            "the service closed the connection without an answer; if it serves TLS, use "
            f"https://{base_url.netloc.decode()} instead of http://"
        )
    return ""


class KeptTransport(httpx.BaseTransport):
    """One network transport (its TLS context and connection pool) for the connections a
    long-running worker opens one after another (an online worker's request sessions): closing
    such a connection leaves it open, :meth:`shut` closes it. Building the TLS context of a
    fresh ``httpx.Client`` costs about 30 ms of CPU, which a request would otherwise pay per
    party."""

    def __init__(self, verify: ssl.SSLContext | bool) -> None:
        self._inner = httpx.HTTPTransport(
            verify=verify, limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._inner.handle_request(request)

    def close(self) -> None:
        """Kept open for the next connection (:meth:`shut` closes it)."""

    def shut(self) -> None:
        self._inner.close()


class BearerConnection:
    """An ``httpx.Client`` to the service with one bearer token, on the transport seam (an
    in-process ASGI transport in tests, the network in production); closes with ``with``."""

    def __init__(self, *, base_url: str, token: str, options: ConnectionOptions) -> None:
        self.base_url = base_url.rstrip("/")
        self.options = options
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={AUTHORIZATION_HEADER: f"Bearer {token}"},
            transport=options.transport,
            verify=options.verify,
            timeout=httpx.Timeout(options.timeout, connect=10.0),
            # idle connections are dropped before the service's own 5 s keep-alive ends, so a
            # request is not sent on a connection the service is about to close
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PeerConnection(BearerConnection):
    """A party's connection to the service: bounded retries, the bytes it sends and receives,
    and long polls for what the other parties deliver (the worker's passes, the alignment's
    sets)."""

    #: how the long poll names the others, and what to check when they never deliver
    peers: ClassVar[str] = "clients"
    peers_hint: ClassVar[str] = "is their worker running and connected?"

    def __init__(self, *, base_url: str, token: str, options: ConnectionOptions) -> None:
        super().__init__(base_url=base_url, token=token, options=options)
        self.traffic = Traffic()

    def _wait_for(self, path: str, params: Mapping[str, int] | None = None) -> httpx.Response:
        """Long-poll until the service has it (200; 202 means still waiting). Gives up after
        ``peer_wait_seconds`` naming the parties that never delivered. ``params``: the query's
        besides the wait."""
        deadline = time.monotonic() + self.options.peer_wait_seconds
        while True:
            # a poll never outlasts the peer wait: a short wait is not stretched to a long poll
            wait = min(self.options.poll_seconds, max(0.0, deadline - time.monotonic()))
            query = {**(params or {}), "wait": round(wait, 3)}
            response = self._request("GET", path, params=query)
            if response.status_code == 200:
                return response
            missing = Waiting.model_validate_json(response.content).missing
            if time.monotonic() >= deadline:
                raise PeersMissing(
                    f"gave up after {self.options.peer_wait_seconds:.0f} s at {path}: "
                    f"{self.peers} {missing} never delivered ({self.peers_hint})"
                )
            log.info("waiting for %s %s at %s", self.peers, missing, path)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = send_with_retries(
            self._http,
            method,
            path,
            retry=self.options.retry,
            sleep=self.options.sleep,
            **kwargs,
        )
        self.traffic.up += len(response.request.content)
        self.traffic.down += len(response.content)
        if response.status_code >= 400:
            raise ServiceError(response.status_code, problem_of(response), method, path)
        return response
