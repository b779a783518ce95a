"""The durable privacy ledger: one release per pass, refusal past the budget, restart safety."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    PRIVATE_AGG_LAYERS,
    Federation,
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    node_headers,
    nodes_body,
    private_session_request,
)

from secure import accounting, ckks
from service.app import service_context

pytestmark = pytest.mark.anyio

DELTA = 1e-5


def privacy(**overrides: Any) -> dict[str, Any]:
    # occurrence cap 0: the service derives the sensitivity 2C sqrt(c + 1) = 2.0
    settings: dict[str, Any] = {"delta": DELTA, "clip": 1.0, "occurrence_cap": 0}
    settings.update(overrides)
    return settings


async def test_privacy_off_reports_disabled(client: httpx.AsyncClient) -> None:
    created = await create_session(client)
    report = (
        await client.get(f"/v1/sessions/{created['session_id']}/privacy", headers=admin())
    ).json()
    assert report["enabled"] is False
    assert report["releases"] == 0 and report["ledger"] == []
    for key in ("epsilon", "delta", "noise_multiplier", "sensitivity", "clip", "epsilon_target"):
        assert report[key] is None


async def test_release_past_the_target_is_refused_and_the_ledger_survives_a_restart(
    make_app: Callable[..., FastAPI],
) -> None:
    z = 2.0
    eps = [accounting.epsilon_after(noise_multiplier=z, releases=k, delta=DELTA) for k in (2, 3)]
    target = (eps[0] + eps[1]) / 2  # room for exactly two releases
    settings = privacy(noise_multiplier=z, epsilon=target)
    request = private_session_request(settings, rounds=4, eval_every=0)
    first = make_app()
    async with http_client(first) as http:
        created = await create_session(http, **request)
        assert created["noise_multiplier"] == z
        sid, tokens = created["session_id"], created["client_tokens"]
        federation = Federation(http, created, request)
        for p in (0, 1):
            record = await federation.run_pass(p)
            assert record.info["kind"] == "train"

        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["state"] == "budget_exhausted" and status["current_pass"] == 2
        done = await federation.pass_info(0, 2)
        assert (done["kind"], done["reason"]) == ("done", "budget-exhausted")
        upload = await http.put(
            f"{client_path(sid, 0)}/passes/2/layers/1/nodes",
            content=nodes_body([1]),
            headers={**bearer(tokens[0]), **node_headers(np.asarray([1]))},
        )
        assert_problem(upload, 409, "privacy-budget-exhausted", mentions="pass 2")
        download = await http.get(
            f"{client_path(sid, 0)}/passes/2/layers/1/aggregate", headers=bearer(tokens[0])
        )
        assert_problem(download, 409, "privacy-budget-exhausted")
        previous = await http.get(
            f"{client_path(sid, 0)}/passes/1/layers/1/aggregate", headers=bearer(tokens[0])
        )
        assert previous.status_code == 200  # what was released stays downloadable
        before = (await http.get(f"/v1/sessions/{sid}/privacy", headers=bearer(tokens[1]))).json()
    service_context(first).close()

    assert before["enabled"] is True and before["releases"] == 2
    assert [entry["pass"] for entry in before["ledger"]] == [0, 1]
    assert before["epsilon"] == pytest.approx(eps[0])
    assert before["epsilon"] <= target < eps[1]
    assert before["epsilon_target"] == target and before["delta"] == DELTA
    assert (before["noise_multiplier"], before["sensitivity"], before["clip"]) == (z, 2.0, 1.0)
    assert before["noise_std"] == pytest.approx(z * 2.0)
    assert before["accountant"] == "rdp" and before["noise_multiplier_source"] == "given"

    async with http_client(make_app()) as http:
        after = (await http.get(f"/v1/sessions/{sid}/privacy", headers=admin())).json()
        assert after == before
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["state"] == "budget_exhausted"
        assert status["privacy"] == before


async def test_calibrated_noise_covers_every_pass(client: httpx.AsyncClient) -> None:
    settings = privacy(epsilon=4.0, accountant="rdp")
    request = private_session_request(settings, rounds=2, eval_every=1)  # 4 passes, 4 releases
    created = await create_session(client, **request)
    z = created["noise_multiplier"]
    assert z is not None and z > 0
    federation = Federation(client, created, request)
    for p in range(created["passes_total"]):
        await federation.run_pass(p)
    sid = created["session_id"]
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["state"] == "finished"
    report = status["privacy"]
    assert report["noise_multiplier_source"] == "calibrated"
    assert report["releases"] == 4 and [e["pass"] for e in report["ledger"]] == [0, 1, 2, 3]
    assert report["epsilon"] <= 4.0 + 1e-9
    assert report["epsilon"] == pytest.approx(report["epsilon_planned"])
    epsilons = [e["epsilon"] for e in report["ledger"]]
    assert epsilons == sorted(epsilons)


async def test_max_releases_caps_the_session(client: httpx.AsyncClient) -> None:
    request = private_session_request(privacy(noise_multiplier=1.0, max_releases=1))
    created = await create_session(client, **request)
    federation = Federation(client, created, request)
    await federation.run_pass(0)
    assert (await federation.pass_info(2, 1))["reason"] == "budget-exhausted"
    report = (
        await client.get(f"/v1/sessions/{created['session_id']}/privacy", headers=admin())
    ).json()
    assert report["releases"] == 1 and report["max_releases"] == 1


async def test_a_target_below_one_release_is_refused_at_creation(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions",
        json=private_session_request(privacy(noise_multiplier=0.5, epsilon=1e-3)),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="single release")


async def test_shared_noise_needs_encryption(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions",
        json=private_session_request(privacy(noise_multiplier=1.0, shared_noise=True)),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="shared_noise needs encryption")


async def test_shared_noise_over_a_union_alignment_is_refused(client: httpx.AsyncClient) -> None:
    """Rows a party lacks are zero in its share, noise included: with shared noise the sum's
    rows would carry less noise than the ledger counts."""
    response = await client.post(
        "/v1/sessions",
        json=private_session_request(
            privacy(noise_multiplier=1.0, shared_noise=True), nodes="union", encryption="ckks"
        ),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="needs unshared noise")


async def test_shared_noise_is_accounted_against_a_curious_peer(
    make_app: Callable[..., FastAPI], tmp_path: Path
) -> None:
    _, public = ckks.generate_keys(tmp_path / "keys")
    async with http_client(make_app(public_context=public)) as http:
        created = await create_session(
            http,
            **private_session_request(
                privacy(epsilon=5.0, shared_noise=True), clients=4, encryption="ckks"
            ),
        )
        report = (
            await http.get(f"/v1/sessions/{created['session_id']}/privacy", headers=admin())
        ).json()
    z = created["noise_multiplier"]
    assert report["noise_multiplier"] == z
    assert report["ledger_noise_multiplier"] == pytest.approx(z * np.sqrt(3 / 4))
    planned = accounting.epsilon_after(
        noise_multiplier=report["ledger_noise_multiplier"],
        releases=created["passes_total"],
        delta=DELTA,
    )
    assert planned == pytest.approx(report["epsilon_planned"]) and planned <= 5.0
    alone = accounting.calibrate_noise_multiplier(
        epsilon=5.0, delta=DELTA, releases=created["passes_total"]
    )
    assert z == pytest.approx(alone / np.sqrt(3 / 4), rel=1e-6)


async def test_extreme_parameters_are_refused_not_crashed(client: httpx.AsyncClient) -> None:
    cases = [
        (privacy(noise_multiplier=1e-300), "cannot evaluate"),
        (privacy(noise_multiplier=1e-6, accountant="prv"), "cannot evaluate"),
        (privacy(noise_multiplier=2e6), "body.privacy.noise_multiplier"),
        (privacy(epsilon=1e-300), "body.privacy.epsilon"),
        # the sensitivity is derived by the service, never posted
        (privacy(noise_multiplier=1.0, sensitivity=2.0), "body.privacy.sensitivity"),
    ]
    for settings, mentions in cases:
        response = await client.post(
            "/v1/sessions", json=private_session_request(settings), headers=admin()
        )
        assert_problem(response, 422, "validation-error", mentions=mentions)


async def test_a_private_session_aggregates_at_the_release_layer_only(
    client: httpx.AsyncClient,
) -> None:
    """The workers' private arrangement releases one noisy matrix per pass at layer 1
    (secure.privacy.RELEASE_LAYER) and nothing else: other aggregation layers are refused at
    creation, before any token exists, instead of by every worker later."""
    settings = privacy(noise_multiplier=2.0)
    refused = [
        [{"layer": 1, "width": 8}, {"layer": 3, "width": 4}],  # GLASU's own K=2 arrangement
        [{"layer": 2, "width": 8}],
        [{"layer": 3, "width": 8}],  # the top layer
    ]
    for agg_layers in refused:
        response = await client.post(
            "/v1/sessions",
            json=private_session_request(settings, agg_layers=agg_layers),
            headers=admin(),
        )
        assert_problem(
            response, 422, "validation-error", mentions="the only aggregation layer must be layer 1"
        )
        layers = [a["layer"] for a in agg_layers]
        assert f"got aggregation layers {layers}" in response.json()["detail"]
    assert (await client.get("/v1/sessions", headers=admin())).json() == []
    # The same layers without privacy are GLASU's arrangement and are accepted.
    await create_session(client, agg_layers=refused[0])
    created = await create_session(client, **private_session_request(settings))
    assert created["noise_multiplier"] == 2.0
    status = (await client.get(f"/v1/sessions/{created['session_id']}", headers=admin())).json()
    assert status["config"]["agg_layers"] == PRIVATE_AGG_LAYERS


async def test_metrics_are_refused_in_a_private_session(client: httpx.AsyncClient) -> None:
    """A loss or an accuracy computed on clean features would be a release the ledger does not
    count: under DP the service takes no metrics (not even an empty report)."""
    request = private_session_request(privacy(noise_multiplier=2.0))
    created = await create_session(client, **request)
    sid, tokens = created["session_id"], created["client_tokens"]
    await Federation(client, created, request).run_pass(0)
    for body in ({"loss": 0.7, "val_accuracy": 0.5}, {}):
        response = await client.post(
            f"{client_path(sid, 1)}/passes/0/metrics", json=body, headers=bearer(tokens[1])
        )
        assert_problem(response, 409, "metrics-refused", mentions="differential privacy")
        assert "ledger does not count" in response.json()["detail"]
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["metrics"] == []
    assert status["privacy"]["releases"] == 1  # refusing metrics touches nothing else

    # Without privacy the same report is stored.
    plain = await create_session(client)
    response = await client.post(
        f"{client_path(plain['session_id'], 0)}/passes/0/metrics",
        json={"loss": 0.7},
        headers=bearer(plain["client_tokens"][0]),
    )
    assert response.status_code == 204


async def test_the_reported_sensitivity_is_derived_by_the_service(
    client: httpx.AsyncClient,
) -> None:
    """Delta = 2 C sqrt(c + 1) from the posted clip and occurrence cap, never posted itself."""
    z = 3.0
    created = await create_session(
        client,
        **private_session_request(privacy(noise_multiplier=z, clip=0.5, occurrence_cap=3)),
    )
    sid = created["session_id"]
    report = (await client.get(f"/v1/sessions/{sid}/privacy", headers=admin())).json()
    expected = 2 * 0.5 * np.sqrt(3 + 1)
    assert expected == 2.0
    assert report["sensitivity"] == pytest.approx(expected)
    assert (report["clip"], report["occurrence_cap"]) == (0.5, 3)
    assert report["noise_std"] == pytest.approx(z * expected)
    status = (await client.get(f"/v1/sessions/{sid}", headers=admin())).json()
    assert status["privacy"] == report
    assert "sensitivity" not in status["config"]["privacy"]  # a derived value, not a setting
