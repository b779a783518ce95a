"""A kept private sign model, deployed (a uvicorn service, three ``glasu worker`` processes on
loopback, Cora): a release session's workers keep their models (``--model-out``), and a scoring
session of them (``glasu session create --score-with``) is post-processing of the kept
releases: the service states no release, every owner's ledger records none, the label holder
writes its answer. Behind a lying service that offers a second pass, or asks for a wider block,
the worker refuses, and its ledger still shows no release for that session."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e_kit import Federation, start_federation

from clients.cli.main import main
from clients.local.processes import ManagedProcess, glasu_command, start_process
from clients.local.session import worker_arguments
from clients.owner_ledger import OwnerLedger, ledger_location
from models.artefact import load_model
from tests.e2e.lying_service import Exchange, lying_service
from tests.e2e.test_private_sign_http import GENEROUS_POLICY, UNSEEDED, VICTIM

pytestmark = pytest.mark.e2e


def ledger_of(fed: Federation, client: int) -> OwnerLedger:
    return OwnerLedger(ledger_location(fed.root / "partitions" / f"client-{client}"))


def scoring(
    fed: Federation,
    data_dir: Path,
    processes: list[ManagedProcess],
    name: str,
    *,
    server_for: Callable[[int], str],
) -> tuple[str, list[ManagedProcess]]:
    """A scoring session of the kept models over Cora's evaluation nodes; client m talks to
    ``server_for(m)``; the label holder (client 0) writes the answer."""
    out = fed.root / name
    assert main(["session", "create", "--server", fed.admin.base_url, "--admin-token-file",
                 str(fed.root / "admin.token"), "--score-with", fed.session_id, "--dataset",
                 "cora", "--data-dir", str(data_dir), "--out", str(out)]) == 0  # fmt: skip
    session = (out / "session.id").read_text()
    workers = []
    for m in range(UNSEEDED.clients):
        args = worker_arguments(
            UNSEEDED, server=server_for(m), session_id=session, client=m,
            token_file=out / f"client-{m}.token", data=fed.root / "partitions" / f"client-{m}",
            result=out / f"client-{m}.json", secret_context=None, threads=1, passes_total=1,
        )  # fmt: skip
        args += ["--model", str(fed.root / "models" / f"{m}")]
        if m == 0:
            args += ["--predictions", str(out / "predictions.csv")]
        if m == VICTIM:
            args += GENEROUS_POLICY
        worker = start_process(f"{name} {m}", glasu_command(*args), out / f"client-{m}.log")
        processes.append(worker)
        workers.append(worker)
    return session, workers


def offers_a_second_pass(exchange: Exchange) -> httpx.Response:
    """After the one pass, a made-up second one (over other nodes)."""
    if exchange.method == "GET" and re.search(r"/clients/\d+/passes/1$", exchange.path):
        second = {"pass": 1, "kind": "eval", "round": 0, "output_nodes": [0, 1, 2]}
        return httpx.Response(200, json=second)
    return exchange.forward()


def asks_for_a_wider_block(exchange: Exchange) -> httpx.Response:
    """The session's status says a block twice as wide as the kept release's."""
    answer = exchange.forward()
    if exchange.method == "GET" and re.fullmatch(r"/v1/sessions/[^/]+", exchange.path):
        body = answer.json()
        for layer in body["config"]["agg_layers"]:
            layer["width"] *= 2
        return httpx.Response(200, content=json.dumps(body).encode(), headers=answer.headers)
    return answer


@pytest.mark.slow  # a release session, then three scoring sessions of three worker processes
def test_a_kept_private_sign_model_scores_for_nothing_and_a_lying_service_gets_nothing_new(
    cora, data_dir: Path, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    models = tmp_path / "models"
    fed = start_federation(
        UNSEEDED, cora, tmp_path, processes, extra=lambda m: ["--model-out", str(models / f"{m}")]
    )
    for worker in fed.workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    for m in range(UNSEEDED.clients):
        manifest = load_model(models / f"{m}").manifest
        assert manifest["design"] == "private-sign"
        assert manifest["session_id"] == fed.session_id
        assert (manifest["sign_release"]["file"] is None) == (m == 0)  # the holder released none
    with ledger_of(fed, VICTIM) as ledger:
        trained = ledger.releases()
    assert trained == 1

    session, workers = scoring(
        fed, data_dir, processes, "honest", server_for=lambda m: fed.admin.base_url
    )
    for worker in workers:
        assert worker.process.wait(timeout=600) == 0, worker.tail()
    stated = fed.admin.privacy(session)
    assert (stated["releases"], stated["epsilon"], stated["epsilon_planned"]) == (0, 0.0, 0.0)
    lines = (tmp_path / "honest" / "predictions.csv").read_text().splitlines()
    assert len(lines) == 1 + 1000 + 500  # Cora's validation and test nodes, and a header
    for m in range(UNSEEDED.clients):
        with ledger_of(fed, m) as ledger:
            assert ledger.releases(session_id=session) == 0
            assert ledger.snapshot().sessions[session]["post_processes"] == fed.session_id
    with ledger_of(fed, VICTIM) as ledger:
        assert ledger.releases() == trained

    for lie, said in (
        (offers_a_second_pass, "releases nothing new; refusing"),
        (asks_for_a_wider_block, "trained with"),
    ):
        with lying_service(fed.admin.base_url, lie) as proxy:
            session, workers = scoring(
                fed, data_dir, processes, lie.__name__,
                server_for=lambda m, proxy=proxy: proxy if m == VICTIM else fed.admin.base_url,
            )  # fmt: skip
            victim = workers[VICTIM]
            assert victim.process.wait(timeout=300) != 0, victim.tail()
        assert said in victim.tail()
        with ledger_of(fed, VICTIM) as ledger:
            assert ledger.releases(session_id=session) == 0
            assert ledger.releases() == trained
