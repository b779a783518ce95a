"""The predictor released once (models/predictor_release.py) as the scale map measures it
(bench/frontier_scale.py, "design 2"): each party's predictor trained with full-batch DP-SGD
(Opacus, step 1 of the design), and the receivers' mean test accuracy and ROC-AUC."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from models.data.partition import ClientPartition
from models.predictor_release import (
    PredictorSettings,
    ReceiverScore,
    ReleaseBudget,
    ReleaseSession,
)


def _mlp(features: int, classes: int, hidden: int) -> nn.Module:
    if hidden == 0:
        return nn.Linear(features, classes)
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def train_predictor(
    part: ClientPartition,
    *,
    budget: ReleaseBudget | None,
    settings: PredictorSettings,
    seed: int,
) -> nn.Module:
    """Full-batch DP-SGD (Opacus) on the party's labelled rows; ``budget`` None: no clipping and
    no noise (the non-private ceiling of the design)."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(seed)
    x = part.features[torch.from_numpy(part.train_nodes)]
    y = part.labels[torch.from_numpy(part.train_nodes)]
    model = _mlp(x.shape[1], part.num_classes, settings.hidden)
    optimizer: torch.optim.Optimizer = torch.optim.SGD(
        model.parameters(), lr=settings.lr, momentum=0.9
    )
    module: nn.Module = model
    if budget is not None:
        module = GradSampleModule(model)
        optimizer = DPOptimizer(
            torch.optim.SGD(module.parameters(), lr=settings.lr, momentum=0.9),
            # Opacus adds std noise_multiplier * max_grad_norm: 2 z C, replace-one
            noise_multiplier=2.0 * budget.sgd_noise_multiplier,
            max_grad_norm=settings.clip,
            expected_batch_size=len(y),
            generator=torch.Generator().manual_seed(seed),
        )
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(settings.steps if budget is None else budget.steps):
        optimizer.zero_grad()
        loss_fn(module(x), y).backward()
        optimizer.step()
    return model


class PredictorRelease(ReleaseSession):
    """One session of the design with each party's predictor trained by :func:`train_predictor`;
    its figures are means over the receivers."""

    def train(self, part: ClientPartition, *, seed: int) -> nn.Module:
        return train_predictor(part, budget=self.budget, settings=self.settings, seed=seed)

    def mean_scores(self) -> dict[str, float]:
        """Mean over receivers of the test accuracy (each at its own best validation)."""
        return self._mean(lambda score: score.test)

    def mean_roc_auc(self) -> dict[str, float | None]:
        """Mean over receivers of the test ROC-AUC (a two-class task; else None)."""
        return self._mean(lambda score: score.test_roc_auc)

    def _mean(self, figure: Callable[[ReceiverScore], float | None]) -> dict[str, Any]:
        per_receiver = [self.receiver_scores(m) for m in range(len(self.parts))]
        out: dict[str, Any] = {}
        for key in ("alone", "with release"):
            values = [figure(s[key]) for s in per_receiver]
            out[key] = None if None in values else float(np.mean(values))
        return out
