"""The worker's calls to its session's routes of the aggregation service (docs/protocol.md):
the session's status, each pass's plan, the node sets and shares it exchanges, its metrics.

The JSON answers are parsed into the wire models of ``secure/wire`` (the service answers with
the same models). ``SessionClient`` takes its ``httpx`` transport in its
:class:`~clients.service_http.ConnectionOptions`, so the same code talks to an in-process ASGI
app in tests (``httpx.ASGITransport``) and to a real server in production.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clients.service_http import ConnectionOptions, PeerConnection, ServiceError
from secure.protocol import NODE_ENCODING, SharesSum, decode_nodes, encode_nodes
from secure.wire.headers import COUNT_HEADER, ENCODING_HEADER, SHAPE_HEADER
from secure.wire.passes import PassInfo, RejoinReceipt
from secure.wire.request_signature import RequestSignature
from secure.wire.sessions import ScoringRequestOpened
from secure.wire.status import SessionStatus


class SessionClient(PeerConnection):
    """Client ``client_index`` of session ``session_id``, with that client's bearer token."""

    def __init__(
        self,
        *,
        base_url: str,
        session_id: str,
        client_index: int,
        token: str,
        options: ConnectionOptions | None = None,
    ) -> None:
        self.session_id = session_id
        self.client_index = client_index
        super().__init__(base_url=base_url, token=token, options=options or ConnectionOptions())

    @property
    def _client_path(self) -> str:
        return f"/v1/sessions/{self.session_id}/clients/{self.client_index}"

    # -- calls ----------------------------------------------------------------------------------

    def session(self) -> SessionStatus:
        response = self._request("GET", f"/v1/sessions/{self.session_id}")
        return SessionStatus.model_validate_json(response.content)

    def request_session(self, session_id: str) -> SessionStatus | None:
        """An online session's request session (``service/online.py``), or None while it is
        not opened."""
        try:
            response = self._request("GET", f"/v1/sessions/{session_id}")
        except ServiceError as exc:
            if exc.status == 404:
                return None
            raise
        return SessionStatus.model_validate_json(response.content)

    def next_request(self, number: int) -> SessionStatus | None:
        """Request ``number`` of this online session once it is opened, waiting for it one long
        poll (``poll_seconds``) at most: None while it is not; :class:`ServiceError` 409
        ``session-closed`` once the online session takes no more requests."""
        response = self._request(
            "GET",
            f"/v1/sessions/{self.session_id}/requests/{number}",
            params={"wait": self.options.poll_seconds},
        )
        if response.status_code == 202:
            return None
        return SessionStatus.model_validate_json(response.content)

    def refusal(self, session_id: str) -> str | None:
        """Why a party refused request session ``session_id`` at join (None if none did)."""
        path = f"/v1/sessions/{session_id}/clients/{self.client_index}/readiness"
        try:
            self._request("GET", path, params={"wait": 0})
        except ServiceError as exc:
            if exc.slug == "session-refused":
                return str(exc.problem.get("detail"))
            raise
        return None

    def ask(
        self, nodes: np.ndarray, signature: RequestSignature | None = None
    ) -> ScoringRequestOpened:
        """The answering party asks its online session to score ``nodes`` (aligned ids), with
        its ``signature`` of the request (``clients/request_signing.py``)."""
        body: dict[str, object] = {"nodes": [int(n) for n in nodes]}
        if signature is not None:
            body["signature"] = signature.model_dump(mode="json")
        response = self._request("POST", f"/v1/sessions/{self.session_id}/requests", json=body)
        return ScoringRequestOpened.model_validate_json(response.content)

    def rejoin(self) -> int:
        """After a pass went on without this client (stragglers "continue"): the pass from
        which the others wait for it again."""
        response = self._request("POST", f"{self._client_path}/rejoin")
        return RejoinReceipt.model_validate_json(response.content).pass_index

    def say_ready(self) -> None:
        """At join (a session with ``ready_gate``): this worker's checks passed."""
        self._request("PUT", f"{self._client_path}/readiness", json={"ready": True})

    def refuse(self, reason: str) -> None:
        """At join: this worker cannot take part (``reason``, one sentence); the service closes
        the session and shows the reason to the others."""
        self._request(
            "PUT", f"{self._client_path}/readiness", json={"ready": False, "reason": reason}
        )

    def wait_until_ready(self) -> None:
        """Long-poll until every client said it is ready (:class:`PeersMissing` after the peer
        wait; :class:`ServiceError` 409 ``session-refused`` once one refused)."""
        self._wait_for(f"{self._client_path}/readiness")

    def pass_info(self, pass_index: int) -> PassInfo:
        response = self._request("GET", f"{self._client_path}/passes/{pass_index}")
        return PassInfo.model_validate_json(response.content)

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

    def put_share(
        self,
        pass_index: int,
        layer: int,
        payload: bytes,
        *,
        rows: int,
        cols: int,
        encoding: str,
        part: int = 0,
        parts: int = 1,
    ) -> None:
        """Upload part ``part`` of ``parts`` of this client's share of (pass, layer) (``rows``:
        the part's, ``secure.protocol.part_span``); :class:`ServiceError` 409 ``conflict`` if
        the slot already holds a different body."""
        self._request(
            "PUT",
            f"{self._client_path}/passes/{pass_index}/layers/{layer}/embedding",
            params={"part": part, "parts": parts},
            content=payload,
            headers={
                "Content-Type": "application/octet-stream",
                ENCODING_HEADER: encoding,
                SHAPE_HEADER: f"{rows},{cols}",
            },
        )

    def fetch_sum(self, pass_index: int, layer: int, *, part: int = 0) -> SharesSum:
        """The sum of part ``part`` of (pass, layer), long-polling until every share's part is
        in."""
        path = f"{self._client_path}/passes/{pass_index}/layers/{layer}/aggregate"
        response = self._wait_for(path, params={"part": part})
        return SharesSum(payload=response.content, count=int(response.headers[COUNT_HEADER]))

    def report_metrics(self, pass_index: int, metrics: Mapping[str, float | None]) -> None:
        """Report a pass's metrics (``secure.wire.passes.Metrics``, for the status page only);
        missing and NaN values are left out."""
        measured = {k: v for k, v in metrics.items() if v is not None and v == v}
        self._request("POST", f"{self._client_path}/passes/{pass_index}/metrics", json=measured)
