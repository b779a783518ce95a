"""A worker that dies after uploading its share, started again on its checkpoint, against the
real service app in process (no sockets): it completes the pass it was in and the run ends as
the uninterrupted in-process run; under DP its local ledger counts every release once."""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from clients.checkpoint import CheckpointStore
from clients.local.asgi import InProcessTransport
from clients.local.session import session_request
from clients.owner_ledger import OwnerLedger
from clients.policy import PrivacyPolicy
from clients.service_http import ConnectionOptions
from clients.session_client import SessionClient
from clients.session_fit import LocalModelOptions
from clients.worker import WorkerResult, WorkerRun
from models.config import TrainConfig
from models.layout import layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV
from models.trainer import train_inprocess
from secure.aggregation import PlainCodec
from secure.ckks import generate_keys, make_codec
from service.app import create_app
from service.settings import ServiceSettings

CONFIG = TrainConfig(
    rounds=3, eval_every=0, hidden=32, dp=True, epsilon=8.0, seed=5, device="cpu"
)  # passes: train 0, train 1, train 2, eval 3
CRASH_PASS, CRASH_CLIENT = 2, 1
POLICY = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)


class Crash(BaseException):
    """The worker's process dies (nothing of it runs on)."""


class DyingService(SessionClient):
    """Dies right after its share of ``crash_pass`` reached the service."""

    crash_pass = CRASH_PASS

    def put_share(self, pass_index: int, layer: int, payload: bytes, **kwargs: Any) -> None:
        super().put_share(pass_index, layer, payload, **kwargs)
        if pass_index == self.crash_pass:
            raise Crash


@dataclass
class Run:
    results: list[WorkerResult]
    status: dict[str, Any]
    privacy: dict[str, Any]
    ledger_releases: int


def run_with_a_crash(tmp_path: Path, config: TrainConfig, cora) -> Run:
    token = secrets.token_urlsafe(24)
    codec_factory: Any = PlainCodec
    public = None
    if config.encrypted:
        secret, public = generate_keys(tmp_path / "keys")
        codec_factory = lambda: make_codec(secret)  # noqa: E731
    app = create_app(
        ServiceSettings(
            database=tmp_path / "service.sqlite3", admin_token=token, public_context=public
        )
    )
    transport = InProcessTransport(app)
    layout = layout_federation(config, cora)
    admin = SessionClient(
        base_url="http://glasu.test", session_id="", client_index=0, token=token,
        options=ConnectionOptions(transport=transport),
    )  # fmt: skip
    session = admin._request(
        "POST", "/v1/sessions", json=session_request(config, layout, cora)
    ).json()
    sid = session["session_id"]
    options = LocalModelOptions(
        hidden=config.hidden, seed=config.seed, noise_seed=config.noise_seed
    )
    results: list[Any] = [None] * len(layout.partitions)
    errors: list[BaseException] = []

    def service(m: int, kind: type[SessionClient] = SessionClient) -> SessionClient:
        return kind(
            base_url="http://glasu.test", session_id=sid, client_index=m,
            token=session["client_tokens"][m],
            options=ConnectionOptions(transport=transport, poll_seconds=5),
        )  # fmt: skip

    def work(m: int) -> None:
        torch.set_num_threads(1)
        store = CheckpointStore(tmp_path / f"client-{m}" / "checkpoints", session_id=sid, client=m)
        attempts = [DyingService, SessionClient] if m == CRASH_CLIENT else [SessionClient]
        try:
            for kind in attempts:
                with (
                    service(m, kind) as connection,
                    OwnerLedger(tmp_path / f"client-{m}" / "ledger.sqlite3") as ledger,
                ):
                    try:
                        results[m] = WorkerRun(
                            connection,
                            layout.partitions[m],
                            options=options,
                            codec=codec_factory(),
                            policy=POLICY,
                            ledger=ledger,
                            checkpoints=store,
                        ).run()
                    except Crash:
                        continue
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(m,)) for m in range(len(layout.partitions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    status = admin._request("GET", f"/v1/sessions/{sid}").json()
    privacy = admin._request("GET", f"/v1/sessions/{sid}/privacy").json()
    admin.close()
    transport.shutdown()
    if errors:
        raise errors[0]
    with OwnerLedger(tmp_path / f"client-{CRASH_CLIENT}" / "ledger.sqlite3") as ledger:
        releases = ledger.releases(session_id=sid)
    return Run(results, status, privacy, releases)


def assert_counted_once(run: Run) -> None:
    passes = run.status["passes_total"]
    assert run.status["state"] == "finished" and run.status["current_pass"] == passes
    assert run.results[CRASH_CLIENT].resumed_from == [CRASH_PASS]
    assert [r.resumed_from for i, r in enumerate(run.results) if i != CRASH_CLIENT] == [[], []]
    assert run.privacy["releases"] == passes
    # the release of the pass recomputed after the crash is the same release: counted once,
    # and never fewer than the service served
    assert run.ledger_releases == passes


@pytest.mark.slow  # 10-30 s: CKKS on Cora, three workers in threads
def test_a_resumed_encrypted_worker_takes_over_its_filled_slot(
    tmp_path: Path, cora, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CKKS and DP (test noise seed): the re-encrypted share differs in bytes from the one the
    service holds (409 conflict); the worker recomputed the journaled plaintext, takes the sum,
    and the run equals the uninterrupted plaintext in-process run bit for bit."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    config = replace(CONFIG, encryption="ckks", noise_seed=13)
    caplog.set_level(logging.INFO, logger="clients.pass_driver")
    run = run_with_a_crash(tmp_path, config, cora)
    assert_counted_once(run)
    assert f"pass {CRASH_PASS}, layer 1: the service holds this worker's share" in caplog.text
    reference = train_inprocess(replace(config, encryption="none"), dataset=cora, progress=False)
    for i, entry in enumerate(reference.history):
        for key in ("val_accuracy", "test_accuracy", "reference_test_accuracy"):
            values = [r.history[i][key] for r in run.results]
            assert sum(values) / len(values) == pytest.approx(getattr(entry, key), abs=1e-12)


def test_a_resumed_private_worker_replays_its_cryptographic_noise(
    tmp_path: Path, cora, caplog: pytest.LogCaptureFixture
) -> None:
    """Plaintext shares, cryptographic noise: the pass recomputed after the crash has the same
    inputs, hence the same release-keyed noise, so its share is byte for byte the one the
    service holds (a different one would be refused), and the ledger counts it once."""
    caplog.set_level(logging.INFO, logger="clients.pass_driver")
    run = run_with_a_crash(tmp_path, replace(CONFIG, encryption="none"), cora)
    assert_counted_once(run)
    assert f"pass {CRASH_PASS}, layer 1: the same release as before" in caplog.text
    assert "the service holds this worker's share" not in caplog.text  # the same bytes
