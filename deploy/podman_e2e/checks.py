"""Stage 7: what a finished secure training must show, after the compose and the kube runs."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from deploy.podman_e2e import CLIENTS, CORA_CLASSES
from deploy.podman_e2e.commands import Failed


def check_training(
    results: dict[int, dict[str, Any]], budget: dict[str, Any], ledgers: dict[int, Path]
) -> dict[str, Any]:
    """Accuracy above chance at every worker, epsilon spent within the target, every release in
    each worker's own ledger. Returns the numbers for the summary."""
    if not budget.get("enabled"):
        raise Failed(f"the session ran without differential privacy: {budget}")
    epsilon, target = budget.get("epsilon"), budget.get("epsilon_target")
    if epsilon is None or target is None or not 0 < epsilon <= target + 1e-9:
        raise Failed(f"epsilon {epsilon} is not within (0, {target}]")
    accuracies = {}
    for m in range(CLIENTS):
        result = results[m]
        if result.get("finished_reason") != "finished":
            raise Failed(f"worker {m} ended with {result.get('finished_reason')!r}")
        if not result.get("history"):
            raise Failed(f"worker {m} recorded no evaluation")
        accuracy = result["history"][-1]["test_accuracy"]
        if not accuracy > 1 / CORA_CLASSES:
            raise Failed(f"worker {m}: test accuracy {accuracy:.3f} is not above chance")
        accuracies[m] = round(accuracy, 4)
        with contextlib.closing(sqlite3.connect(f"file:{ledgers[m]}?mode=ro", uri=True)) as db:
            (rows,) = db.execute("SELECT COUNT(*) FROM releases").fetchone()
        if rows < budget["releases"]:
            raise Failed(f"worker {m}'s ledger has {rows} releases, the service {budget}")
    return {
        "test_accuracy": accuracies,
        "epsilon": round(epsilon, 4),
        "epsilon_target": target,
        "releases": budget["releases"],
    }
