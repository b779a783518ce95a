"""Three real GLASU workers against the real service app, in process through an ASGI transport
(no sockets): the HTTP protocol end to end, and the same numbers as the in-process trainer."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from clients.local.asgi import InProcessTransport
from clients.local.session import session_request
from clients.policy import PrivacyPolicy
from clients.service_http import ConnectionOptions
from clients.session_client import ServiceClient
from clients.session_fit import LocalModelOptions
from clients.worker import WorkerRun
from models.config import TrainConfig
from models.layout import layout_federation
from models.trainer import train_inprocess
from secure.aggregation import PlainCodec
from service.app import create_app
from service.settings import ServiceSettings

CONFIG = TrainConfig(rounds=6, eval_every=3, hidden=32, encryption="none", dp=False, seed=3)


def run_federation(
    tmp_path: Path,
    config: TrainConfig,
    cora,
    *,
    service_class: Callable[[int], type[ServiceClient]] = lambda m: ServiceClient,
) -> tuple[list, dict]:
    """Run the federation's workers in threads; client m talks through ``service_class(m)``."""
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=tmp_path / "service.sqlite3", admin_token=token))
    transport = InProcessTransport(app)
    layout = layout_federation(config, cora)
    admin = ServiceClient(
        base_url="http://glasu.test",
        session_id="",
        client_index=0,
        token=token,
        options=ConnectionOptions(transport=transport),
    )
    created = admin._request("POST", "/v1/sessions", json=session_request(config, layout, cora))
    session = created.json()
    results: list = [None] * len(layout.partitions)
    errors: list[BaseException] = []
    options = LocalModelOptions(hidden=config.hidden, seed=config.seed)

    def work(m: int) -> None:
        try:
            torch.set_num_threads(1)
            with service_class(m)(
                base_url="http://glasu.test",
                session_id=session["session_id"],
                client_index=m,
                token=session["client_tokens"][m],
                options=ConnectionOptions(transport=transport, poll_seconds=5),
            ) as service:
                results[m] = WorkerRun(
                    service,
                    layout.partitions[m],
                    options=options,
                    codec=PlainCodec(),
                    policy=PrivacyPolicy(require_dp=False),  # a run without DP, on purpose
                    ledger=None,
                ).run()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(m,)) for m in range(len(layout.partitions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    status = admin._request("GET", f"/v1/sessions/{session['session_id']}").json()
    admin.close()
    transport.shutdown()
    if errors:
        raise errors[0]
    return results, status


def test_three_workers_over_the_protocol_match_the_inprocess_run(tmp_path: Path, cora) -> None:
    results, status = run_federation(tmp_path, CONFIG, cora)
    assert status["state"] == "finished"
    assert all(r.finished_reason == "finished" for r in results)
    assert status["current_pass"] == status["passes_total"]
    reference = train_inprocess(CONFIG, dataset=cora, progress=False)
    for i, entry in enumerate(reference.history):
        over_http = [r.history[i]["test_accuracy"] for r in results]
        assert sum(over_http) / len(over_http) == pytest.approx(entry.test_accuracy, abs=1e-9)
    # the workers' bodies were counted, and the service saw traffic from every client
    assert all(r.history[-1]["bytes_up"] > 0 and r.training_bytes > 0 for r in results)
    assert {t["client"] for t in status["traffic"] if t["bytes_up"] > 0} == {0, 1, 2}
