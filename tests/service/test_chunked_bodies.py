"""Bodies that grow with N stay under the service's body limit, over real HTTP to a real
``glasu serve``: an alignment set larger than one part travels in parts and intersects
exactly; a session's node lists travel encoded where their JSON would not fit."""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_testkit import ADMIN_TOKEN, ServedProcess, admin, session_request, start_serve

from clients.admin import AdminClient
from clients.alignment import AlignmentClient, AlignmentOutcome, align
from clients.service_http import ConnectionOptions
from secure.body_limits import usable_bytes
from secure.wire.node_lists import encode_nodes
from secure.wire.sessions import SessionCreate

BODY_LIMIT = 4096  # bytes: 128 ristretto255 elements


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedProcess]:
    root = tmp_path_factory.mktemp("chunked")
    process = start_serve(
        root, root / "service.sqlite3", extra_args=("--max-body-bytes", str(BODY_LIMIT))
    )
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


def test_a_set_of_several_parts_goes_through_and_intersects_exactly(
    served: ServedProcess,
) -> None:
    rng = np.random.default_rng(3)
    common = [f"customer-{secrets.token_hex(5)}" for _ in range(150)]
    party_ids = []
    for name in ("bank", "insurer", "telco"):
        ids = common + [f"{name}-{secrets.token_hex(5)}" for _ in range(60)]
        party_ids.append([ids[i] for i in rng.permutation(len(ids))])
    assert len(party_ids[0]) * 32 > BODY_LIMIT  # whole, a set would be refused with 413
    with AdminClient(base_url=served.url, token=ADMIN_TOKEN) as admin_client:
        too_big = {"parties": 3, "part_elements": BODY_LIMIT // 32 + 1}
        with pytest.raises(Exception, match="GLASU_MAX_BODY_BYTES"):
            admin_client.create_alignment(too_big)
        created = admin_client.create_alignment({"parties": 3, "seed": 2, "part_elements": 64})
    outcomes: list[AlignmentOutcome | BaseException] = [RuntimeError("not run")] * 3

    def party(m: int) -> None:
        try:
            with AlignmentClient(
                base_url=served.url,
                alignment_id=created["alignment_id"],
                party=m,
                token=created["party_tokens"][m],
                options=ConnectionOptions(poll_seconds=2, peer_wait_seconds=60),
            ) as client:
                outcomes[m] = align(client, party_ids[m], workers=1)
        except BaseException as exc:  # surfaced below
            outcomes[m] = exc

    threads = [threading.Thread(target=party, args=(m,)) for m in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(isinstance(o, AlignmentOutcome) for o in outcomes), outcomes
    index = [
        dict(zip(ids, o.rows.tolist(), strict=True))  # type: ignore[union-attr]
        for ids, o in zip(party_ids, outcomes, strict=True)
    ]
    assert sorted(index[0][node] for node in common) == list(range(len(common)))
    for node in common:
        assert index[0][node] == index[1][node] == index[2][node]
    for ids, where in zip(party_ids, index, strict=True):
        assert all(where[node] == -1 for node in ids if node not in common)
    assert {o.aligned_nodes for o in outcomes} == {150}  # type: ignore[union-attr]


def test_node_lists_whose_json_would_pass_the_limit_travel_encoded(
    served: ServedProcess,
) -> None:
    rng = np.random.default_rng(5)
    nodes = rng.permutation(5000)
    train, evaluate = np.sort(nodes[:3000]), np.sort(nodes[3000:])
    listed = session_request(
        num_nodes=5000, train_nodes=train.tolist(), eval_nodes=evaluate.tolist()
    )
    assert len(json.dumps(listed)) > BODY_LIMIT
    refused = httpx.post(f"{served.url}/v1/sessions", json=listed, headers=admin(), timeout=30)
    assert refused.status_code == 413
    encoded = {**listed, "train_nodes": encode_nodes(train), "eval_nodes": encode_nodes(evaluate)}
    assert len(json.dumps(encoded)) < BODY_LIMIT
    created = httpx.post(f"{served.url}/v1/sessions", json=encoded, headers=admin(), timeout=30)
    assert created.status_code == 201, created.text
    sid, token = created.json()["session_id"], created.json()["client_tokens"][0]
    status = httpx.get(f"{served.url}/v1/sessions/{sid}", headers=admin(), timeout=30).json()
    assert (status["config"]["train_nodes_count"], status["config"]["eval_nodes_count"]) == (
        3000,
        2000,
    )
    info = httpx.get(
        f"{served.url}/v1/sessions/{sid}/clients/0/passes/0",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ).json()
    assert set(info["output_nodes"]) <= set(train.tolist()) and info["output_nodes"]
    bad = {**encoded, "eval_nodes": {**encode_nodes(evaluate), "count": 1999}}
    response = httpx.post(f"{served.url}/v1/sessions", json=bad, headers=admin(), timeout=30)
    assert response.status_code == 422 and "declares 16000 bytes" in response.text


def test_the_session_examples_of_the_api_guide_parse_as_written() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    bodies = re.findall(r"-d @- <<'EOF'\n(.*?)\nEOF", guide, flags=re.DOTALL)
    requests = [SessionCreate.model_validate_json(body) for body in bodies]
    assert [r.kind for r in requests] == ["training", "scoring"]
    training, scoring = requests
    assert training.train_nodes.tolist() == list(range(140))  # what the guide says they hold
    assert training.eval_nodes.tolist() == list(range(140, 1140))
    assert scoring.eval_nodes.tolist() == list(range(2708))


def test_the_service_states_its_limit_and_sizes_every_part_to_it(served: ServedProcess) -> None:
    """/healthz and the descriptions state the limit; a session's shares (4 bytes a float32
    value) and an alignment's sets (32 bytes an element) are cut in parts under it, less the
    headroom; a layer whose one row would not fit is refused at creation, saying why."""
    usable = usable_bytes(BODY_LIMIT)
    assert usable > BODY_LIMIT * 0.9
    assert httpx.get(f"{served.url}/healthz", timeout=30).json()["max_body_bytes"] == BODY_LIMIT
    created = httpx.post(f"{served.url}/v1/sessions", json=session_request(), headers=admin())
    sid = created.json()["session_id"]
    status = httpx.get(f"{served.url}/v1/sessions/{sid}", headers=admin(), timeout=30).json()
    assert status["max_body_bytes"] == BODY_LIMIT
    assert status["config"]["part_values"] == usable // 4
    with AdminClient(base_url=served.url, token=ADMIN_TOKEN) as admin_client:
        alignment = admin_client.create_alignment({"parties": 2})
        assert alignment["part_elements"] == usable // 32
        described = admin_client.alignment(alignment["alignment_id"])
        assert (described["part_elements"], described["max_body_bytes"]) == (
            usable // 32,
            BODY_LIMIT,
        )
    wide = session_request(agg_layers=[{"layer": 1, "width": usable // 4 + 1}])
    refused = httpx.post(f"{served.url}/v1/sessions", json=wide, headers=admin(), timeout=30)
    assert refused.status_code == 422
    assert "cannot carry one row" in refused.json()["detail"]
    too_many = session_request(part_values=usable // 4 + 1)
    refused = httpx.post(f"{served.url}/v1/sessions", json=too_many, headers=admin(), timeout=30)
    assert refused.status_code == 422 and "at most" in refused.json()["detail"]
