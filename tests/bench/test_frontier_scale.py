"""Design 3 of issue 29 (bench/frontier_scale.py): the releases that hold each node are counted
with the run's own sampler, seeds and schedule (checked against what a real in-process run
samples), and the noise calibrated for the worst node's releases is smaller than for all passes
and still meets the target epsilon."""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from scipy.stats import norm

from bench.frontier_scale import (
    DELTA,
    ScaleGraph,
    chart,
    design3_noise_multiplier,
    five_class,
    node_releases,
    runs_of_graph,
    summarize,
    table,
    two_class_table,
)
from models.config import TrainConfig
from models.data.csbm import csbm
from models.data.planetoid import GraphDataset
from models.federated import GlasuClient
from models.predictor_release import PredictorSettings
from models.trainer import train_inprocess
from secure.accounting import calibrate_noise_multiplier, epsilon_after

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
    original = GlasuClient._sample

    def recording(
        self: GlasuClient, pass_index: int, output_nodes: np.ndarray, fanout: int
    ) -> Generator[Any, Any, Any]:
        sampled = yield from original(self, pass_index, output_nodes, fanout)
        seen[self.partition.client, sampled[0].sources] += 1
        return sampled

    with mock.patch.object(GlasuClient, "_sample", recording):
        report = train_inprocess(CONFIG, dataset=dataset, progress=False)
    releases = node_releases(CONFIG, dataset)
    assert seen.sum() > 0
    np.testing.assert_array_equal(releases.train, seen)
    assert releases.total == report.privacy["releases"] == 6 + 2
    assert releases.eval_passes == 2


def test_design3_noise_is_calibrated_for_the_worst_node_and_meets_epsilon(
    dataset: GraphDataset,
) -> None:
    releases = node_releases(CONFIG, dataset)
    k = releases.worst
    assert k == releases.train.max() + releases.eval_passes
    assert releases.eval_passes < k < releases.total  # this run: no node is in every pass
    for epsilon in (1.0, 4.0):
        z_node = design3_noise_multiplier(releases, epsilon=epsilon)
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


def test_a_two_class_graph_has_its_own_key_and_five_class_keys_are_unchanged() -> None:
    five = ScaleGraph(20_000, 0.01, "weak", 16.0, 0)
    assert five.key == "n20000-l0.01-weak-d16-s0"  # the rows already in the JSON resume
    two = ScaleGraph(2_000, 0.02, "strong", 8.0, 1, classes=2)
    assert two.key == "n2000-l0.02-strong-d8-s1-c2"
    dataset = two.load()
    assert int(dataset.labels.max()) == 1
    assert dataset.train_nodes.size == 40  # 2% of the nodes, 20 per class


def _row(graph: str, design: str, test: float, roc_auc: float | None = None, **point: Any) -> dict:
    row = {"graph": graph, "nodes": 20_000, "labelled": 0.01, "signal": "weak", "degree": 16.0,
           "design": design, "epsilon": 4.0 if design.startswith("design") else None,
           "test": test, **point}  # fmt: skip
    return row if roc_auc is None else {**row, "roc_auc": roc_auc}


def test_summary_keeps_the_classes_apart_and_gains_roc_auc_over_the_better_party_alone() -> None:
    runs = [
        # a 5-class graph written before the classes axis (no "classes" field)
        _row("a", "party alone (GNN)", 0.40),
        _row("a", "party alone (SGC)", 0.70),
        _row("a", "design 2", 0.72),
        # the two-class point, two seeds: the better accuracy and the better ROC-AUC come from
        # different references
        *[
            r
            for graph, shift in (("b0", 0.0), ("b1", 0.02))
            for r in (
                _row(graph, "party alone (GNN)", 0.80 + shift, 0.95, classes=2),
                _row(graph, "party alone (SGC)", 0.85 + shift, 0.90, classes=2),
                _row(graph, "design 2", 0.86 + shift, 0.93 - shift, classes=2),
            )
        ],
    ]
    summary = {(s["classes"], s["design"]): s for s in summarize(runs)}
    assert summary[(5, "design 2")]["gain"] == [2.0, 0.0]
    assert "roc_auc" not in summary[(5, "design 2")]
    two = summary[(2, "design 2")]
    assert two["seeds"] == 2
    assert two["test"] == [87.0, 1.0]
    assert two["gain"] == [1.0, 0.0]  # over the SGC's accuracy
    assert two["roc_auc"] == [92.0, 1.0]
    assert two["roc_auc_gain"] == [-3.0, 1.0]  # over the GNN's ROC-AUC
    markdown = table(summarize(runs), [4.0])
    assert markdown.count("\n") == 2  # the 5-class point only
    two_class = two_class_table(summarize(runs), [4.0])
    row = "| 20,000 | 1% | weak | 16 | design 2 ε=4 | 2 | 87.0 | +1.0 ± 0.0 | 92.0 | -3.0 ± 1.0 |"
    assert row in two_class
    assert "| party alone (GNN) | 2 | 81.0 |  | 95.0 |  |" in two_class
    assert two_class_table(five_class(summarize(runs)), [4.0]) == ""


@pytest.mark.slow
def test_every_design_of_a_two_class_graph_records_its_roc_auc(tmp_path: Any) -> None:
    """A short run of each stage on a small two-class graph: every row carries a ROC-AUC, the
    GNN reference's taken at its own best validation."""
    graph = ScaleGraph(2_000, 0.02, "strong", 8.0, 0, classes=2)
    rows: list[dict] = []
    done: set = set()
    for stage in ("design 2", "first"):
        runs_of_graph(
            graph, epsilons=[4.0], schedule={"rounds": 4, "eval_every": 2},
            settings=PredictorSettings(steps=5), release_share=0.5, done=done, save=rows.append,
            stage=stage, priority=(4.0,),
        )  # fmt: skip
    designs = {(r["design"], r["epsilon"]) for r in rows}
    assert designs == {
        ("party alone (SGC)", None), ("design 2 no noise", None), ("design 2", 4.0),
        ("party alone (GNN)", None), ("design 1", 4.0), ("design 3", 4.0),
        ("non-private GLASU", None),
    }  # fmt: skip
    for r in rows:
        assert r["classes"] == 2 and r["graph"].endswith("-c2")
        assert 0.0 <= r["roc_auc"] <= 1.0, r


def test_the_chart_draws_the_five_class_points_with_their_spread(tmp_path: Any) -> None:
    runs = [
        _row(g, d, t, seed=seed, classes=c)
        for c in (5, 2)
        for seed, g in enumerate(("x0", "x1") if c == 5 else ("y0",))
        for d, t in (("party alone (SGC)", 0.7), ("design 2", 0.71 + 0.01 * seed))
    ]
    path = tmp_path / "chart.svg"
    chart(summarize(runs), [4.0], path)
    svg = path.read_text()
    assert "design 2 ε=4" in svg and "20,000 nodes, 1% labelled, weak" in svg
    assert svg.count("20,000 nodes") == 1  # one panel: the two-class point is not drawn
