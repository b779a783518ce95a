"""Issue 40's private methods of bench/model_at_scale.py, and their table and chart.

- **federated private sign (eps=E)**: the private ``sign`` design (each party releases once its
  degree-normalised, noised layer-1 aggregate over its own graph, then propagates it locally;
  the receivers train on their own clean propagated features plus the others' released sum),
  through ``models.trainer.train_inprocess`` as ``glasu train --backbone sign`` runs it under
  differential privacy at epsilon E, delta :data:`DELTA`;
- **federated private gcnii degree-normalised (eps=E)**: the product's per-pass private gcnii
  with ``release: degree-normalised`` (docs/privacy.md 3.7), for continuity with the old map
  (bench/frontier_scale.py's design 1): every training and evaluation pass a release.

The table compares each private cell with the best party alone and with non-private federated
GLASU (the recipe) on the same graphs and seeds; on two-class graphs by test ROC-AUC. Issue 40's
bar: a gain of at least 2 points over the better party alone, mean minus one std over seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The map's delta (bench/frontier_scale.py) and its epsilons
DELTA = 1e-6
EPSILONS = (1.0, 2.0, 4.0, 8.0)
#: Issue 40's bar, in points of the headline metric
BAR = 2.0
#: The private sign design's ``TrainConfig`` fields besides dp and epsilon (hd's design)
SIGN_DESIGN: dict[str, Any] = {}
GCNII_DESIGN: dict[str, Any] = {"release": "degree-normalised"}
REFERENCE = "federated (recipe)"
#: bench/model_at_scale.py's --write-doc section of this table
SECTION = "private-at-scale-table"


def private_sign_name(epsilon: float) -> str:
    return f"federated private sign (eps={epsilon:g})"


def private_gcnii_name(epsilon: float) -> str:
    return f"federated private gcnii degree-normalised (eps={epsilon:g})"


def private_methods(
    train: Callable[..., dict[str, Any]], *, sign: Sequence[float], gcnii: Sequence[float]
) -> dict[str, Callable[[], dict[str, Any]]]:
    """The private runs at each epsilon, by name; ``train`` is bench/model_at_scale.py's
    ``federated`` on one graph (its backbone, then the privacy fields, as flags given)."""

    def run(backbone: str, epsilon: float, design: dict[str, Any]) -> Callable[[], dict]:
        return lambda: train(backbone=backbone, epsilon=epsilon, delta=DELTA, **design)

    def gcnii_run(epsilon: float) -> Callable[[], dict[str, Any]]:
        def without_its_reference() -> dict[str, Any]:
            from bench.frontier import without_reference  # our party-alone rows stand for it

            with without_reference():
                return run("gcnii", epsilon, GCNII_DESIGN)()

        return without_its_reference

    return {
        **{private_sign_name(e): run("sign", e, SIGN_DESIGN) for e in sign},
        **{private_gcnii_name(e): gcnii_run(e) for e in gcnii},
    }


def metric_of(classes: int) -> str:
    """The headline metric of a graph's rows: ROC-AUC for two classes, else accuracy."""
    return "roc_auc" if classes == 2 else "test"


def is_private(method: str) -> bool:
    return method.startswith("federated private")


def _cell(row: dict[str, Any]) -> tuple[str, int, int]:
    return row["family"], row["nodes"], row.get("classes", 5)


def _cells(runs: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    cells = {_cell(r) for r in runs if is_private(r["method"])}
    return sorted(cells, key=lambda c: (c[2], c[0] != "shared", c[1]))


def _per_seed(rows: list[dict[str, Any]], metric: str, among: Sequence[str]) -> dict[int, float]:
    best: dict[int, float] = {}
    for r in rows:
        if r["method"] in among and metric in r:
            best[r["seed"]] = max(best.get(r["seed"], -1.0), r[metric])
    return best


def _gaps(mine: list[dict[str, Any]], metric: str, ref: dict[int, float]) -> list[float]:
    return [100 * (r[metric] - ref[r["seed"]]) for r in mine if r["seed"] in ref and metric in r]


def summary(runs: list[dict[str, Any]], *, alone: Sequence[str]) -> list[dict[str, Any]]:
    """Per (family, nodes, classes) with private runs: the best party alone, the non-private
    reference and each private method, with their gaps (points, per seed) and the bar."""
    out = []
    for family, nodes, classes in _cells(runs):
        rows = [r for r in runs if _cell(r) == (family, nodes, classes)]
        metric = metric_of(classes)
        best_alone = _per_seed(rows, metric, alone)
        reference = _per_seed(rows, metric, [REFERENCE])
        ran = [m for m in alone if any(r["method"] == m and metric in r for r in rows)]
        # of the party-alone methods, the best on average: the others stay in issue 37's table
        shown = [max(ran, key=lambda m: _mean_of(rows, m, metric))] if ran else []
        methods = [m for m in (*shown, REFERENCE) if any(r["method"] == m for r in rows)]
        methods += sorted({r["method"] for r in rows if is_private(r["method"])}, key=_order)
        for method in methods:
            mine = [r for r in rows if r["method"] == method]
            gains = _gaps(mine, metric, best_alone)
            out.append({
                "family": family, "nodes": nodes, "classes": classes, "method": method,
                "seeds": len(mine), "metric": metric,
                "value": [100 * r[metric] for r in mine if metric in r],
                "accuracy": [100 * r["test"] for r in mine],
                "gain": gains, "vs_reference": _gaps(mine, metric, reference),
                "cpu_s": float(np.mean([r["cpu_s"] for r in mine])),
                "passes": bool(gains) and np.mean(gains) - np.std(gains) >= BAR,
            })  # fmt: skip
    return out


def _mean_of(rows: list[dict[str, Any]], method: str, metric: str) -> float:
    return float(np.mean([r[metric] for r in rows if r["method"] == method and metric in r]))


def _order(method: str) -> tuple[bool, float]:
    """sign before gcnii, then by epsilon."""
    return ("gcnii" in method, float(method.rsplit("=", 1)[1].rstrip(")")))


def _mean_std(values: list[float], sign: bool = False) -> str:
    if not values:
        return "-"
    mean = f"{np.mean(values):+.1f}" if sign else f"{np.mean(values):.1f}"
    return mean if len(values) == 1 else f"{mean} ± {np.std(values):.1f}"


def _verdict(cell: dict[str, Any]) -> str:
    """Whether a cell passes the bar; one seed has no spread to subtract, so it only hints."""
    if not cell["passes"]:
        return "no"
    return "**yes**" if len(cell["gain"]) > 1 else "yes (1 seed: no std)"


def private_table(runs: list[dict[str, Any]], *, alone: Sequence[str]) -> str:
    """Markdown: per cell, each method's headline metric (accuracy, or ROC-AUC for two classes)
    and accuracy, mean ± std over seeds, its gain over the best party alone (mean ± std of the
    per-seed gains), against non-private federated, CPU seconds and whether it passes the bar."""
    lines = [
        "| family | nodes | classes | method | seeds | metric | value | test accuracy "
        f"| vs best party alone | vs {REFERENCE} | CPU s | bar (+{BAR:g}, mean - std) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary(runs, alone=alone):
        private = is_private(c["method"])
        lines.append(
            f"| {c['family']} | {c['nodes']:,} | {c['classes']} | {c['method']} | {c['seeds']} "
            f"| {'ROC-AUC' if c['metric'] == 'roc_auc' else 'accuracy'} "
            f"| {_mean_std(c['value'])} | {_mean_std(c['accuracy'])} "
            f"| {_mean_std(c['gain'], sign=True)} | {_mean_std(c['vs_reference'], sign=True)} "
            f"| {c['cpu_s']:.0f} | {_verdict(c) if private else ''} |"
        )
    return "\n".join(lines)


def private_chart(runs: list[dict[str, Any]], path: Path, *, alone: Sequence[str]) -> None:
    """The private sign design's gain over the best party alone by epsilon, one line per
    family, size and classes (error bars: std over seeds), the bar dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    cells = summary(runs, alone=alone)
    for family, nodes, classes in _cells(runs):
        points = [
            (float(c["method"].rsplit("=", 1)[1].rstrip(")")), c["gain"])
            for c in cells
            if _cell(c) == (family, nodes, classes)
            and c["method"].startswith("federated private sign")
            and c["gain"]
        ]
        if not points:
            continue
        eps = [p[0] for p in points]
        ax.errorbar(
            eps,
            [np.mean(p[1]) for p in points],
            yerr=[np.std(p[1]) for p in points],
            marker="o",
            capsize=3,
            label=f"{family}, {nodes:,} nodes" + (", 2 classes (ROC-AUC)" if classes == 2 else ""),
        )
    ax.axhline(BAR, color="grey", linestyle="--", linewidth=1)
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(EPSILONS), [f"{e:g}" for e in EPSILONS])
    ax.set_xlabel("epsilon (delta 1e-6)")
    ax.set_ylabel("gain over the best party alone (points)")
    ax.set_title("private sign design: gain over the best party alone", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
