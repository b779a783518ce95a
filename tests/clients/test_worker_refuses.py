"""A worker enforces its organisation's privacy policy against the real service app (in process
through an ASGI transport): a session that is not private, noisier-sounding than it is, or over
the budget is refused before the worker sends a byte; a second session continues the local
ledger."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clients.checkpoint import CheckpointStore
from clients.local.asgi import InProcessTransport
from clients.local.session import session_request
from clients.owner_ledger import OwnerLedger, SessionAbout
from clients.policy import PolicyRefusal, PrivacyPolicy
from clients.service_http import ConnectionOptions
from clients.session_client import SessionClient
from clients.session_fit import LocalModelOptions
from clients.settings import WorkerSettings
from clients.worker import WorkerRun
from models.config import TrainConfig
from models.layout import layout_federation
from secure.aggregation import PlainCodec
from secure.release_noise import ReleaseMechanism
from service.app import create_app
from service.settings import ServiceSettings

PRIVATE = TrainConfig(rounds=3, eval_every=0, hidden=16, encryption="none", seed=1)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[InProcessTransport, str]]:
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=tmp_path / "service.sqlite3", admin_token=token))
    yield InProcessTransport(app), token


def create(service: tuple[InProcessTransport, str], config: TrainConfig, cora) -> dict[str, Any]:
    transport, token = service
    body = session_request(config, layout_federation(config, cora), cora)
    with httpx.Client(base_url="http://glasu.test", transport=transport) as http:
        response = http.post(
            "/v1/sessions", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    assert response.status_code == 201, response.text
    return response.json()


def join(
    service: tuple[InProcessTransport, str],
    created: dict[str, Any],
    config: TrainConfig,
    cora,
    *,
    policy: PrivacyPolicy,
    ledger: OwnerLedger,
    checkpoints: CheckpointStore | None = None,
) -> SessionClient:
    """Client 0 tries to take part; returns its client (traffic counted) after the attempt."""
    partition = layout_federation(config, cora).partitions[0]
    client = SessionClient(
        base_url="http://glasu.test",
        session_id=created["session_id"],
        client_index=0,
        token=created["client_tokens"][0],
        options=ConnectionOptions(transport=service[0]),
    )
    with pytest.raises(PolicyRefusal) as refused:
        WorkerRun(
            client,
            partition,
            options=LocalModelOptions(hidden=config.hidden),
            codec=PlainCodec(),
            policy=policy,
            ledger=ledger,
            checkpoints=checkpoints,
        ).run()
    client.refusal = str(refused.value)  # type: ignore[attr-defined]
    return client


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (dataclasses.replace(PRIVATE, dp=False), "no differential privacy"),
        (dataclasses.replace(PRIVATE, epsilon=None, noise_multiplier=0.5), "per session"),
        (dataclasses.replace(PRIVATE, epsilon=8.0), "allows 4 per session"),
    ],
)
def test_refused_before_sending_a_byte(
    service, cora, tmp_path: Path, config: TrainConfig, says: str
) -> None:
    created = create(service, config, cora)
    with OwnerLedger.beside(tmp_path / "data") as ledger:
        client = join(service, created, config, cora, policy=PrivacyPolicy(), ledger=ledger)
        assert says in client.refusal  # type: ignore[attr-defined]
        assert client.traffic.up == 0  # only reads: nothing of this data left the worker
        assert ledger.releases() == 0


def test_a_second_session_continues_the_local_ledger(service, cora, tmp_path: Path) -> None:
    with OwnerLedger.beside(tmp_path / "data") as ledger:
        ledger.record(session_id="earlier", pass_index=0, noise_multiplier=1.2)  # spent ~3.9
        created = create(service, PRIVATE, cora)
        client = join(
            service,
            created,
            PRIVATE,
            cora,
            policy=PrivacyPolicy(max_lifetime_epsilon=5.0),
            ledger=ledger,
        )
        assert "lifetime" in client.refusal and client.traffic.up == 0  # type: ignore[attr-defined]


def test_a_session_id_that_released_is_refused_without_its_checkpoint(
    service, cora, tmp_path: Path
) -> None:
    """The session already released this data (a first run, its checkpoints gone): a worker
    without a checkpoint of it is refused before it sends a byte."""
    created = create(service, PRIVATE, cora)
    sid = created["session_id"]
    with OwnerLedger.beside(tmp_path / "data") as ledger:
        ledger.record(session_id=sid, pass_index=0, noise_multiplier=5.0)
        policy = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
        client = join(service, created, PRIVATE, cora, policy=policy, ledger=ledger)
        assert "already released this data 1 times" in client.refusal  # type: ignore[attr-defined]
        assert client.traffic.up == 0 and ledger.releases() == 1


def test_a_session_id_admitted_with_another_mechanism_is_refused_even_with_a_checkpoint(
    service, cora, tmp_path: Path
) -> None:
    created = create(service, PRIVATE, cora)
    sid = created["session_id"]
    store = CheckpointStore(tmp_path / "checkpoints", session_id=sid, client=0)
    store.path.parent.mkdir()
    store.path.write_bytes(b"")  # there is one (it is refused before it is read)
    with OwnerLedger.beside(tmp_path / "data") as ledger:
        plan = PRIVATE.session_privacy(
            clients=PRIVATE.clients, passes_total=created["passes_total"]
        )
        assert plan is not None
        earlier = ReleaseMechanism.of(
            dataclasses.replace(plan, noise_multiplier=plan.noise_multiplier / 2),
            width=PRIVATE.release_width,
            encoding="none",
        )
        ledger.note_session(sid, SessionAbout(), mechanism=earlier.canonical())
        policy = PrivacyPolicy(max_session_epsilon=100.0, max_lifetime_epsilon=100.0)
        client = join(
            service, created, PRIVATE, cora, policy=policy, ledger=ledger, checkpoints=store
        )
        refusal = client.refusal  # type: ignore[attr-defined]
        assert "another release mechanism" in refusal and "noise_multiplier" in refusal
        assert client.traffic.up == 0 and ledger.releases() == 0


def test_plain_http_to_a_network_address_needs_an_explicit_flag(tmp_path: Path) -> None:
    base = dict(session="s", client=0, token_file=tmp_path / "t", data=tmp_path)
    with pytest.raises(ValueError, match="--insecure-http"):
        WorkerSettings(server="http://192.0.2.7:8000", **base)
    assert WorkerSettings(server="http://192.0.2.7:8000", insecure_http=True, **base)
    assert WorkerSettings(server="http://127.0.0.1:8000", **base)
    assert WorkerSettings(server="http://localhost:8000", **base)
    assert WorkerSettings(server="https://service.example:8443", **base)


def test_the_policy_comes_from_flags_environment_or_a_settings_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings_file = tmp_path / "worker.toml"
    settings_file.write_text("max_session_epsilon = 2.0\nmax_lifetime_epsilon = 6.0\n")
    base = dict(server="http://127.0.0.1:1", session="s", client=0, token_file="t", data="d")
    monkeypatch.setenv("GLASU_MAX_LIFETIME_EPSILON", "7.5")
    settings = WorkerSettings(**base, settings_file=settings_file)
    policy = settings.policy()
    assert policy.max_session_epsilon == 2.0  # from the file
    assert policy.max_lifetime_epsilon == 7.5  # the environment wins over the file
    flagged = WorkerSettings(**base, settings_file=settings_file, max_session_epsilon=1.0)
    assert flagged.policy().max_session_epsilon == 1.0  # a flag wins over both
