"""``glasu worker --online`` between requests (clients/cli/worker_online.py), without HTTP: it
waits for request 1, 2, ... in the service's long poll (no sleep of its own), runs each request
session still running under the id its owner derives (whatever id the service's answer names),
and stops with 0 once the online session is closed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import clients.session_client
from clients.cli.worker_online import serve_requests
from clients.service_http import ServiceError
from clients.settings import WorkerSettings
from secure.wire.sessions import request_session_id

ONLINE = "0123abcd"


class FakeOnline:
    """The online session's client: ``answers`` in turn to ``next_request`` (None: the long
    poll ended without a request), then 409 ``session-closed``."""

    def __init__(self, answers: list[SimpleNamespace | None]) -> None:
        self.answers = answers
        self.asked: list[int] = []

    def __call__(self, **_: Any) -> FakeOnline:  # built as SessionClient(...)
        return self

    def __enter__(self) -> FakeOnline:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def session(self) -> SimpleNamespace:
        return SimpleNamespace(config=SimpleNamespace(online=True), state="running")

    def next_request(self, number: int) -> SimpleNamespace | None:
        self.asked.append(number)
        if not self.answers:
            problem = {"type": "https://glasu.dev/problems/session-closed"}
            raise ServiceError(409, problem, "GET", f"/v1/sessions/{ONLINE}/requests/{number}")
        return self.answers.pop(0)


def test_requests_are_waited_for_in_turn_and_run_under_their_own_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = SimpleNamespace(state="running", session_id="someone-elses-session")
    answered = SimpleNamespace(state="finished", session_id=request_session_id(ONLINE, 2))
    online = FakeOnline([None, running, answered, None, running])
    monkeypatch.setattr(clients.session_client, "SessionClient", online)
    token = tmp_path / "token"
    token.write_text("t" * 32)
    settings = WorkerSettings(
        server="http://127.0.0.1:9", session=ONLINE, client=1, token_file=token, data=tmp_path,
        online=True,
    )  # fmt: skip
    loaded = SimpleNamespace(token="t" * 32, verify=True, transport=None)
    ran: list[str] = []

    def run_session(each: WorkerSettings) -> int:
        ran.append(each.session)
        return 0

    assert serve_requests(settings, loaded, run_session) == 0  # type: ignore[arg-type]
    assert online.asked == [1, 1, 2, 3, 3, 4]  # a long poll that ends empty is asked again
    assert ran == [request_session_id(ONLINE, 1), request_session_id(ONLINE, 3)]
