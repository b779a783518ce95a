"""Classification metrics for people who act on predictions (fraud, diagnosis): accuracy alone
hides a rare class. scikit-learn computes every number; this module only picks them."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    precision_recall_fscore_support,
    roc_auc_score,
)


def describe_scores(metrics: dict[str, Any]) -> str:
    """``classification_metrics`` in a few words: accuracy, macro-F1, and for two classes the
    AUCs."""
    text = f"accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f}"
    if "roc_auc" in metrics:
        text += f", ROC-AUC {metrics['roc_auc']:.4f}, PR-AUC {metrics['pr_auc']:.4f}"
    return text


def classification_metrics(
    labels: np.ndarray, probabilities: np.ndarray, *, num_classes: int
) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision, recall and support, and for a two-class task
    ROC-AUC and PR-AUC (average precision) of class 1; ``labels`` (n,) class indices,
    ``probabilities`` (n, num_classes). An empty set gives ``{"count": 0}``."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return {"count": 0}
    predicted = np.asarray(probabilities).argmax(axis=1)
    classes = list(range(num_classes))
    precision, recall, _, support = precision_recall_fscore_support(
        labels, predicted, labels=classes, zero_division=0
    )
    metrics: dict[str, Any] = {
        "count": int(labels.size),
        "accuracy": float(accuracy_score(labels, predicted)),
        "macro_f1": float(f1_score(labels, predicted, labels=classes, average="macro",
                                   zero_division=0)),
        "per_class": [
            {"class": c, "precision": float(p), "recall": float(r), "support": int(n)}
            for c, p, r, n in zip(classes, precision, recall, support, strict=True)
        ],
    }  # fmt: skip
    if num_classes == 2 and len(np.unique(labels)) == 2:
        scores = np.asarray(probabilities)[:, 1]
        metrics["roc_auc"] = float(roc_auc_score(labels, scores))
        metrics["pr_auc"] = float(average_precision_score(labels, scores))
    return metrics
