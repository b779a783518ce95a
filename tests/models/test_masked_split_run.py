"""An in-process run with masked shares and DP: split noise by default (docs/privacy.md section
11.6), each party's share wrapped modulo t, and the run summary names each adversary, against
one peer at the target epsilon."""

from __future__ import annotations

import pytest

from models.config import TrainConfig
from models.trainer import train_inprocess


@pytest.mark.slow  # a short Cora run under BFV with an evaluation pass
def test_a_masked_run_with_dp_splits_the_noise_and_holds_the_target_against_one_peer(
    cora,
) -> None:
    config = TrainConfig(
        clients=3, rounds=1, eval_every=0, hidden=16, batch_size=8, eval_fanout=3,
        device="cpu", secure_aggregation="masks", epsilon=4.0,
    )  # fmt: skip
    summary = train_inprocess(config, dataset=cora, progress=False)
    report = summary.privacy
    assert report is not None and report["split_noise"] is True
    assert [a["key"] for a in report["adversaries"]] == [
        "service", "peer", "service_peer", "colluding", "group",
    ]  # fmt: skip
    assert any("colluding peer" in line for line in report["adversary_lines"])
    against = {a["key"]: a["epsilon"] for a in report["split"]["adversaries"]}
    assert against["peer"] == pytest.approx(config.epsilon, rel=1e-3)
    assert against["service_peer"] == against["peer"] < against["colluding"]
    assert summary.config["secure_aggregation"] == "masks"
    assert 0.0 <= summary.history[-1].test_accuracy <= 1.0
