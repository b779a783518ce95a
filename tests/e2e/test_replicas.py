"""The scaled-out service for real (issue 26): three ``glasu serve`` replicas on one PostgreSQL
database behind HAProxy (round robin per request, no stickiness), three ``glasu worker``
processes talking to HAProxy, encryption and DP on. One replica is killed with kill -9 in the
middle of a pass; training completes on the other two, and the run is the single-process one
(one ``glasu serve`` on SQLite, the same seeds): the same accuracies, the same ledger."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from clients.admin import AdminClient
from clients.local.federation import LocalFederation, train_over_http
from clients.local.processes import stop_all
from clients.local.run_summary import summary_from_workers
from clients.local.session import session_request
from models.config import TrainConfig
from models.layout import layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV
from models.run_summary import RunSummary
from tests.support.replicas import HAProxy, haproxy_binary, start_replicas

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        haproxy_binary() is None,
        reason="HAProxy is not installed (Debian: apt-get install haproxy; .ci/run does)",
    ),
]

REPLICAS = 3
VICTIM = 1
KILL_AT_PASS = 2  # passes 0 and 1 done: the kill comes once pass 2 has a share in
CONFIG = TrainConfig(
    rounds=4,
    eval_every=1,
    hidden=32,
    encryption="ckks",
    dp=True,
    epsilon=8.0,
    noise_seed=13,  # test-only: the same noise in both runs
    seed=5,
)  # passes: train 0 to 3, eval 4


@pytest.fixture(scope="module")
def reproducible_noise() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # the workers inherit it
        patch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
        yield


@pytest.fixture(scope="module")
def single_process(
    cora, tmp_path_factory: pytest.TempPathFactory, reproducible_noise
) -> RunSummary:
    """The reference: one ``glasu serve`` on SQLite, the same workers and seeds."""
    return train_over_http(
        CONFIG,
        layout_federation(CONFIG, cora),
        cora,
        progress=False,
        work_dir=tmp_path_factory.mktemp("single"),
    )


@pytest.mark.slow  # 40-120 s: PostgreSQL, three replicas, HAProxy, three workers, twice the run
def test_replicas_behind_haproxy_survive_a_kill(
    cora, tmp_path: Path, postgres_cluster, single_process: RunSummary, reproducible_noise
) -> None:
    from secure.ckks import generate_keys

    secret_context, public_context = generate_keys(tmp_path / "keys")
    layout = layout_federation(CONFIG, cora)
    with ExitStack() as stack:
        replicas = stack.enter_context(
            start_replicas(
                REPLICAS,
                postgres_cluster.new_database("replicas_kill"),
                tmp_path,
                extra_args=["--public-context", str(public_context)],
            )
        )
        proxy = stack.enter_context(HAProxy.start(replicas.urls, tmp_path))
        admin = stack.enter_context(AdminClient(base_url=proxy.url, token=replicas.admin_token))
        fed = LocalFederation(tmp_path, proxy.url, admin, [], secret_context)
        stack.callback(stop_all, fed.processes)
        created = admin.create_session(session_request(CONFIG, layout, cora))
        session_id = created["session_id"]
        fed.start_workers(CONFIG, layout.partitions, created, threads=1)

        def workers_alive() -> None:
            for worker in fed.processes:
                code = worker.process.poll()
                assert code in (None, 0), f"{worker.name} exited with {code}:\n{worker.tail(30)}"

        killed_in = wait_for(
            lambda: mid_pass(admin.session(session_id), KILL_AT_PASS),
            check=workers_alive,
            what=f"pass {KILL_AT_PASS} to receive a share",
        )
        served_before_kill = proxy.served_by()
        assert replicas.kill(VICTIM) == -signal.SIGKILL
        wait_for(
            lambda: all(w.process.poll() == 0 for w in fed.processes) or None,
            check=workers_alive,
            what="the workers to finish",
        )
        status = admin.session(session_id)
        privacy = admin.privacy(session_id)
        results = fed.results(CONFIG.clients)
        for i, served in enumerate(replicas.services):
            if i != VICTIM:
                assert served.process.poll() is None, served.managed.tail(30)
        served_in_all = proxy.served_by()
    assert KILL_AT_PASS <= killed_in < created["passes_total"]  # mid-run, mid-pass
    assert status["state"] == "finished" and status["current_pass"] == status["passes_total"]
    # no stickiness: every replica had served the session before the kill, and the other two
    # served the rest
    replica_names = {f"replica-{i}" for i in range(REPLICAS)}
    assert replica_names <= set(served_before_kill), served_before_kill
    after_kill = {k: served_in_all[k] - served_before_kill.get(k, 0) for k in served_in_all}
    assert all(after_kill[f"replica-{i}"] > 0 for i in range(REPLICAS) if i != VICTIM)
    assert all(r["resumed_from"] == [] for r in results)  # the workers never stopped

    replicated = summary_from_workers(CONFIG, layout, cora, results, privacy, wall_seconds=0.0)
    assert replicated.config["encryption"] == "ckks"
    assert [h.test_accuracy for h in replicated.history] == pytest.approx(
        [h.test_accuracy for h in single_process.history], abs=1e-9
    )
    assert replicated.test_accuracy == pytest.approx(single_process.test_accuracy, abs=1e-9)
    assert replicated.privacy is not None and single_process.privacy is not None
    # the ledger counted every release once, though replicas came and went
    assert replicated.privacy["releases"] == single_process.privacy["releases"] > 0
    assert replicated.privacy["epsilon"] == single_process.privacy["epsilon"]
    assert [h.epsilon for h in replicated.history] == [h.epsilon for h in single_process.history]


def mid_pass(status: dict[str, Any], pass_index: int) -> int | None:
    """The current pass once it is ``pass_index`` or later and a share of it has arrived."""
    progress = status.get("progress")
    if status["current_pass"] < pass_index or progress is None:
        return None
    if any(layer["embeddings_received"] for layer in progress["layers"]):
        return int(status["current_pass"])
    return None


def wait_for(
    event: Callable[[], Any],
    *,
    check: Callable[[], None],
    what: str,
    timeout: float = 300.0,
    poll_seconds: float = 0.05,
) -> Any:
    """``event()``'s first value that is not None, calling ``check()`` between tries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check()
        value = event()
        if value is not None:
            return value
        time.sleep(poll_seconds)
    raise AssertionError(f"timed out waiting for {what}")
