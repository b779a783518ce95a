"""The run summary's party-alone figures (models/run_summary.py): the reference's accuracy and
its per-client metrics come from one evaluation, its own best validation, so that the
per-client lines `glasu train` prints add up to the summary's figure; the run plot draws the
epsilon target."""

from __future__ import annotations

from typing import Any

from clients.cli.train_summary import describe_run
from models.config import TrainConfig
from models.run_summary import HistoryEntry, RunSummary, build_run_summary, history_figure


def _scores(accuracy: float) -> dict[str, Any]:
    return {"count": 100, "accuracy": accuracy, "macro_f1": accuracy, "per_class": []}


def _evaluation(round_: int, val: float, alone_val: float, alone: list[float]) -> HistoryEntry:
    return HistoryEntry(
        round=round_, loss=1.0, val_accuracy=val, test_accuracy=val, epsilon=0.5 * round_,
        reference_val_accuracy=alone_val, reference_test_accuracy=sum(alone) / len(alone),
        test_metrics=[_scores(val), _scores(val)],
        reference_test_metrics=[_scores(a) for a in alone],
    )  # fmt: skip


def _summary(privacy: dict[str, Any] | None = None) -> RunSummary:
    """The federated model is best at round 20, the party alone at round 10."""
    history = [
        _evaluation(10, val=0.70, alone_val=0.75, alone=[0.76, 0.74]),
        _evaluation(20, val=0.80, alone_val=0.72, alone=[0.71, 0.69]),
    ]
    return build_run_summary(
        TrainConfig(rounds=20), transport="inprocess", history=history, agg_layers=[1],
        stale=1, split_note="test", devices=["cpu"], wall_seconds=1.0, privacy=privacy,
    )  # fmt: skip


def test_the_party_alone_lines_and_figure_come_from_one_evaluation() -> None:
    summary = _summary()
    assert summary.best_round == 20
    assert summary.reference_test_accuracy == 0.75  # the reference's own best validation
    per_client = [m["accuracy"] for m in summary.reference_test_metrics or []]
    assert per_client == [0.76, 0.74]
    assert sum(per_client) / len(per_client) == summary.reference_test_accuracy
    printed = describe_run(summary)
    assert "client 0 test, party alone: accuracy 0.7600" in printed
    assert "client 1 test, party alone: accuracy 0.7400" in printed
    assert "party alone (same batches, without the others' release): test accuracy 0.7500" in (
        printed
    )


def test_the_run_plot_draws_the_epsilon_target() -> None:
    figure = history_figure(_summary({"epsilon": 1.0, "delta": 1e-5, "epsilon_target": 4.0}))
    epsilon = figure.axes[-1]
    assert epsilon.get_ylabel() == "epsilon spent"
    assert any(list(line.get_ydata()) == [4.0, 4.0] for line in epsilon.get_lines())
    assert "target 4" in [t.get_text() for t in epsilon.get_legend().get_texts()][-1]
