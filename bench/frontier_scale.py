"""The scale map of issue 29 (``python -m bench.frontier --map scale``): CSBM graphs over nodes,
labelled fraction, degree, signal and epsilon, and on each graph, in the same run:

- **party alone (GNN)**: the party-alone reference of the product's private run (models/private.py:
  the same sampled GCNII on the same batches without the others' release), mean over parties;
- **design 1**: the product's private arrangement (TrainConfig defaults, fewer rounds) at each ε;
- **non-private GLASU**;
- **party alone (SGC)**: design 2's receiver without the block (a logistic regression on the
  party's own features propagated K hops over its own graph), mean over parties;
- **design 2**: a privately trained predictor released once (bench/predictor_release.py) at each
  ε, and without noise (its ceiling);
- **design 3**: design 1 with per-node accounting (docs/privacy.md 4.4): its noise multiplier
  calibrated for the k releases of the worst node (``models.node_releases``: the most training
  passes whose layer-1 release holds one node's row at one party, counted with the run's own
  sampler, seeds and schedule, plus every evaluation pass) instead of all passes.

The gain of each design is measured against the better of the two party-alone references of the
same graph and seed (what a party could get by itself with either model). ``--classes 2`` draws
the two-class graphs instead (their keys end in ``-c2``; 5-class keys are unchanged): every run
of those also records its test ROC-AUC (class 1's probability, sklearn through
``models.metrics``), gained over the party alone with the better ROC-AUC, in a table of its
own. Encryption is off (CKKS reproduces plaintext sums). ``--passes-per-node`` answers design
3's question instead: in how many training passes' layer-1 releases a node's row is, over a
default run (sampler and schedule only, no training).

Every run is one row of the JSON, keyed by (graph, schedule, design, ε): a rerun with more
graphs, designs or ε runs only the missing rows, and processes started side by side add their
rows to the same file (under a lock).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import regime_map
from bench.predictor_release import PredictorRelease
from bench.results_doc import mean_roc_auc, roc_auc_field, write_section
from models.config import TrainConfig
from models.data.csbm import SIGNALS, csbm
from models.data.partition import partition
from models.data.planetoid import NUM_TEST, NUM_VAL, GraphDataset
from models.node_releases import NodeReleases, node_releases
from models.predictor_release import PredictorSettings, split_budget
from models.trainer import train_inprocess

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "frontier_scale.json"
CHART = ROOT / "docs" / "frontier_scale.svg"
DELTA = 1e-6
CLASSES = 5
ALONE = ("party alone (GNN)", "party alone (SGC)")
STAGES = ("design 2", "first", "rest")


@dataclass(frozen=True)
class ScaleGraph:
    nodes: int
    labelled: float
    signal: str
    degree: float
    seed: int
    classes: int = CLASSES

    @property
    def key(self) -> str:
        """The 5-class graphs keep the keys they had before the classes axis (the JSON resumes)."""
        tail = "" if self.classes == CLASSES else f"-c{self.classes}"
        return f"n{self.nodes}-l{self.labelled:g}-{self.signal}-d{self.degree:g}-s{self.seed}{tail}"

    def load(self) -> GraphDataset:
        per_class = max(1, round(self.labelled * self.nodes / self.classes))
        return csbm(
            nodes=self.nodes,
            classes=self.classes,
            degree=self.degree,
            signal=SIGNALS[self.signal],
            train_per_class=per_class,
            seed=self.seed,
        )


def graphs(args: argparse.Namespace) -> list[ScaleGraph]:
    """Seed-major, so that a run cut short still has whole maps for its first seeds."""
    return [
        ScaleGraph(n, lab, sig, deg, seed, classes)
        for seed in range(args.seeds)
        for classes in _ints(args.classes)
        for n in _ints(args.nodes)
        for lab in _floats(args.labelled)
        for sig in args.signals.split(",")
        for deg in _floats(args.degrees)
    ]


Key = tuple[str, int, int, str, float | None]  # graph, rounds, eval_every, design, epsilon


def run_key(row: dict[str, Any]) -> Key:
    return (row["graph"], row["rounds"], row["eval_every"], row["design"], row["epsilon"])


def runs_of_graph(
    graph: ScaleGraph,
    *,
    epsilons: list[float],
    schedule: dict,
    settings: PredictorSettings,
    release_share: float,
    done: set[Key],
    save: Any,
    stage: str,
    priority: tuple[float, ...] = (1.0, 4.0),
    counted: dict[str, NodeReleases] | None = None,
) -> None:
    """The designs of one ``stage`` (:data:`STAGES`) on ``graph`` that are not in ``done``; each
    run is handed to ``save`` as soon as it is measured. The cheapest and most telling first:
    design 2 and the SGC party alone ("design 2"), then designs 1 and 3 at the ε of
    ``priority`` and non-private GLASU ("first"), then the other ε ("rest"); the map runs stage
    by stage over all graphs, so that a map cut short has the first stages everywhere.
    ``counted``: design 3's counts per graph, kept from one stage to the next."""
    counted = {} if counted is None else counted
    dataset: GraphDataset | None = None
    base = {
        "graph": graph.key,
        **{k: getattr(graph, k) for k in graph.__dataclass_fields__},
        **schedule,
    }

    def todo(design: str, epsilon: float | None) -> bool:
        nonlocal dataset
        missing = (graph.key, schedule["rounds"], schedule["eval_every"], design, epsilon)
        if missing in done:
            return False
        dataset = dataset or graph.load()
        return True

    def add(design: str, epsilon: float | None, test: float, started: float, **extra: Any) -> None:
        cpu = round(time.process_time() - started, 1)
        row = {**base, "design": design, "epsilon": epsilon, "test": test, "cpu": cpu, **extra}
        save(row)
        done.add(run_key(row))
        print(f"  {graph.key} {design} ε={epsilon}: {100 * test:.1f} ({cpu:.0f} s CPU)", flush=True)

    def design1(epsilons_now: list[float]) -> None:
        for eps in epsilons_now:
            if not todo("design 1", eps):
                continue
            reference = todo(ALONE[0], None)
            started = time.process_time()
            report = _train(graph, dataset, schedule, epsilon=eps, reference=reference)
            if reference:
                add(
                    ALONE[0],
                    None,
                    float(report.reference_test_accuracy or 0.0),
                    started,
                    **mean_roc_auc(report.reference_test_metrics),
                )
            privacy = report.privacy or {}
            add(
                "design 1",
                eps,
                report.test_accuracy,
                started,
                **mean_roc_auc(report.test_metrics),
                noise_multiplier=privacy.get("noise_multiplier"),
                releases=privacy.get("releases"),
            )

    def design3(epsilons_now: list[float]) -> None:
        for eps in epsilons_now:
            if not todo("design 3", eps):
                continue
            started = time.process_time()
            assert dataset is not None
            if graph.key not in counted:
                counted[graph.key] = node_releases(_config(graph, schedule), dataset)
            releases = counted[graph.key]
            z = releases.noise_multiplier(
                epsilon=eps, delta=DELTA, accountant=TrainConfig.accountant
            )
            report = _train(
                graph, dataset, schedule, epsilon=None, noise_multiplier=z, reference=False
            )
            add(
                "design 3",
                eps,
                report.test_accuracy,
                started,
                **mean_roc_auc(report.test_metrics),
                noise_multiplier=z,
                releases=releases.total,
                releases_of_worst_node=releases.worst,
                train_releases_per_node=releases.train_stats(),
                epsilon_if_all_passes=(report.privacy or {}).get("epsilon"),
            )

    first = [e for e in epsilons if e in priority] or epsilons[:1]
    if stage == "rest":
        design1([e for e in epsilons if e not in first])
        design3([e for e in epsilons if e not in first])
        return
    if stage == "first":
        design1(first)
        design3(first)
        if todo("non-private GLASU", None):
            started = time.process_time()
            report = _train(graph, dataset, schedule, dp=False)
            add(
                "non-private GLASU",
                None,
                report.test_accuracy,
                started,
                **mean_roc_auc(report.test_metrics),
            )
        return
    parts = None
    for eps in [None, *epsilons]:
        design = "design 2" if eps is not None else "design 2 no noise"
        if not (todo(design, eps) or (eps is None and todo(ALONE[1], None))):
            continue
        assert dataset is not None
        parts = parts or partition(dataset, clients=3, edge_fraction=0.8, seed=graph.seed)
        started = time.process_time()
        budget = None
        if eps is not None:
            budget = split_budget(
                epsilon=eps, delta=DELTA, steps=settings.steps, release_share=release_share
            )
        scores = PredictorRelease(parts, budget=budget, settings=settings, seed=graph.seed)
        mean, auc = scores.mean_scores(), scores.meanmean_roc_auc()
        if eps is None:
            add(ALONE[1], None, mean["alone"], started, **roc_auc_field(auc["alone"]))
        extra = roc_auc_field(auc["with release"])
        if budget is not None:
            extra |= {
                "sgd_noise_multiplier": budget.sgd_noise_multiplier,
                "release_noise_multiplier": budget.release_noise_multiplier,
                "epsilon_spent": budget.spent(),
            }
        add(design, eps, mean["with release"], started, **extra)


def _config(graph: ScaleGraph, schedule: dict, **settings: Any) -> TrainConfig:
    return TrainConfig(
        dataset=f"csbm-{graph.signal}",
        seed=graph.seed,
        delta=DELTA,
        encryption="none",
        **schedule,
        **settings,
    )


def _train(graph: ScaleGraph, dataset: GraphDataset | None, schedule: dict, **settings: Any) -> Any:
    """One in-process run; ``reference=False`` drops the party-alone reference (bench.frontier)."""
    from contextlib import nullcontext

    from bench.frontier import without_reference

    assert dataset is not None
    reference = settings.pop("reference", True)
    with nullcontext() if reference else without_reference():
        return train_inprocess(
            _config(graph, schedule, **settings), dataset=dataset, progress=False
        )


def summarize(runs: list[dict]) -> list[dict]:
    """Per point (classes included) and design: mean and std over seeds of the test accuracy and
    of the gain over the better party-alone reference of the same graph and seed; where the runs
    carry a ROC-AUC (a two-class task), the same for it, its gain taken over the party alone with
    the better ROC-AUC."""
    alone: dict[str, float] = {}
    alone_auc: dict[str, float] = {}
    for r in runs:
        if r["design"] in ALONE:
            alone[r["graph"]] = max(alone.get(r["graph"], 0.0), r["test"])
            if "roc_auc" in r:
                alone_auc[r["graph"]] = max(alone_auc.get(r["graph"], 0.0), r["roc_auc"])
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        point = (
            r["nodes"],
            r["labelled"],
            r["signal"],
            r["degree"],
            r.get("classes", CLASSES),
            r["design"],
            r["epsilon"],
        )
        cells.setdefault(point, []).append(r)
    out = []
    for (nodes, labelled, signal, degree, classes, design, eps), rows in sorted(
        cells.items(), key=lambda kv: tuple(str(x) for x in kv[0])
    ):
        gains = [r["test"] - alone[r["graph"]] for r in rows if r["graph"] in alone]
        cell = {
            "nodes": nodes,
            "labelled": labelled,
            "signal": signal,
            "degree": degree,
            "classes": classes,
            "design": design,
            "epsilon": eps,
            "seeds": len(rows),
            "test": _stats([r["test"] for r in rows]),
            "gain": _stats(gains),
        }
        aucs = [r for r in rows if "roc_auc" in r]
        if aucs:
            cell["roc_auc"] = _stats([r["roc_auc"] for r in aucs])
            cell["roc_auc_gain"] = _stats(
                [r["roc_auc"] - alone_auc[r["graph"]] for r in aucs if r["graph"] in alone_auc]
            )
        out.append(cell)
    return out


def _stats(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(100 * float(np.mean(values)), 2), round(100 * float(np.std(values)), 2)]


def columns(epsilons: list[float]) -> list[tuple[str, float | None]]:
    return [
        (ALONE[0], None),
        (ALONE[1], None),
        *[("design 1", e) for e in epsilons],
        ("design 2 no noise", None),
        *[("design 2", e) for e in epsilons],
        *[("design 3", e) for e in epsilons],
        ("non-private GLASU", None),
    ]


def _column_label(design: str, eps: float | None) -> str:
    return design if eps is None else f"{design} ε={eps:g}"


def table(summary: list[dict], epsilons: list[float]) -> str:
    """Markdown: one row per point; party-alone accuracies, then accuracy (gain) per design."""
    cols = columns(epsilons)
    summary = five_class(summary)
    lines = [
        "| nodes | labelled | signal | degree | "
        + " | ".join(_column_label(d, e) for d, e in cols)
        + " |",
        "|---|---|---|---|" + "---|" * len(cols),
    ]
    by_point: dict[tuple, dict[tuple, dict]] = {}
    for s in summary:
        point = (s["nodes"], s["labelled"], s["signal"], s["degree"])
        by_point.setdefault(point, {})[(s["design"], s["epsilon"])] = s
    for (nodes, labelled, signal, degree), cells in sorted(by_point.items()):
        row = [f"{nodes:,}", f"{100 * labelled:g}%", signal, f"{degree:g}"]
        for design, eps in cols:
            s = cells.get((design, eps))
            if s is None:
                row.append("-")
            elif design in ALONE:
                row.append(f"{s['test'][0]:.1f}")
            else:
                row.append(f"{s['test'][0]:.1f} ({_gain(s['gain'], s['seeds'])})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _gain(stats: list[float] | None, seeds: int) -> str:
    """A gain's mean, with its std over seeds where there are several."""
    if not stats:
        return "-"
    return f"{stats[0]:+.1f}" + (f" ± {stats[1]:.1f}" if seeds > 1 else "")


def of_classes(summary: list[dict], classes: int) -> list[dict]:
    """The points of the task with ``classes`` classes (rows from before the axis: 5)."""
    return [s for s in summary if s.get("classes", CLASSES) == classes]


def five_class(summary: list[dict]) -> list[dict]:
    """The map's own points: the 5-class task (the two-class slice has its own table)."""
    return of_classes(summary, CLASSES)


def two_class_table(summary: list[dict], epsilons: list[float]) -> str:
    """Markdown: the two-class points, one row per (point, design): accuracy and ROC-AUC (x100,
    mean over parties and seeds) with their gains over the better party alone of the same graph
    and seed (for ROC-AUC: the party alone with the better ROC-AUC); "" when there are none."""
    order = {column: i for i, column in enumerate(columns(epsilons))}
    rows = sorted(
        of_classes(summary, 2),
        key=lambda s: (
            s["nodes"], s["labelled"], s["signal"], s["degree"],
            order.get((s["design"], s["epsilon"]), len(order)),
        ),
    )  # fmt: skip
    if not rows:
        return ""
    lines = [
        "| nodes | labelled | signal | degree | design | seeds | accuracy | gain | ROC-AUC x100 "
        "| ROC-AUC gain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        auc = s.get("roc_auc")
        lines.append(
            f"| {s['nodes']:,} | {100 * s['labelled']:g}% | {s['signal']} | {s['degree']:g} "
            f"| {_column_label(s['design'], s['epsilon'])} | {s['seeds']} | {s['test'][0]:.1f} "
            f"| {'' if s['design'] in ALONE else _gain(s['gain'], s['seeds'])} "
            f"| {'-' if auc is None else f'{auc[0]:.1f}'} "
            f"| {'' if s['design'] in ALONE else _gain(s.get('roc_auc_gain'), s['seeds'])} |"
        )
    return "\n".join(lines)


#: the gain a design needs beyond its seed spread for the product to adopt it (issue 29)
ADOPTION_BAR = 2.0


def chart(summary: list[dict], epsilons: list[float], path: Path) -> None:
    """One column of panels per (nodes, labelled, signal), gain over the better party alone by
    degree (mean ± std over seeds): every design above, design 2 at each ε below, on a scale
    where its seed spread and the adoption bar show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = five_class(summary)
    panels = sorted({(s["nodes"], s["labelled"], s["signal"]) for s in summary})
    fig, axes = plt.subplots(
        2, len(panels), figsize=(3.6 * len(panels), 7.0), sharey="row", squeeze=False
    )
    shades = {e: 0.45 + 0.5 * i / max(1, len(epsilons) - 1) for i, e in enumerate(epsilons)}
    colours = {"design 1": plt.cm.Blues, "design 2": plt.cm.Greens, "design 3": plt.cm.Reds}
    for column, (nodes, labelled, signal) in enumerate(panels):
        for row, designs in enumerate((None, {"design 2"})):
            ax = axes[row][column]
            for design, eps in columns(epsilons):
                if design in ALONE or (designs is not None and design not in designs):
                    continue
                points = sorted(
                    (s["degree"], s["gain"][0], s["gain"][1])
                    for s in summary
                    if (s["nodes"], s["labelled"], s["signal"], s["design"], s["epsilon"])
                    == (nodes, labelled, signal, design, eps)
                    and s["gain"]
                )
                if not points:
                    continue
                x, y, e = zip(*points, strict=True)
                if eps is None:
                    style, colour = ":", "purple" if design.startswith("design 2") else "black"
                else:
                    style = {"design 2": "-", "design 3": "-."}.get(design, "--")
                    colour = colours[design](shades[eps])
                ax.errorbar(
                    x, y, yerr=e, fmt=style, marker="o", capsize=2, color=colour,
                    label=_column_label(design, eps),
                )  # fmt: skip
            ax.axhline(0, color="black", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("average degree")
        axes[1][column].axhline(ADOPTION_BAR, color="grey", linestyle="--", linewidth=0.8)
        axes[0][column].set_title(
            f"{nodes:,} nodes, {100 * labelled:g}% labelled, {signal}", fontsize=9
        )
    axes[0][0].set_ylabel("gain over the better party alone (points)")
    axes[1][0].set_ylabel(f"design 2 only (dashed: the {ADOPTION_BAR:g}-point bar)")
    order = [_column_label(d, e) for d, e in columns(epsilons)]
    for row in axes:  # one legend per row, of every panel's lines, in the last (emptiest) panel
        handles: dict[str, Any] = {}
        for ax in row:
            for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(label, handle)
        labels = sorted(handles, key=order.index)
        row[-1].legend([handles[k] for k in labels], labels, fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def passes_per_node(nodes: int, *, labelled: float, degree: float, seed: int = 0) -> dict:
    """Design 3's question over a default run (TrainConfig: rounds, eval_every, batch, fanout,
    L=4, occurrence cap at layer 1): in how many training passes' layer-1 releases each node's
    row is, at the worst party (``models.node_releases``)."""
    config = TrainConfig(seed=seed)
    dataset = ScaleGraph(nodes, labelled, "weak", degree, seed).load()
    releases = node_releases(config, dataset)
    count = releases.train.max(axis=0)  # per node, its worst party
    touched = count[count > 0]
    return {
        "nodes": nodes,
        "labelled": labelled,
        "degree": degree,
        "train_nodes": int(dataset.train_nodes.size),
        "train_passes": releases.train_passes,
        "eval_passes": releases.eval_passes,
        "batch_size": config.batch_size,
        "fanout": config.fanout,
        "layers": config.layers,
        "nodes_in_any_pass": int(touched.size),
        "mean_passes_per_node": float(count.mean()),
        "mean_passes_per_touched_node": float(touched.mean()) if touched.size else 0.0,
        "p99_passes": float(np.percentile(count, 99)),
        "max_passes": int(count.max()),
        "max_passes_train_node": int(count[dataset.train_nodes].max()),
        "releases_of_worst_node": releases.worst,
    }


def main(args: argparse.Namespace) -> int:
    out = args.out or OUT
    chart_path = args.chart or CHART
    epsilons = _floats(args.epsilons)
    if args.passes_per_node:
        path = out.with_name(out.stem + "_passes.json")
        rows = json.loads(path.read_text()) if path.exists() else []
        for n in _ints(args.nodes):
            for lab in _floats(args.labelled):
                for deg in _floats(args.degrees):
                    started = time.process_time()
                    row = passes_per_node(n, labelled=lab, degree=deg)
                    row["cpu_seconds"] = round(time.process_time() - started, 1)
                    print(json.dumps(row), flush=True)
                    key = (n, lab, deg)
                    rows = [r for r in rows if (r["nodes"], r["labelled"], r["degree"]) != key]
                    rows.append(row)
                    path.write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    schedule = {"rounds": args.rounds, "eval_every": args.eval_every}
    settings = PredictorSettings(output=args.output)
    store = RunStore(out, settings=_settings_note(args))
    wall = time.time()
    todo = [] if args.report_only else graphs(args)
    for graph in todo:
        if round(graph.nodes * graph.labelled) + NUM_VAL + NUM_TEST > graph.nodes:
            raise ValueError(f"{graph.key}: too few nodes for the split")
    counted: dict[str, NodeReleases] = {}
    for stage in [s for s in STAGES if s in args.stages.split(",")]:
        for graph in todo:
            runs_of_graph(
                graph,
                epsilons=epsilons,
                schedule=schedule,
                settings=settings,
                release_share=args.release_share,
                done={run_key(r) for r in store.runs()},
                save=store.add,
                stage=stage,
                priority=tuple(_floats(args.epsilons_first)),
                counted=counted,
            )
    runs = store.runs()
    summary = summarize(runs)
    store.set_summary(summary)
    shown = sorted({r["epsilon"] for r in runs if r["epsilon"] is not None} | set(epsilons))
    markdown = table(summary, shown)
    print(markdown)
    chart(summary, shown, chart_path)
    two_class = two_class_table(summary, shown)
    print(two_class)
    if args.write_doc:
        write_section("frontier-scale-table", markdown)
        if two_class:
            write_section("frontier-scale-two-class", two_class)
    regime_map.write(five_class(summary))
    print(f"wall {time.time() - wall:.0f} s; wrote {out} and {chart_path}")
    return 0


class RunStore:
    """The map's JSON: one row per run, written after every run. Processes running side by side
    on other graphs share the file: each add re-reads it under a lock and keeps every row."""

    def __init__(self, path: Path, *, settings: str) -> None:
        self.path = path
        self.settings = settings
        self._lock = path.with_name(path.name + ".lock")

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            payload = json.loads(self.path.read_text()) if self.path.exists() else {}
            yield payload
            payload["settings"] = self.settings
            payload.pop("schedule", None)  # per run since runs of several schedules share it
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
            tmp.replace(self.path)

    def runs(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        payload = json.loads(self.path.read_text())
        return [_with_schedule(r, payload.get("schedule")) for r in payload.get("runs", [])]

    def add(self, row: dict[str, Any]) -> None:
        with self._locked() as payload:
            runs = [_with_schedule(r, payload.get("schedule")) for r in payload.get("runs", [])]
            payload["runs"] = [r for r in runs if run_key(r) != run_key(row)] + [row]

    def set_summary(self, summary: list[dict]) -> None:
        with self._locked() as payload:
            payload["runs"] = [
                _with_schedule(r, payload.get("schedule")) for r in payload.get("runs", [])
            ]
            payload["summary"] = summary


def _with_schedule(row: dict[str, Any], schedule: dict | None) -> dict[str, Any]:
    """A row of a file written before rows carried their schedule gets the file's."""
    return {**(schedule or {}), **row}


def _settings_note(args: argparse.Namespace) -> str:
    return (
        "design 1: TrainConfig defaults (M=3, Q=4, width 16, clip 1, cap 1), RDP over all passes; "
        "design 3: the same, RDP over the releases of the worst node; "
        f"design 2: {PredictorSettings(output=args.output)}, release share "
        f"{args.release_share:g}, PRV; delta {DELTA:g}; encryption off; 500 val / 1000 test nodes"
    )


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--map scale (issue 29)")
    group.add_argument("--nodes", default="20000", help="graph sizes, e.g. 20000,100000")
    group.add_argument("--labelled", default="0.01,0.1", help="labelled fractions of the nodes")
    group.add_argument("--signals", default="weak,strong")
    group.add_argument(
        "--classes",
        default=str(CLASSES),
        help="CSBM classes, e.g. 2 for the two-class slice (ROC-AUC recorded next to accuracy)",
    )
    group.add_argument("--eval-every", type=int, default=10)
    group.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"which stages to run, of {','.join(STAGES)} (each over all graphs, in that order)",
    )
    group.add_argument(
        "--epsilons-first",
        default="1,4",
        help="designs 1 and 3 run at these ε on every graph before the other ε",
    )
    group.add_argument(
        "--release-share",
        type=float,
        default=0.5,
        help="design 2: share of mu^2 given to the release",
    )
    group.add_argument(
        "--output",
        choices=["onehot", "probs"],
        default="probs",
        help="design 2: what each node's release carries",
    )
    group.add_argument(
        "--passes-per-node",
        action="store_true",
        help="design 3: count the passes each node's row is released in",
    )
    group.add_argument(
        "--write-doc",
        action="store_true",
        help="write the tables into docs/results.md (frontier-scale-table, and with two-class "
        "points frontier-scale-two-class)",
    )
