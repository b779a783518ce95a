"""`glasu worker --online` before and after a request it refuses, without a service: online
mode needs the answering party's pinned key (or its owner's explicit acceptance of unsigned
requests), and a request refused at join leaves nothing in the predictions folder."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from nacl.signing import SigningKey

import clients.worker
from clients.cli.errors import EXIT_POLICY, UsageError
from clients.cli.keyfiles import online_request_check
from clients.cli.worker_cmd import run_session
from clients.predictions import own_ids_by_node
from clients.request_signing import RequestRefused
from clients.settings import WorkerSettings


def _settings(tmp_path: Path, **given: Any) -> WorkerSettings:
    settings = {"server": "http://127.0.0.1:9", "session": "0123abcd", "client": 1,
                "token_file": tmp_path / "token", "data": tmp_path, "online": True}  # fmt: skip
    return WorkerSettings(**{**settings, **given})


def test_online_mode_needs_the_answering_party_s_key_or_accepts_unsigned_by_name(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError, match="--online needs --answering-party-key M=PATH"):
        online_request_check(_settings(tmp_path))
    unsigned = online_request_check(_settings(tmp_path, accept_unsigned_requests=True))
    assert unsigned.key is None
    key = SigningKey.generate().verify_key
    (tmp_path / "signing.pub").write_text(bytes(key).hex() + "\n")
    pinned = online_request_check(
        _settings(tmp_path, answering_party_key=f"0={tmp_path / 'signing.pub'}")
    )
    assert pinned.party == 0 and pinned.key == key and pinned.online_id == "0123abcd"
    with pytest.raises(ValueError, match="M=PATH"):
        _settings(tmp_path, answering_party_key=f"0={tmp_path},1={tmp_path}")


def test_a_request_refused_at_join_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refusing(*_: Any, **__: Any) -> None:
        raise RequestRefused("request 0123abcd-2 replays the signed request of 0123abcd-1")

    monkeypatch.setattr(clients.worker, "WorkerRun", refusing)
    answers = tmp_path / "answers"
    settings = _settings(
        tmp_path, predictions=answers / "0123abcd-2.csv", no_checkpoint=True, session="0123abcd-2"
    )
    loaded = SimpleNamespace(
        token="t", verify=True, given=frozenset(), partition=None, options=None, codec=None,
        device="cpu", alignment_digest=None, transport=None,
        model=SimpleNamespace(manifest={"model": {"num_classes": 2}}),
        ids_of_node=own_ids_by_node(np.array([0]), pa.array(["c-1"]), aligned_nodes=1),
    )  # fmt: skip
    code = run_session(settings, loaded, tmp_path / "ledger.sqlite3", quiet=True)  # type: ignore[arg-type]
    assert code == EXIT_POLICY
    assert list(answers.iterdir()) == []
