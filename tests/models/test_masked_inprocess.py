"""The in-process trainer with masked shares (models/trainer.py ``masked_security``): each party
masks with its own keys, and the run equals the unmasked CKKS run (the masked sum is exact)."""

from __future__ import annotations

import dataclasses

import pytest

from models.config import TrainConfig
from models.trainer import train_inprocess


@pytest.mark.slow  # two short Cora runs
def test_a_masked_in_process_run_equals_the_ckks_run(cora) -> None:
    config = TrainConfig(
        clients=3, rounds=2, eval_every=1, hidden=16, dp=False, seed=1, device="cpu",
        secure_aggregation="masks",
    )  # fmt: skip
    masked = train_inprocess(config, dataset=cora, progress=False)
    ckks = train_inprocess(
        dataclasses.replace(config, secure_aggregation="none"), dataset=cora, progress=False
    )
    assert [h.test_accuracy for h in masked.history] == [h.test_accuracy for h in ckks.history]
    assert masked.config["secure_aggregation"] == "masks"
