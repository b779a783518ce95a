"""What masked secure aggregation costs a federated training over real HTTP, against today's
CKKS sessions, as ratios from interleaved pairs of runs (bench/overhead.py's machinery: the
side that goes first alternates, a ratio per pair, median and range): Cora, 3 clients, DP off,
the same seed; wall time, bytes on the wire, the service's CPU per pass, and the test accuracy
of both (equal: the masked sum is exact, and CKKS sums are rounded to the same share grid).
Writes bench/results/masked_aggregation.json and the "masked aggregation" section of
docs/results.md. With ``--accuracy``: the test accuracy under DP at epsilon 4, in process, of
masked shares with split noise (the default under masks) against today's CKKS sessions with
unshared noise, one seed after the other (the side that goes first alternates), written to
bench/results/masked_split_accuracy.json and the "masked split noise accuracy" section. With
``--accuracy --nodes 20000``: the same on the scale graphs of bench/model_at_scale.py (shared and
differing party graphs, one graph per seed, the scale map's private schedule: 40 rounds, an
evaluation every 10), to bench/results/masked_split_accuracy_scale.json (resumed: a rerun runs
only the missing rows) and the "masked split noise accuracy at scale" section.

    python -m bench.masked_aggregation [--pairs 3] [--rounds 40]
    python -m bench.masked_aggregation --accuracy [--seeds 3] [--rounds 300]
    python -m bench.masked_aggregation --accuracy --nodes 20000 [--seeds 3] [--rounds 40]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.overhead import Run, interleaved_pairs, ratio, run_over_http, spread
from bench.results_doc import add_data_dir_argument, publish, single_thread, write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "masked_aggregation.json"
ACCURACY_OUT = ROOT / "bench" / "results" / "masked_split_accuracy.json"
SCALE_ACCURACY_OUT = ROOT / "bench" / "results" / "masked_split_accuracy_scale.json"
#: the two sides of the accuracy comparison: masks (split noise, their default under DP) and
#: today's CKKS sessions (unshared noise)
SIDES: dict[str, dict[str, Any]] = {
    "masks_split": {"secure_aggregation": "masks"},
    "ckks_unshared": {},
}
#: the scale map's private schedule (bench/frontier_scale.py, design 1): an evaluation every 10
SCALE_EVAL_EVERY = 10
SIDE_NAMES = {
    "masks_split": "masks, split noise (each adds sigma^2/2)",
    "ckks_unshared": "CKKS, unshared noise (each adds sigma^2)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="40, or 300 with --accuracy")
    parser.add_argument("--accuracy", action="store_true", help="accuracy at epsilon 4")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--nodes", type=int, default=0, help="with --accuracy: the scale graphs of this size"
    )
    args = parser.parse_args()
    single_thread()
    from models.config import TrainConfig

    data_dir = Path(args.data_dir)
    if args.accuracy and args.nodes:
        accuracy_at_scale(nodes=args.nodes, rounds=args.rounds or 40, seeds=args.seeds)
        return
    if args.accuracy:
        accuracy_under_dp(data_dir, rounds=args.rounds or 300, seeds=args.seeds)
        return
    args.rounds = args.rounds or 40
    base = TrainConfig(data_dir=data_dir, rounds=args.rounds, seed=0, dp=False, clients=3)

    def run(label: str, **changes: Any):
        return lambda: run_over_http(label, replace(base, **changes), data_dir)

    pairs = interleaved_pairs(
        run("masks", secure_aggregation="masks"), run("ckks"), pairs=args.pairs
    )
    results = {
        "settings": {
            "rounds": args.rounds,
            "eval_every": base.eval_every,
            "clients": base.clients,
            "cpu_count": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
        },
        "masks_over_ckks": {
            "wall": ratio(pairs, lambda r: r.wall_seconds),
            "bytes": ratio(pairs, lambda r: r.bytes),
            "service_cpu_per_pass": ratio(pairs, lambda r: r.service_cpu_per_pass),
            "cpu": ratio(pairs, lambda r: r.cpu_seconds),
        },
        "runs": [[asdict(a), asdict(b)] for a, b in pairs],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    publish("masked aggregation", markdown(results, pairs))


def markdown(results: dict[str, Any], pairs: list[tuple[Run, Run]]) -> list[str]:
    ratios, settings = results["masks_over_ckks"], results["settings"]
    accuracy = sorted({(round(a.test_accuracy, 4), round(b.test_accuracy, 4)) for a, b in pairs})
    masked, ckks = pairs[0]
    return [
        "## Masked secure aggregation over HTTP (`bench/masked_aggregation.py`)",
        "",
        f"`python -m bench.masked_aggregation --pairs {len(pairs)} --rounds "
        f"{settings['rounds']}` (bench/results/masked_aggregation.json): Cora over real HTTP, "
        f"{settings['clients']} clients, DP off, {len(pairs)} interleaved pairs, on "
        f"{settings['cpu_count']} shared cores (load {settings['load_average_1min']:.1f}: "
        "indicative). Masked shares (`--secure-aggregation masks`, BFV) against today's CKKS "
        "sessions, median (range) of the per-pair ratios:",
        "",
        "| masks / CKKS | ratio | goal |",
        "|---|---|---|",
        f"| wall time | {spread(ratios['wall'])} | <= 1.2x |",
        f"| bytes on the wire | {spread(ratios['bytes'])} | <= 1.5x |",
        f"| service CPU per pass | {spread(ratios['service_cpu_per_pass'])} | |",
        f"| CPU of service and workers | {spread(ratios['cpu'])} | |",
        "",
        f"Test accuracy (masked, CKKS) per pair: {accuracy} (the masked sum is exact). One pair:"
        f" {masked.bytes / 1e6:.1f} MB against {ckks.bytes / 1e6:.1f} MB, service "
        f"{masked.service_cpu_per_pass * 1e3:.0f} ms against "
        f"{ckks.service_cpu_per_pass * 1e3:.0f} ms CPU per pass.",
    ]


def accuracy_under_dp(data_dir: Path, *, rounds: int, seeds: int) -> None:
    """Masks with split noise against CKKS with unshared noise at epsilon 4, in process."""
    from models.config import TrainConfig

    base = TrainConfig(data_dir=data_dir, rounds=rounds, clients=3, epsilon=4.0, device="cpu")
    runs = [
        side_run(label, replace(base, seed=seed))
        for seed in range(seeds)
        for label in in_turn(seed)
    ]
    results = {
        "settings": {"rounds": rounds, "seeds": seeds, "clients": 3, "epsilon": 4.0,
                     "cpu_count": os.cpu_count()},
        "runs": runs,
    }  # fmt: skip
    write_json(ACCURACY_OUT, results)
    publish("masked split noise accuracy", accuracy_markdown(results))


def accuracy_at_scale(*, nodes: int, rounds: int, seeds: int) -> None:
    """:func:`accuracy_under_dp` on bench/model_at_scale.py's graphs of ``nodes`` (both families,
    one graph per seed, loaded once for both sides), resumed from its JSON row by row."""
    from bench.model_at_scale import DIFFERING_DEGREES, DIFFERING_OVERLAP, FAMILIES, Graph
    from models.config import TrainConfig
    from models.layout import layout_federation

    payload = json.loads(SCALE_ACCURACY_OUT.read_text()) if SCALE_ACCURACY_OUT.exists() else {}
    payload["settings"] = {
        "nodes": nodes, "rounds": rounds, "eval_every": SCALE_EVAL_EVERY, "seeds": seeds,
        "clients": 3, "epsilon": 4.0, "cpu_count": os.cpu_count(),
    }  # fmt: skip
    runs: list[dict[str, Any]] = payload.setdefault("runs", [])
    for seed in range(seeds):
        for family in FAMILIES:
            graph = Graph(family, nodes, seed, DIFFERING_DEGREES, DIFFERING_OVERLAP)
            done = {run["label"] for run in runs if run["graph"] == graph.key}
            todo = [label for label in in_turn(seed) if label not in done]
            if not todo:
                continue
            joined, parts = graph.load()
            config = TrainConfig(
                dataset=joined.name, seed=seed, clients=len(parts), rounds=rounds,
                eval_every=SCALE_EVAL_EVERY, epsilon=4.0, device="cpu",
                label_holder=graph.label_holder,
            )  # fmt: skip
            layout = layout_federation(config, joined, partitions=parts)
            for label in todo:
                row = side_run(label, config, dataset=joined, layout=layout)
                runs.append({"graph": graph.key, "family": family, "nodes": nodes, **row})
                write_json(SCALE_ACCURACY_OUT, payload)
                print(f"  {graph.key} {label}: {100 * row['test_accuracy']:.1f}", flush=True)
    publish("masked split noise accuracy at scale", scale_accuracy_markdown(payload))


def in_turn(seed: int) -> list[str]:
    """The sides in the order they run for ``seed``: the side that goes first alternates."""
    return list(SIDES) if seed % 2 == 0 else list(reversed(SIDES))


def side_run(label: str, config: Any, **train: Any) -> dict[str, Any]:
    """One in-process run of ``config`` on side ``label``: its accuracies, time and noise."""
    from models.trainer import train_inprocess

    wall, cpu = time.perf_counter(), time.process_time()
    summary = train_inprocess(replace(config, **SIDES[label]), progress=False, **train)
    privacy = summary.privacy or {}
    return {
        "label": label, "seed": config.seed, "test_accuracy": summary.test_accuracy,
        "final_test_accuracy": summary.final_test_accuracy,
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "split_noise": bool(privacy.get("split_noise")),
        "noise_multiplier": privacy.get("noise_multiplier"),
    }  # fmt: skip


def side_rows(runs: list[dict[str, Any]], *, first: str = "") -> list[str]:
    """A table row per side: test accuracy at the best validation and at the end (mean ± std
    over seeds) and per seed; ``first``: a leading cell (e.g. the family)."""
    from bench.results_doc import mean_std

    def of(label: str, key: str) -> list[float]:
        return [run[key] for run in runs if run["label"] == label]

    lead = f"{first} | " if first else ""
    return [
        f"| {lead}{name} | {mean_std(of(label, 'test_accuracy'))} | "
        f"{mean_std(of(label, 'final_test_accuracy'))} | "
        f"{', '.join(f'{100 * a:.1f}' for a in of(label, 'test_accuracy'))} |"
        for label, name in SIDE_NAMES.items()
    ]


ADVERSARIES = (
    "Both hold epsilon 4 against one curious peer; split noise needs the masks (nobody reads a "
    "share) and, against all other peers colluding, holds the larger epsilon of the run "
    "summary's per-adversary lines, where unshared noise holds 4 against any coalition."
)


def accuracy_markdown(results: dict[str, Any]) -> list[str]:
    settings = results["settings"]
    return [
        "## Masked secure aggregation with split noise: accuracy at epsilon 4",
        "",
        f"`python -m bench.masked_aggregation --accuracy --seeds {settings['seeds']} --rounds "
        f"{settings['rounds']}` (bench/results/masked_split_accuracy.json): Cora in process, "
        f"{settings['clients']} clients, epsilon {settings['epsilon']:g} (delta 1e-6, RDP), "
        f"seeds 0..{settings['seeds'] - 1}, the side that goes first alternating per seed. "
        f"{ADVERSARIES} Test accuracy (%), mean ± std over seeds:",
        "",
        "| run | test (best val) | test (final) | per seed |",
        "|---|---|---|---|",
        *side_rows(results["runs"]),
    ]


def scale_accuracy_markdown(payload: dict[str, Any]) -> list[str]:
    settings = payload["settings"]
    runs = [run for run in payload["runs"] if run["nodes"] == settings["nodes"]]
    families = sorted({run["family"] for run in runs}, key=("shared", "differing").index)
    return [
        "## Masked secure aggregation with split noise: accuracy at epsilon 4 at scale",
        "",
        f"`python -m bench.masked_aggregation --accuracy --nodes {settings['nodes']} --seeds "
        f"{settings['seeds']} --rounds {settings['rounds']}` "
        "(bench/results/masked_split_accuracy_scale.json): bench/model_at_scale.py's CSBM graphs "
        f"of {settings['nodes']:,} nodes (shared: the scale map's, every party labelled; "
        "differing: each party its own graph, party 0 the only label holder), one graph per "
        f"seed, in process, {settings['clients']} clients, TrainConfig's private defaults (gcnii) "
        f"on the scale map's schedule ({settings['rounds']} rounds, an evaluation every "
        f"{settings['eval_every']}), epsilon {settings['epsilon']:g} (delta 1e-6, RDP), the side "
        f"that goes first alternating per seed. {ADVERSARIES} Test accuracy (%), mean ± std "
        "over seeds (5 classes: chance is 20 %):",
        "",
        "| family | run | test (best val) | test (final) | per seed |",
        "|---|---|---|---|---|",
        *[
            row
            for family in families
            for row in side_rows([r for r in runs if r["family"] == family], first=family)
        ],
    ]


if __name__ == "__main__":
    main()
