"""The durable privacy ledger: one release per pass, refusal past the budget, restart safety."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from service_testkit import (
    Federation,
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    node_headers,
    nodes_body,
    session_request,
)

from service.app import service_context

pytestmark = pytest.mark.anyio

DELTA = 1e-5


@pytest.fixture
def accounting() -> ModuleType:
    return pytest.importorskip("secure.accounting")


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
    make_app: Callable[..., FastAPI], accounting: ModuleType
) -> None:
    z = 2.0
    eps = [accounting.epsilon_after(noise_multiplier=z, releases=k, delta=DELTA) for k in (2, 3)]
    target = (eps[0] + eps[1]) / 2  # room for exactly two releases
    request = session_request(rounds=4, eval_every=0)
    first = make_app()
    async with http_client(first) as http:
        created = await create_session(
            http, rounds=4, eval_every=0, privacy=privacy(noise_multiplier=z, epsilon=target)
        )
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
            f"{client_path(sid, 0)}/passes/1/layers/3/aggregate", headers=bearer(tokens[0])
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


async def test_calibrated_noise_covers_every_pass(
    client: httpx.AsyncClient, accounting: ModuleType
) -> None:
    request = session_request(rounds=2, eval_every=1)  # 4 passes, 4 releases
    created = await create_session(
        client, rounds=2, eval_every=1, privacy=privacy(epsilon=4.0, accountant="rdp")
    )
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


async def test_max_releases_caps_the_session(
    client: httpx.AsyncClient, accounting: ModuleType
) -> None:
    request = session_request()
    created = await create_session(client, privacy=privacy(noise_multiplier=1.0, max_releases=1))
    federation = Federation(client, created, request)
    await federation.run_pass(0)
    assert (await federation.pass_info(2, 1))["reason"] == "budget-exhausted"
    report = (
        await client.get(f"/v1/sessions/{created['session_id']}/privacy", headers=admin())
    ).json()
    assert report["releases"] == 1 and report["max_releases"] == 1


async def test_a_target_below_one_release_is_refused_at_creation(
    client: httpx.AsyncClient, accounting: ModuleType
) -> None:
    response = await client.post(
        "/v1/sessions",
        json=session_request(privacy=privacy(noise_multiplier=0.5, epsilon=1e-3)),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="single release")


async def test_shared_noise_needs_encryption(
    client: httpx.AsyncClient, accounting: ModuleType
) -> None:
    response = await client.post(
        "/v1/sessions",
        json=session_request(privacy=privacy(noise_multiplier=1.0, shared_noise=True)),
        headers=admin(),
    )
    assert_problem(response, 422, "validation-error", mentions="shared_noise needs encryption")


async def test_shared_noise_is_accounted_against_a_curious_peer(
    make_app: Callable[..., FastAPI], accounting: ModuleType, tmp_path: Path
) -> None:
    he = pytest.importorskip("secure.he")
    _, public = he.generate_keys(tmp_path / "keys")
    async with http_client(make_app(public_context=public)) as http:
        created = await create_session(
            http,
            clients=4,
            encryption="ckks",
            privacy=privacy(epsilon=5.0, shared_noise=True),
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


async def test_extreme_parameters_are_refused_not_crashed(
    client: httpx.AsyncClient, accounting: ModuleType
) -> None:
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
            "/v1/sessions", json=session_request(privacy=settings), headers=admin()
        )
        assert_problem(response, 422, "validation-error", mentions=mentions)
