"""The run summary of an HTTP federation, from the workers' result files and the session's
privacy report (the same builder as in process: ``models.run_summary.build_run_summary``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from clients.local.processes import FederationFailed
from clients.local.session import plans_sign_release
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.layout import FederationLayout
from models.private_sign import design_note, senders, sign_privacy
from models.run_summary import HistoryEntry, RunSummary, build_run_summary, mean_or_none


def summary_from_workers(
    config: TrainConfig,
    layout: FederationLayout,
    dataset: GraphDataset,
    results: list[dict[str, Any]],
    privacy: dict[str, Any],
    *,
    wall_seconds: float,
) -> RunSummary:
    """The workers' histories, one row per evaluation, averaged over clients (bytes summed);
    with a single label holder, its metrics alone (GLASU B.2)."""
    epsilon_at_pass = {entry["pass"]: entry["epsilon"] for entry in privacy.get("ledger", [])}

    def mean(rows: list[dict[str, Any]], key: str) -> float:
        return float(np.mean([row[key] for row in rows]))

    holder = config.label_holder if config.mode != "standalone" else None

    def entry(rows: tuple[dict[str, Any], ...]) -> HistoryEntry:
        scored = [rows[holder]] if holder is not None else list(rows)
        return HistoryEntry(
            round=rows[0]["round"],
            loss=mean(scored, "loss"),
            val_accuracy=mean(scored, "val_accuracy"),
            test_accuracy=mean(scored, "test_accuracy"),
            bytes_up=sum(row["bytes_up"] for row in rows),
            bytes_down=sum(row["bytes_down"] for row in rows),
            training_bytes=sum(row["training_bytes"] for row in rows),
            epsilon=epsilon_at_pass.get(rows[0]["pass"]),
            reference_val_accuracy=mean_or_none([row["reference_val_accuracy"] for row in scored]),
            reference_test_accuracy=mean_or_none(
                [row["reference_test_accuracy"] for row in scored]
            ),
            test_metrics=[row.get("test_metrics") for row in scored],
            reference_test_metrics=[row.get("reference_test_metrics") for row in scored],
        )

    history = [entry(rows) for rows in zip(*(res["history"] for res in results), strict=True)]
    reasons = {res["finished_reason"] for res in results}
    stopped = next((r for r in reasons if r != "finished"), None)
    try:
        summary = build_run_summary(
            config,
            transport="http",
            history=history,
            agg_layers=layout.client_config.agg_layers,
            stale=layout.client_config.stale,
            split_note=dataset.split_note,
            devices=[res["device"] for res in results],
            wall_seconds=wall_seconds,
            privacy=privacy if privacy.get("enabled") else None,
            bytes_up=sum(res["bytes_up"] for res in results),
            bytes_down=sum(res["bytes_down"] for res in results),
            stopped_early=stopped,
        )
    except ValueError as exc:  # no evaluation before the session ended
        raise FederationFailed(str(exc)) from exc
    if plans_sign_release(config):
        planned = sign_privacy(config, clients=len(layout.partitions))
        releasing = senders(layout.partitions, config.label_holder)
        summary.notes.append(design_note(planned, releasing=releasing, hops=config.hops))
    return summary
