"""Three real workers through the service app under stragglers "continue": one worker stalls in
the middle of a training pass; the others finish that pass without it (the count-aware mean of
two) and do not wait for it in the passes after, until it asks to rejoin; it takes part again
and the run ends with every worker finished."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from clients.checkpoint import CheckpointError
from clients.rejoin import rejoin_pass
from clients.session_client import SessionClient
from models.config import TrainConfig
from secure.wire.sessions import SessionConfigView
from secure.wire.status import SessionStatus
from tests.clients.test_worker_asgi import run_federation

STALL_PASS = 2  # a training pass
AWAY_PASSES = 3  # the stalled worker comes back once the others are this many passes on

CONFIG = TrainConfig(
    rounds=6,
    eval_every=3,
    hidden=32,
    encryption="none",
    dp=False,
    seed=3,
    stragglers="continue",
    straggler_wait_seconds=1.0,
)


class StallingService(SessionClient):
    """Stalls before its first share of ``STALL_PASS`` (a worker paused, a slow link) until the
    others have gone on ``AWAY_PASSES`` passes without it."""

    stalled = False

    def put_share(self, pass_index: int, *args, **kwargs):  # type: ignore[no-untyped-def]
        if pass_index == STALL_PASS and not self.stalled:
            self.stalled = True
            deadline = time.monotonic() + 120
            while self.session().current_pass < STALL_PASS + AWAY_PASSES:
                assert time.monotonic() < deadline, "the others waited for the stalled worker"
                time.sleep(0.05)
        return super().put_share(pass_index, *args, **kwargs)


def test_a_stalled_worker_is_left_out_while_away_and_rejoins(tmp_path: Path, cora) -> None:
    results, status = run_federation(
        tmp_path,
        CONFIG,
        cora,
        service_class=lambda m: StallingService if m == 2 else SessionClient,
    )
    assert status["state"] == "finished"
    assert [r.finished_reason for r in results] == ["finished"] * 3
    assert results[0].skipped == results[1].skipped == []
    skipped = results[2].skipped  # from the pass it stalled in to the one it rejoined at
    assert skipped == list(range(STALL_PASS, STALL_PASS + len(skipped)))
    assert len(skipped) >= AWAY_PASSES
    assert results[0].passes == status["passes_total"]
    assert results[2].passes == status["passes_total"] - len(skipped)
    for result in results:
        assert all(math.isfinite(h["test_accuracy"]) for h in result.history)
    # back for the last evaluation, which waited for it again
    assert results[2].history[-1]["pass"] == results[0].history[-1]["pass"]


def test_a_restarted_or_late_worker_joins_at_the_current_pass_under_continue_only() -> None:
    def status(stragglers: str) -> SessionStatus:
        config = SessionConfigView.model_construct(stragglers=stragglers)
        return SessionStatus.model_construct(session_id="s", current_pass=7, config=config)

    session = status("continue")
    assert rejoin_pass(session, 2, Path("checkpoint")) == 7
    assert rejoin_pass(session, 0, None) == 7
    assert rejoin_pass(session, 7, Path("checkpoint")) == 7
    waiting = status("wait")
    assert rejoin_pass(waiting, 6, Path("checkpoint")) == 6  # its share may have ended pass 6
    with pytest.raises(CheckpointError, match="cannot have gone on without this client"):
        rejoin_pass(waiting, 2, Path("checkpoint"))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        rejoin_pass(waiting, 0, None)
