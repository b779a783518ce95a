"""Issue 37's comparison: is the federated model worth having at the sizes users have? On the scale
map's CSBM graphs (bench/frontier_scale.py: 5 classes, weak signal, degree 16, 1% labelled, M = 3
parties each keeping 80% of one graph's edges, every party labelled) and on graphs that differ
(models/data/party_graphs.py: the label holder, party 0, has a sparse graph of its own, the
partners dense ones, partly overlapping; only the label holder has labels), per graph and seed:

- **party alone, SGC**: the party's own features propagated K hops over its own graph, then a
  logistic regression (the scale map's SGC party alone, ``models.predictor_release``), K (of
  ``SGC_HOPS``) and its regularisation chosen on the validation nodes;
- **party alone, GCN / GraphSAGE**: PyG's GCN or GraphSAGE on the party's own features and graph;
- **centralised**: the joined data (all features, the union of the parties' edges): PyG's GCN,
  GraphSAGE and SGC (K = 3), and the SGC logistic regression above (K on the validation nodes);
- **federated**: non-private GLASU through the product's entry point
  (``models.trainer.train_inprocess``, encryption off) with what ``glasu train --no-dp`` runs:
  the recipe's backbone and choices (``models.recipe``), or ``--backbone``'s with its recipe;
- **federated private** (issue 40, ``--epsilons`` / ``--gcnii-epsilons``): the private sign
  design and the per-pass private gcnii at each epsilon (bench/model_at_scale_private.py).

``--classes 2`` draws two-class graphs instead (keys ending in ``-c2``; the 5-class keys are
unchanged): their SGC and federated rows record the test ROC-AUC too.

The PyG models train full batch on a sparse adjacency (memory: the edges once, no per-edge
messages), with Adam, and keep the test accuracy of the epoch with the best validation accuracy
(stopping after ``--patience`` epochs without a better one). A party-alone figure is the mean over
the labelled parties (every party of the shared graphs, the label holder of the differing ones);
the federated figure is the product's (mean over the clients with a head, each at the best
evaluation). Every run records its wall time and CPU seconds (this process, all threads; one
torch thread). Rows are keyed by (family, nodes, seed, method): a rerun runs only missing rows.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import model_at_scale_private as private
from bench.results_doc import (
    mean_roc_auc,
    mean_std,
    roc_auc_field,
    single_thread,
    write_json,
    write_section,
)
from models.config import TrainConfig
from models.data.csbm import SIGNALS, csbm
from models.data.partition import ClientPartition, partition
from models.data.party_graphs import LABEL_HOLDER, differing_party_graphs, joined_edges
from models.data.planetoid import GraphDataset
from models.layout import layout_federation
from models.predictor_release import fit_receiver, propagated
from models.recipe import choose_recipe
from models.trainer import train_inprocess

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "model_at_scale.json"
CHART = ROOT / "docs" / "model_at_scale.svg"
PRIVATE_CHART = ROOT / "docs" / "private_at_scale.svg"
SECTION = "model-at-scale-table"
CLASSES, DEGREE, LABELLED, PARTIES, HOPS = 5, 16.0, 0.01, 3, 3
SGC_HOPS = (2, 3, 5, 10)  # the SGC logistic regressions' K, chosen on the validation nodes
FAMILIES = ("shared", "differing")
DIFFERING_DEGREES, DIFFERING_OVERLAP = (4.0, 16.0, 16.0), 0.25  # the differing family's defaults
ALONE = ("party alone SGC", "party alone GCN", "party alone SAGE")
CENTRAL = ("centralised GCN", "centralised SAGE", "centralised SGC (PyG)", "centralised SGC (LR)")


@dataclass(frozen=True)
class Graph:
    """One graph of a family; ``load`` gives the joined data and the parties' partitions."""

    family: str
    nodes: int
    seed: int
    degrees: tuple[float, ...]
    overlap: float
    classes: int = CLASSES

    @property
    def key(self) -> str:
        """The 5-class graphs keep the keys they had before the classes axis (the JSON resumes)."""
        tail = "" if self.classes == CLASSES else f"-c{self.classes}"
        return f"{self.family}-n{self.nodes}-s{self.seed}{tail}"

    @property
    def label_holder(self) -> int | None:
        return LABEL_HOLDER if self.family == "differing" else None

    def load(self) -> tuple[GraphDataset, list[ClientPartition]]:
        per_class = max(1, round(LABELLED * self.nodes / self.classes))
        common = dict(classes=self.classes, signal=SIGNALS["weak"], train_per_class=per_class)
        if self.family == "differing":  # the nodes of a CSBM (its own sparse graph unused)
            nodes = csbm(nodes=self.nodes, degree=min(self.degrees), seed=self.seed, **common)
            graphs = differing_party_graphs(
                nodes, degrees=self.degrees, overlap=self.overlap, seed=self.seed
            )
            return graphs.joined, graphs.partitions
        graph = csbm(nodes=self.nodes, degree=DEGREE, seed=self.seed, **common)
        parts = partition(graph, clients=PARTIES, edge_fraction=0.8, seed=self.seed)
        joined = GraphDataset(**{**graph.__dict__, "edge_index": joined_edges(parts)})
        return joined, parts


def labelled(graph: Graph, parts: list[ClientPartition]) -> list[ClientPartition]:
    return parts if graph.label_holder is None else [parts[graph.label_holder]]


def pyg_model(kind: str, features: int, classes: int, hidden: int) -> torch.nn.Module:
    from torch_geometric.nn import GCN, GraphSAGE, SGConv

    if kind == "SGC":
        return SGConv(features, classes, K=HOPS, cached=True)
    if kind == "GCN":  # the normalised adjacency once, not at every forward
        return GCN(features, hidden, num_layers=2, out_channels=classes, dropout=0.5, cached=True)
    return GraphSAGE(features, hidden, num_layers=2, out_channels=classes, dropout=0.5)


def fit_pyg(
    kind: str,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    split: ClientPartition | GraphDataset,
    *,
    args: argparse.Namespace,
    seed: int,
) -> dict[str, float]:
    """PyG's ``kind`` full batch on a sparse adjacency; the test accuracy at the best validation."""
    from torch_geometric.utils import to_torch_csr_tensor

    torch.manual_seed(seed)
    n = x.shape[0]
    adjacency = to_torch_csr_tensor(edge_index, size=(n, n))  # symmetric: its own transpose
    y = split.labels
    train, val, test = (
        torch.from_numpy(s) for s in (split.train_nodes, split.val_nodes, split.test_nodes)
    )
    classes = int(y[train].max()) + 1
    model = pyg_model(kind, x.shape[1], classes, args.hidden)
    lr, decay = (0.2, 5e-5) if kind == "SGC" else (0.01, 5e-4)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=decay)
    best = {"val": -1.0, "test": 0.0, "epoch": 0}
    for epoch in range(args.epochs):
        model.train()
        optimizer.zero_grad()
        out = model(x, adjacency)
        torch.nn.functional.cross_entropy(out[train], y[train]).backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            predicted = model(x, adjacency).argmax(1)
        val_acc = float((predicted[val] == y[val]).float().mean())
        if val_acc > best["val"]:
            best = {
                "val": val_acc,
                "test": float((predicted[test] == y[test]).float().mean()),
                "epoch": epoch,
            }
        elif epoch - best["epoch"] >= args.patience:
            break
    return best


def fit_sgc_lr(
    x: torch.Tensor, edge_index: torch.Tensor, part: ClientPartition, *, seed: int
) -> dict[str, float]:
    """The SGC logistic regression at the K of ``SGC_HOPS`` with the best validation accuracy."""
    widest = propagated(x, edge_index, hops=max(SGC_HOPS))
    width = x.shape[1]
    scores = {k: fit_receiver(widest[:, : (k + 1) * width], part, seed=seed) for k in SGC_HOPS}
    hops = max(SGC_HOPS, key=lambda k: scores[k].val)
    best = scores[hops]
    return {"val": best.val, "test": best.test, "hops": hops, **roc_auc_field(best.test_roc_auc)}


def federated(
    graph: Graph,
    joined: GraphDataset,
    parts: list[ClientPartition],
    args: argparse.Namespace,
    *,
    backbone: str = "",
    **privacy: Any,
) -> dict[str, Any]:
    """GLASU through the product's entry point as ``glasu train`` runs it: the recipe's backbone
    and choices (``models.recipe``), or ``backbone``'s (default ``--backbone``'s); ``--rounds``
    given wins, as on the command line. Without ``privacy`` what ``--no-dp`` runs; with it
    (``epsilon`` and the release's settings, as flags given) a private run at ``DELTA``."""
    backbone = backbone or args.backbone
    overrides: dict[str, Any] = {"rounds": args.rounds} if args.rounds else {}
    if backbone:
        overrides["backbone"] = backbone
    config = TrainConfig(
        dataset=joined.name, seed=graph.seed, clients=len(parts), dp=bool(privacy),
        encryption="none", device="cpu", label_holder=graph.label_holder,
        **overrides, **privacy,
    )  # fmt: skip
    recipe = choose_recipe(
        backbone=backbone or None, labelled=len(joined.train_nodes), private=bool(privacy)
    )
    given = ["--" + field.replace("_", "-") for field in (*overrides, *privacy)]
    config, _ = recipe.apply(config, given=given)
    layout = layout_federation(config, joined, partitions=parts)
    report = train_inprocess(config, dataset=joined, layout=layout, progress=False)
    recipe = {
        k: getattr(config, k)
        for k in (
            "backbone",
            "hops",
            "feature_scale",
            "rounds",
            "batch_size",
            "stale",
            "layers",
            "agg_layers",
            "fanout",
            "eval_every",
            "hidden",
            "lr",
        )
    }
    per_party = [m["accuracy"] for m in report.test_metrics or [] if m]
    return {
        "test": report.test_accuracy,
        "val": report.val_accuracy,
        "best_round": report.best_round,
        "per_party": per_party,
        "recipe": recipe,
        **mean_roc_auc(report.test_metrics),
        # a private run's own party-alone reference (the sign design: its head on its own hops)
        **(
            {"privacy": _privacy(report.privacy), "reference_test": report.reference_test_accuracy}
            if privacy
            else {}
        ),
    }


def _privacy(summary: dict[str, Any] | None) -> dict[str, Any]:
    """What a row keeps of a private run's privacy summary."""
    kept = ("epsilon", "delta", "noise_multiplier", "sensitivity", "noise_std", "releases",
            "accountant", "release", "occurrence_cap", "degree_floor")  # fmt: skip
    return {k: (summary or {}).get(k) for k in kept}


def methods(
    graph: Graph, joined: GraphDataset, parts: list[ClientPartition], args: argparse.Namespace
) -> dict[str, Callable[[], dict[str, Any]]]:
    """Every method's run on this graph, by name (each a closure measured by :func:`measure`)."""
    holders = labelled(graph, parts)

    def alone(fit: Callable[[ClientPartition], dict[str, float]]) -> Callable[[], dict[str, Any]]:
        def run() -> dict[str, Any]:
            scores = [fit(p) for p in holders]
            return {
                "test": float(np.mean([s["test"] for s in scores])),
                "val": float(np.mean([s["val"] for s in scores])),
                "per_party": [s["test"] for s in scores],
                **mean_roc_auc(scores),
            }

        return run

    def central(kind: str) -> Callable[[], dict[str, Any]]:
        return lambda: fit_pyg(
            kind, joined.features, joined.edge_index, joined, args=args, seed=graph.seed
        )

    def joined_sgc() -> dict[str, Any]:
        whole = partition(
            joined, clients=1, edge_fraction=1.0, seed=graph.seed, split_features=False
        )
        return fit_sgc_lr(joined.features, joined.edge_index, whole[0], seed=graph.seed)

    return {
        ALONE[0]: alone(lambda p: fit_sgc_lr(p.features, p.edge_index, p, seed=graph.seed)),
        ALONE[1]: alone(
            lambda p: fit_pyg("GCN", p.features, p.edge_index, p, args=args, seed=graph.seed)
        ),
        ALONE[2]: alone(
            lambda p: fit_pyg("SAGE", p.features, p.edge_index, p, args=args, seed=graph.seed)
        ),
        CENTRAL[0]: central("GCN"),
        CENTRAL[1]: central("SAGE"),
        CENTRAL[2]: central("SGC"),
        CENTRAL[3]: joined_sgc,
        federated_name(args): lambda: federated(graph, joined, parts, args),
        **private.private_methods(
            lambda **settings: federated(graph, joined, parts, args, **settings),
            sign=_floats(args.epsilons),
            gcnii=_floats(args.gcnii_epsilons),
        ),
    }


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def federated_name(args: argparse.Namespace) -> str:
    return f"federated {args.backbone}" if args.backbone else "federated (recipe)"


def measure(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run``'s result with its wall time and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return {
        **result,
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def graphs(args: argparse.Namespace) -> list[Graph]:
    """Seed-major: a run cut short has every size and family of its first seeds."""
    degrees = tuple(float(d) for d in args.degrees.split(","))
    return [
        Graph(family, int(float(n)), seed, degrees, args.overlap, classes)
        for seed in range(args.seeds)
        for n in args.nodes.split(",")
        for classes in (int(c) for c in args.classes.split(","))
        for family in args.families.split(",")
    ]


def run_all(args: argparse.Namespace, payload: dict[str, Any]) -> None:
    runs: list[dict[str, Any]] = payload.setdefault("runs", [])
    done = {(r["graph"], r["method"]) for r in runs}
    wanted = set(args.methods.split(",")) if args.methods else None
    for graph in graphs(args):
        loaded: tuple[GraphDataset, list[ClientPartition]] | None = None
        names = [*ALONE, *CENTRAL, federated_name(args)]
        names += [private.private_sign_name(e) for e in _floats(args.epsilons)]
        names += [private.private_gcnii_name(e) for e in _floats(args.gcnii_epsilons)]
        for name in names:
            if (graph.key, name) in done or (wanted is not None and name not in wanted):
                continue
            loaded = loaded or graph.load()
            run = methods(graph, *loaded, args)[name]
            row = {
                "graph": graph.key,
                "family": graph.family,
                "nodes": graph.nodes,
                "seed": graph.seed,
                "classes": graph.classes,
                "method": name,
                **measure(run),
            }
            runs.append(row)
            write_json(args.out, payload)
            print(
                f"  {graph.key} {name}: {100 * row['test']:.1f} "
                f"({row['wall_s']:.0f} s wall, {row['cpu_s']:.0f} s CPU)",
                flush=True,
            )


def table(runs: list[dict[str, Any]]) -> str:
    """Markdown: per family and size, each method's test accuracy (mean ± std over seeds), its
    gap to the best party alone and to the best centralised, wall and CPU seconds."""
    lines = [
        "| family | nodes | method | seeds | test accuracy | vs best party alone "
        "| vs best centralised | wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    cells = sorted(
        {(r["family"], r["nodes"]) for r in runs}, key=lambda c: (FAMILIES.index(c[0]), c[1])
    )
    for family, nodes in cells:
        rows = [r for r in runs if (r["family"], r["nodes"]) == (family, nodes)]
        best_alone = _best_per_seed(rows, ALONE)
        best_central = _best_per_seed(rows, CENTRAL)
        order = [m for m in (*ALONE, *CENTRAL) if any(r["method"] == m for r in rows)]
        order += sorted({r["method"] for r in rows} - set(order))
        for method in order:
            mine = [r for r in rows if r["method"] == method]
            lines.append(
                f"| {family} | {nodes:,} | {method} | {len(mine)} "
                f"| {mean_std([r['test'] for r in mine])} "
                f"| {_gap(mine, best_alone)} | {_gap(mine, best_central)} "
                f"| {np.mean([r['wall_s'] for r in mine]):.0f} "
                f"| {np.mean([r['cpu_s'] for r in mine]):.0f} |"
            )
    return "\n".join(lines)


def _best_per_seed(rows: list[dict[str, Any]], among: tuple[str, ...]) -> dict[int, float]:
    best: dict[int, float] = {}
    for r in rows:
        if r["method"] in among:
            best[r["seed"]] = max(best.get(r["seed"], 0.0), r["test"])
    return best


def _gap(mine: list[dict[str, Any]], best: dict[int, float]) -> str:
    gaps = [100 * (r["test"] - best[r["seed"]]) for r in mine if r["seed"] in best]
    return f"{np.mean(gaps):+.1f}" if gaps else "-"


def chart(runs: list[dict[str, Any]], path: Path) -> None:
    """One panel per family: test accuracy by method (mean over seeds) at each size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f for f in FAMILIES if any(r["family"] == f for r in runs)]
    fig, axes = plt.subplots(1, len(families), figsize=(6.0 * len(families), 4.2), squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        rows = [r for r in runs if r["family"] == family]
        sizes = sorted({r["nodes"] for r in rows})
        names = [m for m in (*ALONE, *CENTRAL) if any(r["method"] == m for r in rows)]
        names += sorted({r["method"] for r in rows} - set(names))
        width = 0.8 / max(1, len(sizes))
        for i, nodes in enumerate(sizes):
            means = [
                100
                * np.mean(
                    [r["test"] for r in rows if (r["method"], r["nodes"]) == (m, nodes)] or [np.nan]
                )
                for m in names
            ]
            ax.bar(np.arange(len(names)) + i * width, means, width, label=f"{nodes:,} nodes")
        ax.set_xticks(
            np.arange(len(names)) + width * (len(sizes) - 1) / 2,
            names,
            rotation=40,
            ha="right",
            fontsize=7,
        )
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{family} party graphs", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="20000", help="graph sizes, e.g. 20000,100000,1000000")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument(
        "--degrees",
        default=",".join(f"{d:g}" for d in DIFFERING_DEGREES),
        help="differing family: each party's degree (party 0 the label holder)",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=DIFFERING_OVERLAP,
        help="differing family: share of the sparsest graph every party holds",
    )
    parser.add_argument(
        "--backbone", default="", help="federated: --backbone (default: the recipe's choice)"
    )
    parser.add_argument(
        "--rounds", type=int, default=0, help="federated: rounds (0: TrainConfig's default)"
    )
    parser.add_argument(
        "--classes", default=str(CLASSES), help="classes of the graphs, e.g. 5,2 (2: ROC-AUC too)"
    )
    parser.add_argument(
        "--epsilons",
        default="",
        help="federated private sign at these epsilons, e.g. 1,2,4,8 (default: none)",
    )
    parser.add_argument(
        "--gcnii-epsilons",
        default="",
        help="federated private gcnii (degree-normalised release) at these epsilons, e.g. 4,8",
    )
    parser.add_argument(
        "--methods", default="", help="only these methods (comma-separated names as in the table)"
    )
    parser.add_argument("--hidden", type=int, default=16, help="PyG GCN/GraphSAGE width")
    parser.add_argument(
        "--epochs", type=int, default=200, help="PyG models: at most this many full-batch epochs"
    )
    parser.add_argument("--patience", type=int, default=50)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the table and chart from --out"
    )
    parser.add_argument(
        "--write-doc",
        action="store_true",
        help=f"write docs/results.md's {SECTION} section and {CHART.name}",
    )
    args = parser.parse_args(argv)
    single_thread()
    payload = json.loads(args.out.read_text()) if args.out.exists() else {}
    payload["settings"] = (
        f"CSBM: {CLASSES} classes, weak signal, {LABELLED:.0%} labelled, 500 val / 1000 test; "
        f"shared: degree {DEGREE:g}, M={PARTIES} each keeping 80% of the edges; differing: "
        f"degrees {args.degrees}, overlap {args.overlap:g}, label holder {LABEL_HOLDER}; PyG: "
        f"hidden {args.hidden}, {args.epochs} epochs, patience {args.patience}; PyG SGC K={HOPS}, "
        f"SGC (LR) K of {SGC_HOPS} on validation; "
        "one torch thread"
    )
    if not args.report_only:
        run_all(args, payload)
    runs = payload.get("runs", [])
    # issue 37's table and chart: its methods on the 5-class graphs, as they were
    before = [r for r in runs if not private.is_private(r["method"]) and "-c" not in r["graph"]]
    markdown = table(before)
    private_markdown = private.private_table(runs, alone=ALONE)
    print(markdown, private_markdown, sep="\n\n")
    if args.write_doc:
        chart(before, CHART)
        write_section(SECTION, markdown)
        private.private_chart(runs, PRIVATE_CHART, alone=ALONE)
        write_section(private.SECTION, private_markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
