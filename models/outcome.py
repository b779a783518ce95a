"""What a pass gives back (:class:`PassOutcome`), and how an evaluation pass is scored."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from models.answer import Answer
from models.data.partition import ClientPartition
from models.data.party import NO_LABEL
from models.metrics import classification_metrics


@dataclass(frozen=True)
class PassOutcome:
    kind: str
    loss: float
    val_accuracy: float | None = None
    test_accuracy: float | None = None
    # the party-alone reference of a private client (models/private.py), same batches
    reference_val_accuracy: float | None = None
    reference_test_accuracy: float | None = None
    # an evaluation pass of a client with a head: its class probabilities, one row per output
    # node (what a model artefact's evaluation and a scoring session write)
    probabilities: np.ndarray | None = field(default=None, compare=False, repr=False)
    # classification metrics on the pass's labelled test nodes (models/metrics.py), and the
    # party-alone reference's
    test_metrics: dict | None = field(default=None, compare=False, repr=False)
    reference_test_metrics: dict | None = field(default=None, compare=False, repr=False)
    # the model's answer at this party (models/answer.py): its own where it is the answering
    # party, the one shared with it in a scoring session that shares it; else None
    answer: Answer | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EvaluationScores:
    """An evaluation pass's logits, scored on the client's labelled validation and test nodes."""

    loss: float  # on the validation nodes (NaN without any)
    val_accuracy: float | None
    test_accuracy: float | None
    probabilities: np.ndarray  # one row per output node
    test_metrics: dict  # models/metrics.py, on the test nodes


def score_evaluation(
    logits: torch.Tensor,
    labels: torch.Tensor,
    output_nodes: np.ndarray,
    partition: ClientPartition,
) -> EvaluationScores:
    """Validation loss, validation and test accuracy, class probabilities and the test nodes'
    metrics (macro-F1, per-class precision and recall, the AUCs of a two-class task)."""
    output_nodes = np.asarray(output_nodes, dtype=np.int64)
    known = labels.cpu().numpy()
    correct = (logits.argmax(dim=1) == labels).cpu().numpy()
    labelled = known != NO_LABEL
    val = np.isin(output_nodes, partition.val_nodes) & labelled
    test = np.isin(output_nodes, partition.test_nodes) & labelled
    loss = float("nan")
    if val.any():
        rows = torch.from_numpy(val).to(logits.device)
        loss = float(F.cross_entropy(logits[rows], labels[rows]).item())
    probabilities = torch.softmax(logits, dim=1).cpu().numpy()
    return EvaluationScores(
        loss=loss,
        val_accuracy=float(correct[val].mean()) if val.any() else None,
        test_accuracy=float(correct[test].mean()) if test.any() else None,
        probabilities=probabilities,
        test_metrics=classification_metrics(
            known[test], probabilities[test], num_classes=probabilities.shape[1]
        ),
    )
