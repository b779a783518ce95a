"""What an online worker checks of a request session at join (clients/request_signing.py),
without a service: only a request the pinned answering party signed for this online session,
over exactly the signed nodes, recently, in one scoring pass, and once (its nonce kept in the
owner's ledger, so a restarted worker still refuses a replay)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from nacl.signing import SigningKey

from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal
from clients.request_signing import RequestCheck, RequestRefused, sign_request
from secure.protocol import ProtocolViolation
from secure.wire.passes import PassInfo
from secure.wire.sessions import request_session_id

ONLINE = "0123abcd"
NOW = 1_800_000_000.0
ASKER = SigningKey(b"\x01" * 32)
NODES = [41, 7, 19]


def _check(**overrides: Any) -> RequestCheck:
    settings = {"online_id": ONLINE, "party": 1, "key": ASKER.verify_key, "clock": lambda: NOW}
    return RequestCheck(**{**settings, **overrides})


def _request(
    number: int, signature: Any, *, kind: str = "scoring", passes: int = 1, label_holder: int = 1
) -> Any:
    """A request session's status as the service states it (the fields the check reads)."""
    config = SimpleNamespace(
        kind=kind, online=False, label_holder=label_holder, request_signature=signature
    )
    return SimpleNamespace(
        session_id=request_session_id(ONLINE, number), config=config, passes_total=passes
    )


def _signed(nodes: list[int] = NODES, *, key: SigningKey = ASKER, **overrides: Any) -> Any:
    values = {"online_id": ONLINE, "party": 1, "nodes": np.array(nodes), "now": NOW - 5}
    return sign_request(key, **{**values, **overrides})


def _pass(nodes: list[int]) -> PassInfo:
    """The request session's one pass as the service states it."""
    return PassInfo(pass_index=0, kind="eval", round=0, output_nodes=nodes)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[OwnerLedger]:
    with OwnerLedger(tmp_path / "ledger.sqlite3") as opened:
        yield opened


def test_a_signed_request_is_admitted_once_and_its_restart_too(
    ledger: OwnerLedger, tmp_path: Path
) -> None:
    signed = _signed()
    check = _check()
    check.admit(_request(1, signed), lambda: _pass(sorted(NODES)), ledger)
    check.admit(_request(1, signed), lambda: _pass(sorted(NODES)), ledger)  # the same request again
    # a replay in another request session is refused, by a restarted worker too (the file)
    with OwnerLedger(tmp_path / "ledger.sqlite3") as reopened, pytest.raises(
        RequestRefused, match=r"replays the signed request of .*-1"
    ):  # fmt: skip
        check.admit(_request(2, signed), lambda: _pass(sorted(NODES)), reopened)
    assert issubclass(RequestRefused, PolicyRefusal)  # told to the service at join


def test_an_unsigned_request_is_refused_unless_its_owner_accepts_them(
    ledger: OwnerLedger,
) -> None:
    with pytest.raises(RequestRefused, match="not signed by the answering party 1"):
        _check().admit(_request(1, None), lambda: _pass(NODES), ledger)
    RequestCheck(online_id=ONLINE).admit(_request(1, None), lambda: _pass(NODES), ledger)


@pytest.mark.parametrize(
    ("signed", "why"),
    [
        (lambda: _signed(key=SigningKey(b"\x02" * 32)), "is not party 1's"),
        (lambda: _signed(online_id="ffff0000"), "is not party 1's"),
        (lambda: _signed(party=0), "signed as party 0"),
        (lambda: _signed(now=NOW - 601), "signed 601 s ago"),
        (lambda: _signed(now=NOW + 900), "signed 900 s ahead"),
        (lambda: _signed([41, 7]), "other nodes than party 1 signed"),
        (
            lambda: _signed().model_copy(update={"nodes_sha256": _signed([41, 7]).nodes_sha256}),
            "is not party 1's",
        ),
    ],
)
def test_a_request_not_signed_as_asked_is_refused_and_keeps_no_nonce(
    ledger: OwnerLedger, signed: Any, why: str
) -> None:
    request = signed()
    with pytest.raises(RequestRefused, match=why):
        _check().admit(_request(1, request), lambda: _pass(sorted(NODES)), ledger)
    assert ledger.claim_request_nonce(request.nonce, "other") is None


@pytest.mark.parametrize(
    ("request_session", "why"),
    [
        (lambda s: _request(1, s, kind="training"), "not one scoring pass"),
        (lambda s: _request(1, s, passes=2), "not one scoring pass"),
        (lambda s: _request(1, s, label_holder=2), "answering party is 2"),
        (
            lambda s: SimpleNamespace(**{**vars(_request(1, s)), "session_id": "elsewhere-1"}),
            "not a request of online session",
        ),
    ],
)
def test_a_request_session_other_than_one_pass_of_this_online_session_is_refused(
    ledger: OwnerLedger, request_session: Any, why: str
) -> None:
    with pytest.raises(RequestRefused, match=why):
        _check().admit(request_session(_signed()), lambda: _pass(sorted(NODES)), ledger)


def test_a_request_another_party_refused_first_is_refused_as_over(ledger: OwnerLedger) -> None:
    closed = PassInfo(pass_index=0, kind="done", round=None, output_nodes=[], reason="closed")
    with pytest.raises(RequestRefused, match=r"has no pass to run \(closed\)"):
        _check().admit(_request(1, _signed()), lambda: closed, ledger)


def test_every_pass_of_a_signed_request_is_its_one_pass_over_the_signed_nodes() -> None:
    request = _request(1, _signed())
    check = _check()

    check.check_pass(request, _pass(sorted(NODES)))
    check.check_pass(request, PassInfo(pass_index=1, kind="done", round=None, output_nodes=[]))
    wrong_pass = _pass(sorted(NODES)).model_copy(update={"pass_index": 1})
    for wrong in (_pass([7, 19]), wrong_pass):
        with pytest.raises(ProtocolViolation, match="other nodes than the signed"):
            check.check_pass(request, wrong)
