"""Real ``glasu`` workers against the real service app in one process: the service through the
ASGI transport (no sockets), each worker in a thread of its own. bench/stragglers.py and
tests/clients/test_worker_asgi.py run their federations here."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clients.local.asgi import InProcessTransport
from clients.local.session import session_request
from clients.policy import PrivacyPolicy
from clients.service_http import ConnectionOptions
from clients.session_client import SessionClient
from clients.session_fit import LocalModelOptions
from clients.worker import WorkerResult, WorkerRun
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.layout import layout_federation
from secure.aggregation import PlainCodec
from service.app import create_app
from service.settings import ServiceSettings

URL = "http://glasu.test"


@dataclass
class InProcessRun:
    results: list[WorkerResult]  # client m's at index m
    status: dict[str, Any]  # the session's, once every worker has returned
    wall_seconds: float  # from the workers' start to the last one's return


def run_in_process(
    config: TrainConfig,
    dataset: GraphDataset,
    work: Path,
    *,
    service_class: Callable[[int], type[SessionClient]] = lambda m: SessionClient,
    join_timeout: float | None = None,
) -> InProcessRun:
    """One session of ``config`` (plaintext sums, no DP) on a fresh service app with its
    database in ``work``; client m talks through ``service_class(m)``. The first worker's
    failure is raised once all have returned (or ``join_timeout`` seconds passed for each)."""
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=work / "service.sqlite3", admin_token=token))
    transport = InProcessTransport(app)
    layout = layout_federation(config, dataset)
    admin = SessionClient(
        base_url=URL,
        session_id="",
        client_index=0,
        token=token,
        options=ConnectionOptions(transport=transport),
    )
    body = session_request(config, layout, dataset)
    session = admin._request("POST", "/v1/sessions", json=body).json()
    results: list[Any] = [None] * len(layout.partitions)
    errors: list[BaseException] = []
    options = LocalModelOptions(hidden=config.hidden, seed=config.seed)

    def work_as(m: int) -> None:
        try:
            torch.set_num_threads(1)
            with service_class(m)(
                base_url=URL,
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
        except BaseException as exc:  # raised below, in the caller's thread
            errors.append(exc)

    started = time.perf_counter()
    threads = [threading.Thread(target=work_as, args=(m,)) for m in range(len(layout.partitions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_timeout)
    wall_seconds = time.perf_counter() - started
    status = admin._request("GET", f"/v1/sessions/{session['session_id']}").json()
    admin.close()
    transport.shutdown()
    if errors:
        raise errors[0]
    return InProcessRun(results, status, wall_seconds)
