"""The scale map of issue 29 (bench/frontier_scale.py): its graph keys, its summary, tables and
chart, and a short run of every design. Design 3's accounting is the product's
(tests/models/test_node_releases.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.frontier_scale import (
    ScaleGraph,
    chart,
    five_class,
    runs_of_graph,
    summarize,
    table,
    two_class_table,
)
from models.predictor_release import PredictorSettings


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
