"""`glasu worker` as its user runs it (the command's `main`, with its progress lines and exit
codes) against the real service app, in process through an ASGI transport: a passive party of a
label holder's session says what it has, and a session its data cannot satisfy is refused in one
sentence."""

from __future__ import annotations

import dataclasses
import math
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from clients import session_client as session_client_module
from clients.cli.errors import EXIT_FAILED
from clients.cli.main import main
from clients.cli.worker_cmd import evaluation_line
from clients.local.asgi import InProcessTransport
from clients.local.session import session_request, worker_arguments
from models.config import TrainConfig
from models.data.partition import NO_LABEL, save_partition
from models.layout import layout_federation
from models.outcome import PassOutcome
from service.app import create_app
from service.settings import ServiceSettings

CONFIG = TrainConfig(
    clients=2, rounds=2, eval_every=1, hidden=16, encryption="none", dp=False, seed=2
)


@pytest.fixture
def service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[InProcessTransport, str]]:
    """The service app; every worker's client reaches it whatever its --server says."""
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=tmp_path / "service.sqlite3", admin_token=token))
    asgi = InProcessTransport(app)

    class InProcessClient(session_client_module.SessionClient):
        def __init__(self, **kwargs: Any) -> None:
            options = dataclasses.replace(kwargs["options"], transport=asgi)
            super().__init__(**{**kwargs, "options": options})

    monkeypatch.setattr(session_client_module, "SessionClient", InProcessClient)
    yield asgi, token
    asgi.shutdown()


def create_session(service: tuple[InProcessTransport, str], body: dict[str, Any]) -> dict:
    asgi, token = service
    with httpx.Client(base_url="http://glasu.test", transport=asgi) as http:
        response = http.post(
            "/v1/sessions", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    assert response.status_code == 201, response.text
    return response.json()


def worker_argv(
    tmp_path: Path, config: TrainConfig, created: dict, m: int, data: Path
) -> list[str]:
    token = tmp_path / f"client-{m}.token"
    token.write_text(created["client_tokens"][m])
    args = worker_arguments(
        config,
        server="http://127.0.0.1:9",
        session_id=created["session_id"],
        client=m,
        token_file=token,
        data=data,
        result=tmp_path / f"client-{m}.json",
        secret_context=None,
        threads=1,
        passes_total=created["passes_total"],
    )
    return [arg for arg in args if arg != "--quiet"] + ["--no-checkpoint"]


def run_workers(argvs: list[list[str]]) -> list[int | BaseException]:
    codes: list[int | BaseException] = [RuntimeError("did not finish")] * len(argvs)

    def work(m: int) -> None:
        try:
            codes[m] = main(argvs[m])
        except BaseException as exc:  # the test reports it
            codes[m] = exc

    threads = [threading.Thread(target=work, args=(m,)) for m in range(len(argvs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return codes


def test_a_passive_party_prints_what_it_has(
    tmp_path: Path, cora, service, capsys: pytest.CaptureFixture
) -> None:
    config = TrainConfig(**{**CONFIG.to_dict(), "label_holder": 0, "data_dir": None})
    layout = layout_federation(config, cora)
    created = create_session(service, session_request(config, layout, cora))
    argvs = [
        worker_argv(tmp_path, config, created, p.client, save_partition(p, tmp_path / "parts"))
        for p in layout.partitions
    ]
    assert run_workers(argvs) == [0, 0]
    out = capsys.readouterr().out
    for round_index in (1, 2):
        assert f"client 1 round {round_index}: evaluated (no labels here" in out, out
        assert f"client 0 round {round_index}: loss " in out, out


def test_a_session_the_data_cannot_satisfy_is_refused_in_one_sentence(
    tmp_path: Path, cora, service, capsys: pytest.CaptureFixture
) -> None:
    """Every party trains against labels (no --label-holder), but client 1 has none."""
    layout = layout_federation(CONFIG, cora)
    created = create_session(service, session_request(CONFIG, layout, cora))
    # the split every aligned folder carries (glasu align run), but no label table
    unlabelled = dataclasses.replace(
        layout.partitions[1], labels=torch.full_like(layout.partitions[1].labels, NO_LABEL)
    )
    data = save_partition(unlabelled, tmp_path / "parts")
    code = main(worker_argv(tmp_path, CONFIG, created, 1, data))
    err = capsys.readouterr().err
    assert code == EXIT_FAILED, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"glasu worker: error: cannot take part in session {created['session_id']}"
    )
    assert "has no label for" in err and "glasu session create --label-holder M" in err


def test_an_evaluation_line_shows_the_party_alone_reference() -> None:
    private = PassOutcome(
        kind="eval", loss=0.5, val_accuracy=0.7, test_accuracy=0.71, reference_test_accuracy=0.6
    )
    assert evaluation_line(0, 20, private) == (
        "client 0 round 20: loss 0.5000 val 0.7000 test 0.7100 (party alone: test 0.6000)"
    )
    plain = PassOutcome(kind="eval", loss=0.5, val_accuracy=None, test_accuracy=0.71)
    assert evaluation_line(1, 3, plain) == "client 1 round 3: loss 0.5000 val n/a test 0.7100"
    passive = PassOutcome(kind="eval", loss=math.nan)
    assert evaluation_line(2, 3, passive).startswith("client 2 round 3: evaluated (no labels")
