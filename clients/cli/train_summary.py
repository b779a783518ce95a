"""What `glasu train` prints of its run summary, and the scale map's regime of the run (the
gain sentence's pointer, models/regime.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.config import TrainConfig
    from models.data.partition import ClientPartition
    from models.run_summary import RunSummary


def regime(
    summary: RunSummary,
    partitions: list[ClientPartition],
    *,
    config: TrainConfig,
    folders: list[Path] | None,
) -> dict[str, Any]:
    """The scale map's regime of one party's own data (models/regime.py): the label holder's,
    else the first party's (with a benchmark dataset every party holds the same nodes and
    labels, and its own share of the edges)."""
    from models.regime import PartyScale, run_regime

    m = config.label_holder if config.label_holder is not None else 0
    role = "the label holder" if config.label_holder is not None else "the first party"
    party = PartyScale.of_partition(partitions[m])
    whose = f"client {m}, {role}"
    if folders:
        from clients.local.parties import party_names
        from models.data.party import read_meta

        whose = f"{party_names(folders)[m]}, {role}"
        if not partitions[m].edge_index.shape[1]:  # the workers read the folders, not this one
            party = party.with_degree_of(read_meta(folders[m]))
    epsilon = float((summary.privacy or {}).get("epsilon") or config.epsilon or 0.0)
    return run_regime(party=party, epsilon=epsilon, whose=whose)


def describe_run(summary: RunSummary) -> str:
    cfg = summary.config
    lines = [
        f"{cfg['dataset']} ({cfg['split']} split), mode {cfg['mode']}, {cfg['backbone']}, "
        f"M={cfg['clients']}, rounds {summary.rounds}",
        f"test accuracy {summary.test_accuracy:.4f} (best validation {summary.val_accuracy:.4f} "
        f"at round {summary.best_round}; final test {summary.final_test_accuracy:.4f})",
        f"wall time {summary.wall_seconds:.1f} s, bytes up {summary.bytes_up:,}, "
        f"down {summary.bytes_down:,}",
    ]
    lines += metric_lines("test", summary.test_metrics)
    lines += metric_lines("test, party alone", summary.reference_test_metrics)
    if summary.reference_test_accuracy is not None and summary.gain is not None:
        lines.append(
            f"party alone (same batches, without the others' release): test accuracy "
            f"{summary.reference_test_accuracy:.4f}; gain from federating "
            f"{100 * summary.gain:+.1f} points"
        )
        if summary.gain <= 0:
            lines.append(
                "Private federation did not beat training alone in this run: the noise that "
                "protects the others' features leaves too little signal here (docs/privacy.md, "
                "section 1.4)."
            )
        if summary.regime:
            lines.append(summary.regime["sentence"])
    if summary.privacy:
        from clients.cli.budget_cmd import describe

        lines.append("privacy budget:\n" + describe(summary.privacy))
    elif cfg["mode"] in ("centralized", "standalone"):
        lines.append("privacy: nothing leaves a client in this mode")
    else:
        lines.append("privacy: none (differential privacy off: no (epsilon, delta) guarantee)")
    if summary.stopped_early:
        lines.append(f"stopped early: {summary.stopped_early}")
    return "\n".join(lines)


def metric_lines(what: str, per_client: list[dict | None] | None) -> list[str]:
    """Macro-F1 (and the AUCs of a two-class task) at the kept round, each client's head."""
    from models.metrics import describe_scores

    lines = []
    for client, metrics in enumerate(per_client or []):
        if not metrics or not metrics.get("count"):
            continue
        recall = ", ".join(f"{c['recall']:.2f}" for c in metrics["per_class"])
        lines.append(
            f"  client {client} {what}: {describe_scores(metrics)}; recall per class {recall}"
        )
    return lines
