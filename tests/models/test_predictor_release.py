"""The privately trained predictor released once (models/predictor_release.py): its privacy
arithmetic, checked against accountants that compose the DP-SGD steps and the release one by
one, its one release per party and the receivers' fit. The session's predictors here are plain
seeded linear maps (the scale map trains them with Opacus: bench/predictor_release.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from scipy.stats import norm
from torch import nn

from models.data.csbm import csbm
from models.data.partition import ClientPartition, partition
from models.predictor_release import (
    RELEASE_SENSITIVITY,
    PredictorSettings,
    ReleaseBudget,
    ReleaseSession,
    fit_receiver,
    propagated,
    release_once,
    split_budget,
)

DELTA = 1e-6


class LinearSession(ReleaseSession):
    """Each party's predictor a seeded, untrained linear map; ``trained``: the parties trained."""

    def __init__(self, parts: list[ClientPartition], **settings: Any) -> None:
        super().__init__(parts, **settings)
        self.trained: list[int] = []

    def train(self, part: ClientPartition, *, seed: int) -> nn.Module:
        self.trained.append(part.client)
        torch.manual_seed(seed)
        return nn.Linear(part.features.shape[1], part.num_classes)


def _gaussian_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of mu-GDP (Balle and Wang 2018): exact for composed Gaussian releases."""
    return float(
        norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
    )


@pytest.mark.parametrize(("epsilon", "steps", "share"), [(1.0, 60, 0.5), (4.0, 200, 0.8)])
def test_split_budget_spends_epsilon_by_independent_accountants(
    epsilon: float, steps: int, share: float
) -> None:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from opacus.accountants import RDPAccountant

    budget = split_budget(epsilon=epsilon, delta=DELTA, steps=steps, release_share=share)
    spent = budget.spent()  # PRV on the single equivalent release
    assert epsilon - 0.02 <= spent <= epsilon + 1e-9
    # the stated split: share of mu^2 on the release, the rest evenly over the steps
    mu2 = budget.inverse_square_sum
    assert 1 / budget.release_noise_multiplier**2 == pytest.approx(share * mu2)
    assert steps / budget.sgd_noise_multiplier**2 == pytest.approx((1 - share) * mu2)

    # dp_accounting's PLD accountant, composing every step and the release one by one
    pld = PLDAccountant(value_discretization_interval=1e-3)
    pld.compose(dp_accounting.GaussianDpEvent(budget.sgd_noise_multiplier), steps)
    pld.compose(dp_accounting.GaussianDpEvent(budget.release_noise_multiplier))
    assert pld.get_epsilon(DELTA) == pytest.approx(epsilon, rel=0.02)

    # Opacus's RDP accountant over the same history: an upper bound, a little above
    rdp = RDPAccountant()
    rdp.history = [
        (budget.sgd_noise_multiplier, 1.0, steps),
        (budget.release_noise_multiplier, 1.0, 1),
    ]
    assert epsilon <= rdp.get_epsilon(DELTA) <= 1.25 * epsilon

    # and the closed form: the composition is sqrt(mu^2)-GDP, delta(epsilon) at most DELTA
    assert 0.8 * DELTA <= _gaussian_delta(spent, math.sqrt(mu2)) <= DELTA


def test_split_budget_refuses_a_share_outside_the_interval() -> None:
    with pytest.raises(ValueError, match="release_share"):
        split_budget(epsilon=1.0, delta=DELTA, steps=10, release_share=1.0)


def test_the_release_carries_gaussian_noise_of_std_z_times_sqrt2() -> None:
    budget = ReleaseBudget(
        epsilon=1.0, delta=DELTA, steps=1, release_share=0.5,
        sgd_noise_multiplier=1.0, release_noise_multiplier=3.0,
    )  # fmt: skip
    model = torch.nn.Linear(4, 5)
    features = torch.randn(20_000, 4)
    clean = release_once(model, features, budget=None, output="probs", generator=torch.Generator())
    noisy = release_once(
        model, features, budget=budget, output="probs", generator=torch.Generator().manual_seed(1)
    )
    assert float((noisy - clean).std()) == pytest.approx(3.0 * RELEASE_SENSITIVITY, rel=0.02)
    onehot = release_once(
        model, features, budget=None, output="onehot", generator=torch.Generator()
    )
    assert torch.equal(onehot.sum(1), torch.ones(20_000))  # a vote: any two lie sqrt(2) apart


def test_each_party_releases_once_and_every_receiver_reads_the_same_release() -> None:
    dataset = csbm(nodes=2000, degree=4, signal=2.0, train_per_class=20, seed=0)
    parts = partition(dataset, clients=3, edge_fraction=0.8, seed=0)
    settings = PredictorSettings(steps=5, hops=1)
    budget = split_budget(epsilon=4.0, delta=DELTA, steps=settings.steps)
    session = LinearSession(parts, budget=budget, settings=settings, seed=0)
    scores = [session.receiver_scores(m) for m in range(3)]
    assert session.release_count == [1, 1, 1] and sorted(session.trained) == [0, 1, 2]
    assert all(set(s) == {"alone", "with release"} for s in scores)
    releases = [session.release(m) for m in range(3)]
    assert session.release_count == [1, 1, 1] and len(session.trained) == 3
    torch.testing.assert_close(session.received(0), releases[1] + releases[2])
    torch.testing.assert_close(session.received(2), releases[0] + releases[1])
    assert session.receiver_scores(1) is scores[1]  # each receiver fitted once


def test_a_two_class_receiver_reports_the_roc_auc_of_its_class1_probability() -> None:
    """The receiver's ROC-AUC is sklearn's on the test nodes' class-1 probability of the
    regression chosen on the validation nodes (refitted here by hand); a 5-class task has none."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import StandardScaler

    two = csbm(nodes=2000, classes=2, degree=8, signal=2.0, train_per_class=30, seed=1)
    parts = partition(two, clients=3, edge_fraction=0.8, seed=1)
    part = parts[0]
    inputs = propagated(part.features, part.edge_index, hops=2)
    score = fit_receiver(inputs, part, seed=0)
    x = StandardScaler().fit(inputs[part.train_nodes].numpy()).transform(inputs.numpy())
    y = part.labels.numpy()
    fits = [
        LogisticRegression(C=c, max_iter=300, random_state=0).fit(
            x[part.train_nodes], y[part.train_nodes]
        )
        for c in (0.001, 0.01, 0.1, 1.0)
    ]
    vals = [f.score(x[part.val_nodes], y[part.val_nodes]) for f in fits]
    chosen = fits[vals.index(max(vals))]
    assert score.val == max(vals)
    assert score.test == chosen.score(x[part.test_nodes], y[part.test_nodes])
    expected = roc_auc_score(y[part.test_nodes], chosen.predict_proba(x[part.test_nodes])[:, 1])
    assert score.test_roc_auc == pytest.approx(expected)
    assert 0.7 < expected <= 1.0

    settings = PredictorSettings(hops=1)
    session = LinearSession(parts, budget=None, settings=settings, seed=0)
    for m in range(3):
        scores = session.receiver_scores(m)
        auc = [scores[key].test_roc_auc for key in ("alone", "with release")]
        assert all(v is not None and 0.5 < v <= 1.0 for v in auc)
    five = csbm(nodes=2000, degree=8, signal=2.0, train_per_class=30, seed=1)
    session = LinearSession(
        partition(five, clients=3, edge_fraction=0.8, seed=1), budget=None, settings=settings,
        seed=0,
    )  # fmt: skip
    assert {s.test_roc_auc for s in session.receiver_scores(0).values()} == {None}
