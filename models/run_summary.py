"""The run summary (the JSON file of ``glasu train --report``) and its plot (PNG). Other tools
read these names: keep them stable."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from models.config import TrainConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class HistoryEntry:
    round: int
    loss: float
    val_accuracy: float | None
    test_accuracy: float | None
    bytes_up: int = 0
    bytes_down: int = 0
    training_bytes: int = 0  # exchanged in training passes so far (up + down, all clients)
    epsilon: float | None = None
    # the party-alone reference of private runs: each client without the others' release
    reference_val_accuracy: float | None = None
    reference_test_accuracy: float | None = None
    # per client with a head: macro-F1, per-class precision and recall (and ROC-AUC, PR-AUC of
    # a two-class task) on the test nodes; the party-alone reference's likewise
    test_metrics: list[dict[str, Any] | None] | None = None
    reference_test_metrics: list[dict[str, Any] | None] | None = None


@dataclass
class RunSummary:
    test_accuracy: float  # at the evaluation with the best validation accuracy
    val_accuracy: float  # the best validation accuracy
    final_test_accuracy: float
    final_val_accuracy: float
    best_round: int
    rounds: int
    wall_seconds: float
    bytes_up: int
    bytes_down: int
    privacy: dict[str, Any] | None
    config: dict[str, Any]
    history: list[HistoryEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped_early: str | None = None
    # private runs: the party-alone reference at its own best validation, and the gain over it
    reference_test_accuracy: float | None = None
    reference_val_accuracy: float | None = None
    gain: float | None = None  # test_accuracy - reference_test_accuracy
    # at the evaluation with the best validation accuracy, per client with a head
    test_metrics: list[dict[str, Any] | None] | None = None
    reference_test_metrics: list[dict[str, Any] | None] | None = None
    # private runs: the party's own data, the scale map's nearest regime and the sentence the
    # summary prints (models/regime.py); set by `glasu train`
    regime: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n")


def _json_default(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """The mean over clients of a figure some runs do not have (None when any lacks it)."""
    if not values or any(v is None for v in values):
        return None
    return float(sum(values) / len(values))  # type: ignore[arg-type]


def noise_kind(config: TrainConfig) -> str:
    """How the run drew its DP noise, as the summary states it."""
    if config.noise_seed is None:
        return "cryptographic (ChaCha20, a fresh key per draw)"
    return "reproducible from a fixed seed (tests only): NOT PRIVATE, no guarantee holds"


def recent_training_loss(losses: Sequence[float], *, window: int = 10) -> float:
    """A history row's loss: the mean training loss of the last ``window`` rounds (NaN before
    the first)."""
    recent = list(losses[-window:])
    return float(sum(recent) / len(recent)) if recent else float("nan")


def select_best(history: list[HistoryEntry]) -> HistoryEntry:
    """The evaluation with the highest validation accuracy (the earliest on ties)."""
    evaluated = [h for h in history if h.val_accuracy is not None]
    if not evaluated:
        raise ValueError("no evaluation in the history")
    return max(evaluated, key=lambda h: (h.val_accuracy, -h.round))


def build_run_summary(
    config: TrainConfig,
    *,
    transport: Literal["inprocess", "http"],
    history: list[HistoryEntry],
    agg_layers: Sequence[int],
    stale: int,
    split_note: str,
    devices: Sequence[str],
    wall_seconds: float,
    privacy: dict[str, Any] | None,
    bytes_up: int = 0,
    bytes_down: int = 0,
    stopped_early: str | None = None,
) -> RunSummary:
    """The run summary, whichever transport ran it: the test accuracy at the evaluation with the
    best validation accuracy, and the last evaluation as "final"."""
    evaluated = [h for h in history if h.val_accuracy is not None]
    if not evaluated:
        raise ValueError(f"the run ended ({stopped_early or 'finished'}) before any evaluation")
    best = select_best(evaluated)
    final = evaluated[-1]
    reference = select_reference(evaluated)
    alone = None
    if reference is not None:
        alone = (
            float(reference.reference_val_accuracy or 0.0),
            float(reference.reference_test_accuracy or 0.0),
        )
    if transport == "http":
        traffic = "bytes: request and response bodies as the workers sent and received them"
    else:
        traffic = "bytes: not measured in process (no messages are serialised to the wire)"
    return RunSummary(
        test_accuracy=float(best.test_accuracy or 0.0),
        val_accuracy=float(best.val_accuracy or 0.0),
        final_test_accuracy=float(final.test_accuracy or 0.0),
        final_val_accuracy=float(final.val_accuracy or 0.0),
        best_round=best.round,
        rounds=config.rounds,
        wall_seconds=wall_seconds,
        bytes_up=bytes_up,
        bytes_down=bytes_down,
        privacy=None if privacy is None else {**privacy, "noise": noise_kind(config)},
        config={
            **config.to_dict(),
            "encryption": "ckks" if config.encrypted else "none",
            "transport": transport,
            "agg_layer_indices": list(agg_layers),
            "stale_effective": stale,
            "device_used": ",".join(sorted(set(devices))),
            "split_note": split_note,
        },
        history=history,
        notes=[
            f"split: {split_note}",
            "accuracy: mean over clients of each client's own head on the joint inference",
            f"evaluation: one sampled joint inference over validation+test nodes, fanout "
            f"{config.eval_fanout}; test accuracy reported at the best validation",
            traffic,
        ],
        stopped_early=stopped_early,
        reference_test_accuracy=alone[1] if alone else None,
        reference_val_accuracy=alone[0] if alone else None,
        gain=float(best.test_accuracy or 0.0) - alone[1] if alone else None,
        test_metrics=best.test_metrics,
        # from the evaluation its accuracy is taken from: per client, they add up to it
        reference_test_metrics=reference.reference_test_metrics if reference else None,
    )


def select_reference(history: list[HistoryEntry]) -> HistoryEntry | None:
    """The evaluation at which the party-alone reference had its best validation accuracy (the
    earliest on ties), or None when the run has no reference: its accuracy and its per-client
    metrics are both taken there."""
    rows = [h for h in history if h.reference_val_accuracy is not None]
    if not rows:
        return None
    return max(rows, key=lambda h: (h.reference_val_accuracy or 0.0, -h.round))


def plot_history(summary: RunSummary, path: Path) -> None:
    """Write :func:`history_figure` to ``path`` (PNG, or the format its suffix names)."""
    fig = history_figure(summary)  # selects matplotlib's file backend before pyplot is imported
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def history_figure(summary: RunSummary) -> Figure:
    """Validation/test accuracy per round; bytes and epsilon per round when they were recorded,
    epsilon with the run's target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [h for h in summary.history if h.val_accuracy is not None]
    rounds = [h.round for h in history]
    panels = ["accuracy"]
    if any(h.bytes_up or h.bytes_down for h in history):
        panels.append("bytes")
    if any(h.epsilon is not None for h in history):
        panels.append("epsilon")
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    cfg = summary.config
    title = (
        f"{cfg.get('dataset')} · {cfg.get('mode')} · {cfg.get('backbone')} · "
        f"test {summary.test_accuracy:.1%} at round {summary.best_round}"
    )
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "accuracy":
            ax.plot(rounds, [h.val_accuracy for h in history], label="validation")
            ax.plot(rounds, [h.test_accuracy for h in history], label="test", alpha=0.7)
            if summary.reference_test_accuracy is not None:
                ax.plot(
                    rounds,
                    [h.reference_test_accuracy for h in history],
                    label="test, party alone",
                    linestyle="--",
                    alpha=0.7,
                )
            ax.axvline(summary.best_round, color="grey", linestyle=":", label="selected")
            ax.set_ylabel("accuracy")
            ax.legend(loc="lower right")
        elif panel == "bytes":
            ax.plot(rounds, [(h.bytes_up + h.bytes_down) / 2**20 for h in history])
            ax.set_ylabel("MiB sent + received (cumulative)")
        else:
            ax.plot(rounds, [h.epsilon for h in history], label="spent")
            target = (summary.privacy or {}).get("epsilon_target")
            if target is not None:
                ax.axhline(target, color="C3", linestyle="--", label=f"target {target:g}")
            ax.set_ylabel("epsilon spent")
            ax.legend(loc="lower right")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
