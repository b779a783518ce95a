"""Where private federation pays: a map over graph degree, feature signal and epsilon.

The product's private arrangement (models.config.TrainConfig defaults: M=3, GLASU Q=4, the
layer-1 release of width 16, clip 1, occurrence cap 1, delta 1e-6, RDP, unshared noise) trained
in process (models/trainer.py) on contextual stochastic block models (models/data/csbm.py) of
several average degrees and two feature signals, and on Cora, CiteSeer and PubMed. Every point
gives the private GLASU test accuracy, the party-alone reference that the private run itself
reports (the same network on the same batches without the others' release) and non-private GLASU.

The reference does not depend on the noise (same batches, initialisation and dropout stream), so
only the first private run of each graph reports it; the other private runs switch it off
(``without_reference``). Encryption is off: CKKS runs reproduce plaintext runs bit for bit
(tests/models/test_trainer.py), so it changes time, not accuracy.

    python -m bench.frontier [--quick] [--seeds 3] [--degrees 4,8,16,32,64] [--epsilons 1,2,4,8,16]

``--map scale`` draws issue 29's map instead (bench/frontier_scale.py: nodes, labelled fraction,
degree, signal, epsilon; designs 1, 2 and 3, both party-alone references and non-private GLASU
in one run; it resumes run by run from its JSON, and processes on other graphs may share it):

    python -m bench.frontier --map scale --nodes 20000 --labelled 0.01,0.1 --degrees 4,16,64 \
        --epsilons 1,2,4,8 --seeds 1 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from bench import frontier_scale
from models.arrangement import GlasuArrangement
from models.config import TrainConfig
from models.data.csbm import SIGNALS, csbm
from models.data.planetoid import GraphDataset, load_dataset
from models.private import PrivateArrangement
from models.trainer import train_inprocess
from secure.accounting import calibrate_noise_multiplier

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "bench" / "results" / "frontier.json"
CHART = ROOT / "docs" / "frontier.svg"
DELTA = 1e-6
NO_NOISE_Z = 1e-3  # the plan refuses z = 0; std 0.003 against a per-coordinate signal of ~0.25
REAL = ("cora", "citeseer", "pubmed")


@dataclass(frozen=True)
class Level:
    """One privacy setting of the private arrangement, or non-private GLASU."""

    label: str
    settings: dict[str, Any] = field(default_factory=dict)
    private: bool = True


@dataclass(frozen=True)
class Graph:
    key: str
    family: str  # "csbm-weak", "csbm-strong" or a Planetoid name
    degree: float | None
    seed: int

    def load(self, data_dir: Path) -> GraphDataset:
        if self.family in REAL:
            return load_dataset(self.family, data_dir=data_dir, split="paper", seed=self.seed)
        signal = SIGNALS[self.family.removeprefix("csbm-")]
        assert self.degree is not None
        return csbm(degree=self.degree, signal=signal, seed=self.seed)


@contextmanager
def without_reference() -> Iterator[None]:
    """Private clients without the party-alone reference's local steps (the private
    arrangement's ``after_step`` is GLASU's: none)."""
    with mock.patch.object(PrivateArrangement, "after_step", GlasuArrangement.after_step):
        yield


def levels(*, epsilons: list[float], one_shot: list[float]) -> list[Level]:
    out = [Level("no noise", {"epsilon": None, "noise_multiplier": NO_NOISE_Z})]
    out += [Level(f"ε={e:g}", {"epsilon": e}) for e in epsilons]
    for e in one_shot:
        z = calibrate_noise_multiplier(epsilon=e, delta=DELTA, releases=1)
        out.append(
            Level(f"one-shot ε={e:g} noise (z={z:.3g})", {"epsilon": None, "noise_multiplier": z})
        )
    out.append(Level("non-private GLASU", {"dp": False}, private=False))
    return out


def graphs(*, seeds: int, degrees: list[float], real_seeds: dict[str, int]) -> Iterator[Graph]:
    """Seed-major, so that a run cut short still has whole maps for its first seeds."""
    for seed in range(seeds):
        for signal in SIGNALS:
            for d in degrees:
                yield Graph(f"csbm-{signal}-d{d:g}-s{seed}", f"csbm-{signal}", d, seed)
        for name in REAL:
            if seed < real_seeds[name]:
                yield Graph(f"{name}-s{seed}", name, None, seed)


def run(
    graph: Graph, dataset: GraphDataset | None, level: Level, *, schedule: dict, reference: bool
) -> dict[str, Any]:
    if dataset is None:
        raise ValueError(f"{graph.key}: no dataset loaded (--report-only runs nothing)")
    config = TrainConfig(
        dataset=graph.family, seed=graph.seed, delta=DELTA, encryption="none",
        **schedule, **level.settings,
    )  # fmt: skip
    started = time.process_time()
    with nullcontext() if reference or not level.private else without_reference():
        report = train_inprocess(config, dataset=dataset, progress=False)
    privacy = report.privacy or {}
    return {
        "graph": graph.key,
        "family": graph.family,
        "degree": graph.degree,
        "seed": graph.seed,
        "level": level.label,
        "test": report.test_accuracy,
        "val": report.val_accuracy,
        "reference_test": report.reference_test_accuracy,
        "reference_val": report.reference_val_accuracy,
        "epsilon": privacy.get("epsilon"),
        "noise_multiplier": privacy.get("noise_multiplier"),
        "releases": privacy.get("releases"),
        "cpu_seconds": round(time.process_time() - started, 1),
    }


def summarize(runs: list[dict]) -> list[dict]:
    """Per (family, degree, level): mean and std over seeds of the test accuracy and of the gain
    over the party-alone reference of the same graph and seed."""
    reference = {r["graph"]: r["reference_test"] for r in runs if r["reference_test"] is not None}
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        cells.setdefault((r["family"], r["degree"], r["level"]), []).append(r)
    out = []
    for (family, degree, level), rows in cells.items():
        gains = [r["test"] - reference[r["graph"]] for r in rows if r["graph"] in reference]
        refs = [reference[r["graph"]] for r in rows if r["graph"] in reference]
        out.append(
            {
                "family": family,
                "degree": degree,
                "level": level,
                "seeds": len(rows),
                "test": _stats([r["test"] for r in rows]),
                "reference_test": _stats(refs),
                "gain": _stats(gains),
                "noise_multiplier": rows[0]["noise_multiplier"],
            }
        )
    return out


def _stats(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(100 * float(np.mean(values)), 2), round(100 * float(np.std(values)), 2)]


def table(summary: list[dict], level_labels: list[str]) -> str:
    """Markdown: one row per graph, gain over the party alone (points) per level."""
    head = "| graph | party alone | " + " | ".join(level_labels) + " |"
    lines = [head, "|---|---|" + "---|" * len(level_labels)]
    rows: dict[tuple, dict[str, dict]] = {}
    for s in summary:
        rows.setdefault((s["family"], s["degree"] or 0.0), {})[s["level"]] = s
    for (family, degree), by_level in sorted(rows.items()):
        name = f"{family} d={degree:g}" if family.startswith("csbm") else family
        first = next(iter(by_level.values()))
        ref = first["reference_test"]
        cells = [f"{ref[0]:.1f}" if ref else "-"]
        for label in level_labels:
            s = by_level.get(label)
            if s is None or s["gain"] is None:
                cells.append("-")
                continue
            spread = f" ± {s['gain'][1]:.1f}" if s["seeds"] > 1 else ""
            cells.append(f"{s['test'][0]:.1f} ({s['gain'][0]:+.1f}{spread})")
        lines.append(f"| {name} (n={first['seeds']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(summary: list[dict], level_labels: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = [f"csbm-{s}" for s in SIGNALS]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, family in zip(axes[:2], families, strict=True):
        for label in level_labels:
            points = sorted(
                (s["degree"], s["gain"][0], s["gain"][1])
                for s in summary
                if s["family"] == family and s["level"] == label and s["gain"]
            )
            if points:
                x, y, e = zip(*points, strict=True)
                style = "--" if label == "non-private GLASU" else "-"
                ax.errorbar(x, y, yerr=e, fmt=style, marker="o", capsize=2, label=label)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([4, 8, 16, 32, 64], ["4", "8", "16", "32", "64"])
        ax.set_xlabel("average degree of the CSBM graph")
        ax.set_title(f"CSBM, {family.removeprefix('csbm-')} signal")
    axes[0].set_ylabel("gain over the party alone (points)")
    ax = axes[2]
    reals = [f for f in REAL if any(s["family"] == f for s in summary)]
    width = 0.8 / max(1, len(level_labels))
    for i, label in enumerate(level_labels):
        values = [
            next((s["gain"] for s in summary if s["family"] == f and s["level"] == label), None)
            for f in reals
        ]
        xs = [j + i * width for j, v in enumerate(values) if v]
        ax.bar(xs, [v[0] for v in values if v], width, yerr=[v[1] for v in values if v])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(reals))], reals)
    ax.set_title("real graphs (bars in legend order)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, 2 degrees, 10 rounds")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--degrees", default="4,8,16,32,64")
    parser.add_argument("--epsilons", default="1,2,4,8,16")
    parser.add_argument("--one-shot", default="4", help="one-shot epsilons to emulate by noise")
    parser.add_argument("--rounds", type=int, default=50, help="rounds (Q=4 local steps each)")
    parser.add_argument("--pubmed-seeds", type=int, default=1)
    parser.add_argument("--families", default="", help="only these, e.g. csbm-strong,pubmed")
    parser.add_argument("--real-seeds", type=int, default=None, help="default: --seeds")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "datasets/planetoid"))
    parser.add_argument("--out", type=Path, default=None, help=f"default {OUT} (scale: its own)")
    parser.add_argument("--chart", type=Path, default=None, help=f"default {CHART}")
    parser.add_argument(
        "--map", choices=["degree", "scale"], default="degree",
        help="degree: this map; scale: issue 29's (bench/frontier_scale.py)",
    )  # fmt: skip
    frontier_scale.add_arguments(parser)
    parser.add_argument(
        "--report-only", action="store_true", help="no new runs: table and chart from --out"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.map == "scale":
        return frontier_scale.main(args)
    args.out = args.out or OUT
    args.chart = args.chart or CHART
    degrees = [float(d) for d in args.degrees.split(",")]
    seeds, rounds = args.seeds, args.rounds
    if args.quick:
        seeds, rounds, degrees = 1, 10, degrees[:1] + degrees[-1:]
    real_seeds = args.seeds if args.real_seeds is None else args.real_seeds
    per_dataset = {"cora": real_seeds, "citeseer": real_seeds, "pubmed": args.pubmed_seeds}
    per_dataset = {k: min(v, seeds) for k, v in per_dataset.items()}
    if args.quick:
        per_dataset = {"cora": 1, "citeseer": 0, "pubmed": 0}
    schedule = {"rounds": rounds, "eval_every": max(1, rounds // 10)}
    all_levels = levels(
        epsilons=[float(e) for e in args.epsilons.split(",") if e],
        one_shot=[float(e) for e in args.one_shot.split(",") if e],
    )
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    done = {
        (r["graph"], r["level"]): r
        for r in previous.get("runs", [])
        if previous.get("schedule") == schedule
    }
    todo = list(graphs(seeds=seeds, degrees=degrees, real_seeds=per_dataset))
    if args.families:
        todo = [g for g in todo if g.family in args.families.split(",")]
    total = len(todo) * len(all_levels)
    runs: list[dict] = []
    spent = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "planetoid"
        shutil.copytree(args.data_dir, data_dir, copy_function=shutil.copyfile)
        for folder in [data_dir, *data_dir.rglob("*")]:
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        for graph in todo:
            dataset = None if args.report_only else graph.load(data_dir)
            for i, level in enumerate(all_levels):
                cached = done.get((graph.key, level.label))
                if cached is None and args.report_only:
                    continue
                result = cached or run(graph, dataset, level, schedule=schedule, reference=(i == 0))
                runs.append(result)
                if cached is None:
                    spent += result["cpu_seconds"]
                    fresh = len(runs) - sum(1 for r in runs if (r["graph"], r["level"]) in done)
                    eta = spent / max(1, fresh) * (total - len(runs))
                    print(
                        f"[{len(runs)}/{total}] {graph.key} {level.label}: test "
                        f"{result['test']:.3f} reference {result['reference_test']} "
                        f"({result['cpu_seconds']:.0f} s CPU, ~{eta / 60:.0f} min left)",
                        flush=True,
                    )
                _write(args.out, schedule=schedule, runs=_kept(runs, done), levels=all_levels)
    summary = summarize(runs)
    labels = [lv.label for lv in all_levels]
    _write(args.out, schedule=schedule, runs=_kept(runs, done), levels=all_levels, summary=summary)
    print(table(summary, labels))
    chart(summary, labels, args.chart)
    print(f"CPU of the fresh runs: {spent:.0f} s; wrote {args.out} and {args.chart}")
    return 0


def _kept(runs: list[dict], done: dict[tuple[str, str], dict]) -> list[dict]:
    """This invocation's runs and every earlier one it did not repeat (a run restricted with
    --families or --seeds must not drop the rest of the map from the file)."""
    current = {(r["graph"], r["level"]) for r in runs}
    return runs + [r for key, r in done.items() if key not in current]


def _write(path: Path, *, schedule: dict, runs: list[dict], levels: list[Level], **extra) -> None:
    payload = {
        "schedule": schedule,
        "settings": "TrainConfig defaults (M=3, GLASU Q=4, release width 16, clip 1, cap 1), "
        f"delta {DELTA:g}, RDP, unshared noise, encryption off, paper-shaped split",
        "levels": {lv.label: lv.settings for lv in levels},
        "runs": runs,
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
