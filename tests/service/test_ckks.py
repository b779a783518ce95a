"""CKKS sessions: the service adds ciphertexts with the public context only."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts
from fastapi import FastAPI
from service_testkit import (
    admin,
    assert_problem,
    bearer,
    client_path,
    create_session,
    http_client,
    matrix_headers,
    node_headers,
    nodes_body,
    session_request,
)

from secure import ckks
from service.app import service_context


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ckks.generate_keys(tmp_path_factory.mktemp("keys"))


def test_refuses_to_start_with_a_secret_context(
    make_app: Callable[..., FastAPI], keys: tuple[Path, Path]
) -> None:
    secret, _ = keys
    with pytest.raises(ckks.KeyMaterialError, match="secret key"):
        make_app(public_context=secret)


@pytest.mark.anyio
async def test_encrypted_session_sums_ciphertexts(
    make_app: Callable[..., FastAPI], keys: tuple[Path, Path]
) -> None:
    secret, public = keys
    app = make_app(public_context=public)
    loaded = service_context(app).aggregators.context
    assert loaded is not None and not ts.context_from(loaded.data).is_private()
    codec = ckks.CkksCodec.from_file(secret)
    async with http_client(app) as http:
        assert (await http.get("/healthz")).json()["encryption"] is True
        created = await create_session(
            http, clients=2, encryption="ckks", agg_layers=[{"layer": 3, "width": 3}]
        )
        sid, tokens = created["session_id"], created["client_tokens"]
        status = (await http.get(f"/v1/sessions/{sid}", headers=admin())).json()
        assert status["config"]["encoding"] == "ckks"
        assert status["config"]["public_context_sha256"] == loaded.sha256
        # the key id in every frame is the first 8 bytes of that digest (docs/encryption.md)
        assert loaded.sha256[: 2 * ckks.KEY_ID_BYTES] == codec.key_id.hex()
        rows = len(
            (await http.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[0]))).json()[
                "output_nodes"
            ]
        )
        rng = np.random.default_rng(0)
        shares = [rng.uniform(-1, 1, size=(rows, 3)) for _ in range(2)]
        url = "passes/0/layers/3/embedding"

        plain = await http.put(
            f"{client_path(sid, 0)}/{url}",
            content=shares[0].astype("<f4").tobytes(),
            headers={**bearer(tokens[0]), **matrix_headers(rows, 3, "float32")},
        )
        assert_problem(plain, 422, "wrong-encoding", mentions="'ckks'")
        garbage = await http.put(
            f"{client_path(sid, 0)}/{url}",
            content=b"GLCK" + b"\0" * 40,
            headers={**bearer(tokens[0]), **matrix_headers(rows, 3, "ckks")},
        )
        assert_problem(garbage, 422, "bad-payload")

        for m, share in enumerate(shares):
            response = await http.put(
                f"{client_path(sid, m)}/{url}",
                content=codec.encode(share),
                headers={**bearer(tokens[m]), **matrix_headers(rows, 3, "ckks")},
            )
            assert response.status_code == 201, response.text
        total = await http.get(
            f"{client_path(sid, 1)}/passes/0/layers/3/aggregate", headers=bearer(tokens[1])
        )
        assert total.status_code == 200
        assert total.headers["X-Glasu-Encoding"] == "ckks"
        assert total.headers["X-Glasu-Count"] == "2"
        decoded = codec.decode_sum(total.content, rows=rows, cols=3)
        np.testing.assert_allclose(decoded, shares[0] + shares[1], atol=1e-3)


@pytest.mark.anyio
async def test_ckks_session_limits(
    make_app: Callable[..., FastAPI], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    _, public = keys
    async with http_client(make_app(public_context=public)) as http:
        too_many = await http.post(
            "/v1/sessions",
            json=session_request(clients=ckks.MAX_SHARES + 1, encryption="ckks"),
            headers=admin(),
        )
        assert_problem(too_many, 422, "validation-error", mentions="at most")
        created = await create_session(http, clients=2, encryption="ckks")

    # Restarted with another key pair, the session's shares could not be added: refuse clearly.
    _, other_public = ckks.generate_keys(tmp_path / "other")
    async with http_client(make_app(public_context=other_public)) as http:
        sid, tokens = created["session_id"], created["client_tokens"]
        for m in range(2):
            response = await http.put(
                f"{client_path(sid, m)}/passes/0/layers/1/nodes",
                content=nodes_body([1]),
                headers={**bearer(tokens[m]), **node_headers(np.asarray([1]))},
            )
            assert response.status_code == 201
        response = await http.put(
            f"{client_path(sid, 0)}/passes/0/layers/1/embedding",
            content=b"x",
            headers={**bearer(tokens[0]), **matrix_headers(1, 8, "ckks")},
        )
        assert_problem(response, 409, "encryption-unavailable", mentions="different CKKS")


@pytest.mark.anyio
@pytest.mark.sqlite_only  # it checks the payload files; on PostgreSQL: test_postgres_store.py
async def test_each_share_is_parsed_once_and_the_sum_never_recomputed(
    make_app: Callable[..., FastAPI],
    keys: tuple[Path, Path],
    database: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shares are validated and parsed at upload and added into the running sum; downloads that
    long-poll while the shares arrive, and after, serve that sum without parsing anything again.
    Share and sum bodies stay out of SQLite."""
    secret, public = keys
    parsed: list[int] = []
    read_share = ckks.CkksSumAggregator.read_share

    def counting_read_share(self, payload: bytes, *, rows: int, cols: int) -> object:
        parsed.append(len(payload))
        return read_share(self, payload, rows=rows, cols=cols)

    monkeypatch.setattr(ckks.CkksSumAggregator, "read_share", counting_read_share)
    codec = ckks.CkksCodec.from_file(secret)
    clients, width = 3, 4
    async with http_client(make_app(public_context=public)) as http:
        created = await create_session(
            http, clients=clients, encryption="ckks", agg_layers=[{"layer": 3, "width": width}]
        )
        sid, tokens = created["session_id"], created["client_tokens"]
        info = await http.get(f"{client_path(sid, 0)}/passes/0", headers=bearer(tokens[0]))
        rows = len(info.json()["output_nodes"])
        shares = [np.full((rows, width), 0.5 * (m + 1)) for m in range(clients)]

        async def download(m: int) -> np.ndarray:
            response = await http.get(
                f"{client_path(sid, m)}/passes/0/layers/3/aggregate",
                params={"wait": 10},
                headers=bearer(tokens[m]),
            )
            assert response.status_code == 200, response.text
            return codec.decode_sum(response.content, rows=rows, cols=width)

        waiting = [asyncio.create_task(download(m)) for m in range(clients)]
        for m, share in enumerate(shares):
            put = await http.put(
                f"{client_path(sid, m)}/passes/0/layers/3/embedding",
                content=codec.encode(share),
                headers={**bearer(tokens[m]), **matrix_headers(rows, width, "ckks")},
            )
            assert put.status_code == 201, put.text
        sums = await asyncio.gather(*waiting) + [await download(m) for m in range(clients)]
    for total in sums:
        np.testing.assert_array_equal(total, np.sum(shares, axis=0).astype(np.float32))
    assert len(parsed) == clients  # one parse per share, none for the sum
    with sqlite3.connect(database) as db:
        bodies = db.execute(
            "SELECT COUNT(*) FROM uploads WHERE kind = 'embedding' AND body IS NOT NULL"
            " UNION ALL SELECT COUNT(*) FROM results WHERE kind = 'aggregate' AND body IS NOT NULL"
        ).fetchall()
    assert bodies == [(0,), (0,)]
    pass_dir = database.parent / f"{database.name}-payloads" / sid / "0"
    files = sorted(path.name.split("-")[:2][-1] for path in pass_dir.iterdir())
    assert files == [*(f"c{m}" for m in range(clients)), "l3.sum"]  # the shares and their sum
