"""A privately trained predictor released once: a private design of issue 29, run in process
(not by `glasu train`): its privacy budget, its one release and the receivers' fit. The scale map
measures it (bench/frontier_scale.py, its "design 2", each predictor trained with Opacus in
bench/predictor_release.py) and the run report's regime sentence names it (models/regime.py).

Privacy unit: one node's feature row at one party, replace-one (docs/privacy.md section 1).

1. Each party m trains a small MLP on its own feature rows ``x_v`` (labelled nodes only) with
   full-batch DP-SGD (Opacus per-example clipping at C, Gaussian noise): one node's row enters
   exactly one example, so replacing it moves the clipped gradient sum by at most 2C; the noise
   std is ``z_sgd * 2C`` per step. Full batch (sample rate 1) claims no amplification by
   subsampling, like the product's accounting (secure/accounting/analysis.py), so each step is
   one Gaussian release with multiplier ``z_sgd``.
   *Why not a GNN over the party's own graph:* a node's row then enters the example of every
   labelled node within the receptive field (up to the degree to the power of the depth, or
   ``cap + 1`` per hop with the sampler's occurrence cap), and the release of every node whose
   neighbourhood holds it; both sensitivities grow by that factor, so the noise would have to
   grow with the degree the design is meant to exploit. The receivers use the graph instead,
   on the released block (post-processing).
2. Once per session, the party releases for every node ``v`` its predictor's output on ``x_v``:
   a one-hot vote or the class probabilities. Any two such vectors lie at most sqrt(2) apart
   (L2), so with the model fixed (already paid for in step 1) the release of row v has
   sensitivity sqrt(2), and the rows of other nodes do not depend on ``x_v`` beyond the model.
   Gaussian noise of std ``z_release * sqrt(2)`` per coordinate.
3. The product would encrypt the releases and sum them (CKKS reproduces plaintext sums); here
   the sum is plaintext. Each receiver subtracts its own release, propagates the others' sum K
   hops over its own graph (symmetric-normalised A + I) and fits its own non-private model on
   its own propagated features plus the propagated block: post-processing of the release.

Epsilon: T steps with ``z_sgd`` and one release with ``z_release`` all at sample rate 1 compose
to one Gaussian release with ``1 / sqrt(T / z_sgd^2 + 1 / z_release^2)``
(:func:`secure.accounting.composed_epsilon`, PRV). The budget is split in that GDP currency:
``release_share`` of ``mu^2`` to the release, the rest spread evenly over the T steps.

Label-holder mode (one party holds the labels): the other parties have no labels to train a
predictor on, so they release nothing and the design reduces to the label holder alone. (The
unsupervised random-projection map released once was measured in notes/dp-frontier.md: no gain.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from models.data.partition import ClientPartition
from models.metrics import classification_metrics
from secure.accounting import calibrate_noise_multiplier, composed_epsilon

Output = Literal["onehot", "probs"]
RELEASE_SENSITIVITY = math.sqrt(2.0)  # two points of the probability simplex, L2


@dataclass(frozen=True)
class ReleaseBudget:
    """One party's DP-SGD steps and its one release, calibrated to ``epsilon`` together."""

    epsilon: float
    delta: float
    steps: int
    release_share: float
    sgd_noise_multiplier: float  # per step, relative to the replace-one sensitivity 2C
    release_noise_multiplier: float  # relative to sqrt(2)

    @property
    def inverse_square_sum(self) -> float:
        return self.steps / self.sgd_noise_multiplier**2 + 1 / self.release_noise_multiplier**2

    def spent(self) -> float:
        """Epsilon of the T steps composed with the one release (PRV upper bound)."""
        return composed_epsilon(
            inverse_square_sum=self.inverse_square_sum, delta=self.delta, accountant="prv"
        )


def split_budget(
    *, epsilon: float, delta: float, steps: int, release_share: float = 0.5
) -> ReleaseBudget:
    """The multipliers whose composition spends ``epsilon``: ``release_share`` of mu^2 (mu = 1/z
    of the single equivalent release) to the release, the rest to the steps."""
    if not 0.0 < release_share < 1.0:
        raise ValueError(f"release_share must be in (0, 1), got {release_share}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    single = calibrate_noise_multiplier(epsilon=epsilon, delta=delta, releases=1, accountant="prv")
    return ReleaseBudget(
        epsilon=epsilon,
        delta=delta,
        steps=steps,
        release_share=release_share,
        sgd_noise_multiplier=single * math.sqrt(steps / (1.0 - release_share)),
        release_noise_multiplier=single / math.sqrt(release_share),
    )


@dataclass(frozen=True)
class PredictorSettings:
    steps: int = 60
    clip: float = 1.0
    hidden: int = 32  # 0: a linear model
    lr: float = 0.1
    output: Output = "onehot"
    hops: int = 3  # K: propagation steps at the receiver (own features and the block)


def release_once(
    model: nn.Module,
    features: torch.Tensor,
    *,
    budget: ReleaseBudget | None,
    output: Output,
    generator: torch.Generator,
) -> torch.Tensor:
    """(N, classes): every node's vote or probabilities plus Gaussian noise of std
    ``z_release * sqrt(2)``."""
    with torch.no_grad():
        logits = model(features)
    if output == "onehot":
        values = nn.functional.one_hot(logits.argmax(1), logits.shape[1]).float()
    else:
        values = logits.softmax(1)
    if budget is None:
        return values
    std = budget.release_noise_multiplier * RELEASE_SENSITIVITY
    return values + std * torch.randn(values.shape, generator=generator)


def propagated(values: torch.Tensor, edge_index: torch.Tensor, *, hops: int) -> torch.Tensor:
    """[X, AX, ..., A^K X] side by side, A the symmetric-normalised adjacency with self-loops."""
    n = values.shape[0]
    loops = torch.arange(n).repeat(2, 1)
    index = torch.cat([edge_index, loops], dim=1)
    degree = torch.bincount(index[1], minlength=n).float()
    weight = (degree[index[0]] * degree[index[1]]).rsqrt()
    adjacency = torch.sparse_coo_tensor(
        index.flip(0), weight, (n, n), check_invariants=False
    ).coalesce()
    out = [values]
    for _ in range(hops):
        out.append(torch.sparse.mm(adjacency, out[-1]))
    return torch.cat(out, dim=1)


@dataclass(frozen=True)
class ReceiverScore:
    """A receiver's fit, at its best validation accuracy."""

    val: float
    test: float
    # a two-class task: ROC-AUC of the class-1 probability on the test nodes (else None)
    test_roc_auc: float | None


def fit_receiver(inputs: torch.Tensor, part: ClientPartition, *, seed: int) -> ReceiverScore:
    """A logistic regression on standardised ``inputs``, its regularisation chosen on the
    validation nodes."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x = StandardScaler().fit(inputs[part.train_nodes].numpy()).transform(inputs.numpy())
    y = part.labels.numpy()
    best: tuple[float, LogisticRegression | None] = (-1.0, None)
    for strength in (0.001, 0.01, 0.1, 1.0):
        clf = LogisticRegression(C=strength, max_iter=300, random_state=seed)
        clf.fit(x[part.train_nodes], y[part.train_nodes])
        val = float(clf.score(x[part.val_nodes], y[part.val_nodes]))
        if val > best[0]:
            best = (val, clf)
    val, clf = best
    assert clf is not None
    probabilities = np.zeros((part.test_nodes.size, part.num_classes))
    probabilities[:, clf.classes_] = clf.predict_proba(x[part.test_nodes])
    metrics = classification_metrics(
        y[part.test_nodes], probabilities, num_classes=part.num_classes
    )
    return ReceiverScore(val=val, test=metrics["accuracy"], test_roc_auc=metrics.get("roc_auc"))


class ReleaseSession:
    """One session of the design over the parties' partitions: each party's release is computed
    at most once (:meth:`release`) and every receiver reads the same released tensors.
    :meth:`train` is each party's predictor (DP-SGD with ``budget``, or without noise when it is
    None): bench/predictor_release.py trains it with Opacus."""

    def __init__(
        self,
        parts: Sequence[ClientPartition],
        *,
        budget: ReleaseBudget | None,
        settings: PredictorSettings,
        seed: int,
    ) -> None:
        self.parts = list(parts)
        self.budget = budget
        self.settings = settings
        self.seed = seed
        self._released: dict[int, torch.Tensor] = {}
        self.release_count = [0] * len(self.parts)
        self._scores: dict[int, dict[str, ReceiverScore]] = {}

    def train(self, part: ClientPartition, *, seed: int) -> nn.Module:
        """Party ``part``'s predictor of its labels from its own feature rows."""
        raise NotImplementedError

    def release(self, party: int) -> torch.Tensor:
        if party not in self._released:
            part = self.parts[party]
            model = self.train(part, seed=self.seed * 101 + party)
            generator = torch.Generator().manual_seed(self.seed * 7919 + party)
            self._released[party] = release_once(
                model, part.features, budget=self.budget, output=self.settings.output,
                generator=generator,
            )  # fmt: skip
            self.release_count[party] += 1
        return self._released[party]

    def received(self, receiver: int) -> torch.Tensor:
        """What ``receiver`` keeps of the summed releases: the sum minus its own release."""
        total = torch.stack([self.release(m) for m in range(len(self.parts))]).sum(0)
        return total - self.release(receiver)

    def receiver_scores(self, receiver: int) -> dict[str, ReceiverScore]:
        """``receiver``'s fit alone and with the propagated block (computed once)."""
        if receiver not in self._scores:
            part, hops = self.parts[receiver], self.settings.hops
            own = propagated(part.features, part.edge_index, hops=hops)
            block = propagated(self.received(receiver), part.edge_index, hops=hops)
            self._scores[receiver] = {
                "alone": fit_receiver(own, part, seed=self.seed),
                "with release": fit_receiver(torch.cat([own, block], 1), part, seed=self.seed),
            }
        return self._scores[receiver]
