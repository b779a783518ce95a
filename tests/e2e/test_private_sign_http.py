"""The private sign design over real HTTP (a uvicorn service, three ``glasu worker`` processes
on loopback, Cora): a session of kind "release" is one pass; each releasing party's ledger
counts one release; the accuracies are the in-process run's (seeded noise, plain shares); and a
lying service that offers a second release pass, or plans one, is refused before the worker
releases again."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import httpx
import pytest

from clients.local.federation import train_over_http
from clients.local.processes import ManagedProcess, free_port
from clients.owner_ledger import OwnerLedger, ledger_location
from models.config import TrainConfig
from models.layout import layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV
from models.trainer import train_inprocess
from secure.privacy import SessionPrivacy
from tests.e2e.e2e_kit import start_federation
from tests.e2e.lying_service import Exchange, lying_service

pytestmark = pytest.mark.e2e

CONFIG = TrainConfig(
    backbone="sign", layers=1, agg_layers=1, stale=1, hops=2, hidden=16, batch_size=140,
    rounds=20, eval_every=10, encryption="ckks", epsilon=4.0, noise_seed=3, device="cpu",
    label_holder=0, seed=5,
)  # fmt: skip
VICTIM = 1
# the workers' own noise, plain shares (the federation kit provisions no CKKS keys)
UNSEEDED = dataclasses.replace(CONFIG, noise_seed=None, encryption="none")
GENEROUS_POLICY = ["--max-session-epsilon", "100", "--max-lifetime-epsilon", "100"]


def ledger_releases(root: Path, client: int) -> list[tuple[int, str]]:
    """(pass, kind) of every release in client ``client``'s ledger."""
    with OwnerLedger(ledger_location(root / "partitions" / f"client-{client}")) as ledger:
        rows = ledger._connection.execute(
            "SELECT pass_index, kind FROM releases ORDER BY id"
        ).fetchall()
    return [(int(p), str(kind)) for p, kind in rows]


@pytest.mark.slow  # 40-80 s: a service, three worker processes, then the in-process run
def test_the_private_sign_design_over_http_equals_the_in_process_run(
    cora, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded noise, CKKS shares: the workers release what the in-process parties release,
    so the label holder's head trains on the same blocks up to the encoding (CKKS decodes the
    sum within about 1e-4 of the clip; plain shares travel rounded to the 2^-12 grid; in
    process the sum is exact), which can move a near-chance head's accuracy by a few test
    nodes (0.158 against 0.163 in one plain run): within 0.01; the party alone, which reads no
    block, exactly. The service and each releasing party count one release, the holder
    none."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")  # the workers inherit it
    over_http = train_over_http(
        CONFIG, layout_federation(CONFIG, cora), cora, progress=False, work_dir=tmp_path
    )
    in_process = train_inprocess(CONFIG, dataset=cora, progress=False)
    assert [h.test_accuracy for h in over_http.history] == pytest.approx(
        [h.test_accuracy for h in in_process.history], abs=0.01
    )
    assert over_http.reference_test_accuracy == pytest.approx(
        in_process.reference_test_accuracy, abs=1e-9
    )
    assert over_http.privacy is not None and in_process.privacy is not None
    assert over_http.privacy["releases"] == in_process.privacy["releases"] == 1
    assert over_http.privacy["epsilon"] == pytest.approx(in_process.privacy["epsilon"], rel=1e-9)
    assert [h.epsilon for h in over_http.history] == [over_http.privacy["epsilon"]] * 2
    assert "one degree-normalised release per party" in over_http.notes[-1]
    released = [ledger_releases(tmp_path, m) for m in range(CONFIG.clients)]
    assert released[0] == []  # the label holder has the only labels: it releases nothing
    assert released[1:] == [[(0, "training")]] * 2  # one release each, which feeds training


def offers_a_second_pass(exchange: Exchange) -> httpx.Response:
    """After the release, a made-up second release pass (an evaluation pass, as the first)."""
    if exchange.method == "GET" and re.search(r"/clients/\d+/passes/1$", exchange.path):
        second = {"pass": 1, "kind": "eval", "round": 0, "output_nodes": [0, 1]}
        return httpx.Response(200, json=second)
    return exchange.forward()


def plans_two_passes(exchange: Exchange) -> httpx.Response:
    """The session's status says two passes (a plan of two releases) and the epsilon of two
    releases, consistently (the victim's policy allows it: only the design's own check stands
    in the way)."""
    answer = exchange.forward()
    if exchange.method == "GET" and re.fullmatch(r"/v1/sessions/[^/]+", exchange.path):
        body = answer.json()
        body["passes_total"] = 2
        two = SessionPrivacy.restore(
            body["config"]["privacy"], clients=3, passes_total=2, encrypted=False, masked=False
        )
        body["privacy"]["epsilon_planned"] = two.epsilon_planned
        return httpx.Response(200, content=json.dumps(body).encode(), headers=answer.headers)
    return answer


@pytest.mark.slow  # two federations of three worker processes
def test_a_lying_service_cannot_make_a_worker_release_twice(
    cora, tmp_path: Path, processes: list[ManagedProcess]
) -> None:
    """Behind a lying proxy the victim refuses a second release pass after its release (its
    ledger: one release), and a plan of two passes before any (its ledger: none)."""
    for lie, expected, said in (
        (offers_a_second_pass, 1, "releases this data once; refusing"),
        (plans_two_passes, 0, "plans 2 passes"),
    ):
        root = tmp_path / lie.__name__
        root.mkdir()
        port = free_port()
        with lying_service(f"http://127.0.0.1:{port}", lie) as proxy:
            fed = start_federation(
                UNSEEDED, cora, root, processes, port=port,
                server_for=lambda client, url, proxy=proxy: proxy if client == VICTIM else url,
                extra=lambda client: GENEROUS_POLICY if client == VICTIM else [],
            )  # fmt: skip
            victim = fed.workers[VICTIM]
            assert victim.process.wait(timeout=300) != 0, victim.tail()
        assert said in victim.tail()
        assert len(ledger_releases(root, VICTIM)) == expected
