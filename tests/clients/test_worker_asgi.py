"""Three real GLASU workers against the real service app, in process through an ASGI transport
(no sockets): the HTTP protocol end to end, and the same numbers as the in-process trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from clients.session_client import SessionClient
from models.config import TrainConfig
from models.trainer import train_inprocess
from tests.support.asgi_federation import run_in_process

CONFIG = TrainConfig(rounds=6, eval_every=3, hidden=32, encryption="none", dp=False, seed=3)


def run_federation(
    tmp_path: Path,
    config: TrainConfig,
    cora,
    *,
    service_class: Callable[[int], type[SessionClient]] = lambda m: SessionClient,
) -> tuple[list, dict]:
    """The workers' results and the session's status; client m talks through
    ``service_class(m)``."""
    run = run_in_process(config, cora, tmp_path, service_class=service_class, join_timeout=300)
    return run.results, run.status


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
