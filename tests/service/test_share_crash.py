"""The served process dies between acknowledging shares and storing their sum: nothing that was
acknowledged is lost.

Running sums live in memory; what makes an acknowledged share durable is its file, written before
the transaction that acknowledges it commits (service/store/bodies/files.py). After a restart
the running sum is rebuilt from those files. Two kills, on a CKKS session (the rebuild parses
ciphertexts):

- SIGKILL after two of three shares were acknowledged (their running sum is in memory only); the
  third share, uploaded after the restart, completes a sum of all three;
- death at the moment the last share is committed and added, before the sum is stored (the
  served process is started through a bootstrap that replaces ``ShareSums._store`` with
  ``os._exit(137)``, as tests/service/test_ledger_crash.py does for the ledger); after the
  restart the first download stores the sum, and the retried upload is a harmless duplicate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_testkit import (
    ServedProcess,
    admin,
    bearer,
    client_path,
    matrix_headers,
    session_request,
    start_serve,
)

from secure.aggregation import to_grid
from secure.ckks import CkksCodec, generate_keys

KILLED = 137
CLIENTS, ROWS, WIDTH = 3, 5, 8  # one aggregation layer (the top), five output nodes

BOOTSTRAP = """\
import os, sys

from service.rounds import sums


def die_before_storing(self, *args, **kwargs):
    os._exit(137)  # every share committed and added; the sum is not stored, nothing answered


sums.ShareSums._store = die_before_storing

from clients.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def served() -> Iterator[list[ServedProcess]]:
    processes: list[ServedProcess] = []
    yield processes
    for process in processes:
        process.stop()


@pytest.fixture
def codec_and_context(tmp_path: Path) -> tuple[CkksCodec, Path]:
    secret, public = generate_keys(tmp_path / "keys")
    return CkksCodec.from_file(secret), public


def create_ckks_session(base: str) -> dict:
    request = session_request(
        clients=CLIENTS,
        layers=1,
        agg_layers=[{"layer": 1, "width": WIDTH}],
        rounds=1,
        eval_every=0,
        batch_size=ROWS,
        encryption="ckks",
    )
    created = httpx.post(f"{base}/v1/sessions", json=request, headers=admin(), timeout=60)
    assert created.status_code == 201, created.text
    return created.json()


def upload(base: str, created: dict, m: int, payload: bytes) -> httpx.Response:
    return httpx.put(
        f"{base}{client_path(created['session_id'], m)}/passes/0/layers/1/embedding",
        content=payload,
        headers={**bearer(created["client_tokens"][m]), **matrix_headers(ROWS, WIDTH, "ckks")},
        timeout=60,
    )


def assert_sum_served(base: str, created: dict, codec: CkksCodec, shares: list[np.ndarray]) -> None:
    expected = np.sum([to_grid(share) for share in shares], axis=0).astype(np.float32)
    for m in range(CLIENTS):
        total = httpx.get(
            f"{base}{client_path(created['session_id'], m)}/passes/0/layers/1/aggregate",
            headers=bearer(created["client_tokens"][m]),
            timeout=60,
        )
        assert total.status_code == 200, total.text
        assert total.headers["X-Glasu-Count"] == str(CLIENTS)
        np.testing.assert_array_equal(
            codec.decode_sum(total.content, rows=ROWS, cols=WIDTH), expected
        )


def make_shares() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.uniform(-4, 4, size=(ROWS, WIDTH)).astype(np.float32) for _ in range(CLIENTS)]


def test_acknowledged_shares_survive_a_kill(
    tmp_path: Path, served: list[ServedProcess], codec_and_context: tuple[CkksCodec, Path]
) -> None:
    codec, public = codec_and_context
    database = tmp_path / "service.sqlite3"
    context_args = ("--public-context", str(public))
    first = start_serve(tmp_path, database, name="first", extra_args=context_args)
    served.append(first)
    first.wait_healthy()
    created = create_ckks_session(first.url)
    shares = make_shares()
    payloads = [codec.encode(share) for share in shares]
    for m in (0, 1):
        assert upload(first.url, created, m, payloads[m]).status_code == 201
    first.process.kill()  # SIGKILL: the running sum of shares 0 and 1 was in memory only
    first.process.wait(timeout=30)

    restarted = start_serve(tmp_path, database, name="restarted", extra_args=context_args)
    served.append(restarted)
    restarted.wait_healthy()
    completing = upload(restarted.url, created, 2, payloads[2])
    assert completing.status_code == 201, completing.text
    assert completing.json()["missing"] == []
    assert_sum_served(restarted.url, created, codec, shares)
    # the acknowledged uploads stay idempotent
    assert upload(restarted.url, created, 0, payloads[0]).status_code == 200


def test_a_sum_not_stored_before_a_crash_is_stored_after_the_restart(
    tmp_path: Path, served: list[ServedProcess], codec_and_context: tuple[CkksCodec, Path]
) -> None:
    codec, public = codec_and_context
    database = tmp_path / "service.sqlite3"
    context_args = ("--public-context", str(public))
    crashing = start_serve(
        tmp_path, database, name="crashing", bootstrap=BOOTSTRAP, extra_args=context_args
    )
    served.append(crashing)
    crashing.wait_healthy()
    created = create_ckks_session(crashing.url)
    shares = make_shares()
    payloads = [codec.encode(share) for share in shares]
    for m in (0, 1):
        assert upload(crashing.url, created, m, payloads[m]).status_code == 201
    with pytest.raises(httpx.TransportError):
        upload(crashing.url, created, 2, payloads[2])  # committed, then the process dies
    assert crashing.process.wait(timeout=30) == KILLED, crashing.log_text()

    restarted = start_serve(tmp_path, database, name="restarted", extra_args=context_args)
    served.append(restarted)
    restarted.wait_healthy()
    assert_sum_served(restarted.url, created, codec, shares)
    retry = upload(restarted.url, created, 2, payloads[2])
    assert retry.status_code == 200 and retry.json()["status"] == "duplicate"
    status = httpx.get(
        f"{restarted.url}/v1/sessions/{created['session_id']}", headers=admin(), timeout=60
    ).json()
    assert status["current_pass"] == 1  # the stored sum completed pass 0
