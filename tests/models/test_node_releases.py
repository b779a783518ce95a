"""Per-node accounting (models/node_releases.py, design 3 of issue 29): the releases that hold
each node are counted with the run's own sampling, seeds and schedule, exactly the rows a real
in-process run releases, and the noise calibrated for the worst node's releases is smaller than
for all passes and still meets the target epsilon."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from scipy.stats import norm

from models.config import TrainConfig
from models.data.csbm import csbm
from models.data.planetoid import GraphDataset
from models.node_releases import node_releases
from models.sampler import PassSampling
from models.trainer import train_inprocess
from secure.accounting import calibrate_noise_multiplier, epsilon_after

DELTA = 1e-6
# a small, sparse run: few nodes per pass, so that no node is in every training pass
CONFIG = TrainConfig(
    dataset="csbm-weak",
    encryption="none",
    rounds=6,
    eval_every=3,
    batch_size=2,
    fanout=2,
    hidden=16,
    epsilon=4.0,
    delta=DELTA,
)


@pytest.fixture(scope="module")
def dataset() -> GraphDataset:
    return csbm(nodes=2000, degree=6.0, train_per_class=10, seed=0)


def test_node_releases_are_the_rows_a_real_run_releases(dataset: GraphDataset) -> None:
    """Every training pass of an in-process private run: the rows S_m[0] under party m's release
    (its layer-1 sources after the union) are counted exactly as ``node_releases`` counts them."""
    seen = np.zeros((CONFIG.clients, dataset.num_nodes), dtype=np.int64)
    walk = PassSampling.walk

    def recording(
        self: PassSampling, pass_index: int, output_nodes: np.ndarray, fanout: int
    ) -> Generator[Any, Any, Any]:
        sampled = yield from walk(self, pass_index, output_nodes, fanout)
        seen[self.partition.client, sampled[0].sources] += 1
        return sampled

    with mock.patch.object(PassSampling, "walk", recording):
        report = train_inprocess(CONFIG, dataset=dataset, progress=False)
    releases = node_releases(CONFIG, dataset)
    assert seen.sum() > 0
    np.testing.assert_array_equal(releases.train, seen)
    assert releases.total == report.privacy["releases"] == 6 + 2
    assert releases.eval_passes == 2


def test_the_noise_is_calibrated_for_the_worst_node_and_meets_epsilon(
    dataset: GraphDataset,
) -> None:
    releases = node_releases(CONFIG, dataset)
    k = releases.worst
    assert k == releases.train.max() + releases.eval_passes
    assert releases.eval_passes < k < releases.total  # this run: no node is in every pass
    for epsilon in (1.0, 4.0):
        z_node = releases.noise_multiplier(epsilon=epsilon, delta=DELTA, accountant="rdp")
        z_all = calibrate_noise_multiplier(epsilon=epsilon, delta=DELTA, releases=releases.total)
        assert z_node < z_all
        # sample rate 1: the ratio is sqrt(k / R) up to the calibration's tolerance
        assert z_node / z_all == pytest.approx(math.sqrt(k / releases.total), rel=0.01)
        # the worst node's k releases at z_node meet the target: by the RDP accountant the
        # run uses, and by the exact curve of k composed Gaussian releases (mu = sqrt(k) / z)
        assert epsilon_after(noise_multiplier=z_node, releases=k, delta=DELTA) <= epsilon
        mu = math.sqrt(k) / z_node
        exact_delta = norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(
            -epsilon / mu - mu / 2
        )
        assert exact_delta <= DELTA
        # and no more noise than needed: 2% less would exceed the target
        assert epsilon_after(noise_multiplier=z_node * 0.98, releases=k, delta=DELTA) > epsilon


def test_per_node_accounting_is_for_the_private_arrangement(dataset: GraphDataset) -> None:
    with pytest.raises(ValueError, match="private arrangement"):
        node_releases(dataclasses.replace(CONFIG, dp=False), dataset)
