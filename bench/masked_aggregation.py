"""What masked secure aggregation costs a federated training over real HTTP, against today's
CKKS sessions, as ratios from interleaved pairs of runs (bench/overhead.py's machinery: the
side that goes first alternates, a ratio per pair, median and range): Cora, 3 clients, DP off,
the same seed; wall time, bytes on the wire, the service's CPU per pass, and the test accuracy
of both (equal: the masked sum is exact, and CKKS sums are rounded to the same share grid).
Writes bench/results/masked_aggregation.json and the "masked aggregation" section of
docs/results.md. With ``--accuracy``: the test accuracy under DP at epsilon 4, in process, of
masked shares with split noise (the default under masks) against today's CKKS sessions with
unshared noise, one seed after the other (the side that goes first alternates), written to
bench/results/masked_split_accuracy.json and the "masked split noise accuracy" section.

    python -m bench.masked_aggregation [--pairs 3] [--rounds 40]
    python -m bench.masked_aggregation --accuracy [--seeds 3] [--rounds 300]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.overhead import Run, interleaved_pairs, ratio, run_over_http, spread
from bench.results_doc import add_data_dir_argument, publish, single_thread

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "masked_aggregation.json"
ACCURACY_OUT = ROOT / "bench" / "results" / "masked_split_accuracy.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=None, help="40, or 300 with --accuracy")
    parser.add_argument("--accuracy", action="store_true", help="accuracy at epsilon 4")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    single_thread()
    from models.config import TrainConfig

    data_dir = Path(args.data_dir)
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
    import time

    from models.config import TrainConfig
    from models.trainer import train_inprocess

    base = TrainConfig(data_dir=data_dir, rounds=rounds, clients=3, epsilon=4.0, device="cpu")
    sides = {"masks_split": {"secure_aggregation": "masks"}, "ckks_unshared": {}}
    runs: list[dict[str, Any]] = []
    for seed in range(seeds):
        order = list(sides) if seed % 2 == 0 else list(reversed(sides))
        for label in order:
            config = replace(base, seed=seed, **sides[label])
            start = time.perf_counter()
            summary = train_inprocess(config, progress=False)
            privacy = summary.privacy or {}
            runs.append({
                "label": label, "seed": seed, "test_accuracy": summary.test_accuracy,
                "final_test_accuracy": summary.final_test_accuracy,
                "wall_seconds": time.perf_counter() - start,
                "split_noise": bool(privacy.get("split_noise")),
                "noise_multiplier": privacy.get("noise_multiplier"),
            })  # fmt: skip
    results = {
        "settings": {"rounds": rounds, "seeds": seeds, "clients": 3, "epsilon": 4.0,
                     "cpu_count": os.cpu_count()},
        "runs": runs,
    }  # fmt: skip
    ACCURACY_OUT.parent.mkdir(parents=True, exist_ok=True)
    ACCURACY_OUT.write_text(json.dumps(results, indent=2) + "\n")
    publish("masked split noise accuracy", accuracy_markdown(results))


def accuracy_markdown(results: dict[str, Any]) -> list[str]:
    from bench.results_doc import mean_std

    settings, runs = results["settings"], results["runs"]

    def of(label: str, key: str) -> list[float]:
        return [run[key] for run in runs if run["label"] == label]

    rows = [
        f"| {name} | {mean_std(of(label, 'test_accuracy'))} | "
        f"{mean_std(of(label, 'final_test_accuracy'))} | "
        f"{', '.join(f'{100 * a:.1f}' for a in of(label, 'test_accuracy'))} |"
        for label, name in (
            ("masks_split", "masks, split noise (each adds sigma^2/2)"),
            ("ckks_unshared", "CKKS, unshared noise (each adds sigma^2)"),
        )
    ]
    return [
        "## Masked secure aggregation with split noise: accuracy at epsilon 4",
        "",
        f"`python -m bench.masked_aggregation --accuracy --seeds {settings['seeds']} --rounds "
        f"{settings['rounds']}` (bench/results/masked_split_accuracy.json): Cora in process, "
        f"{settings['clients']} clients, epsilon {settings['epsilon']:g} (delta 1e-6, RDP), "
        f"seeds 0..{settings['seeds'] - 1}, the side that goes first alternating per seed. Both "
        "hold epsilon 4 against one curious peer; split noise needs the masks (nobody reads a "
        "share) and, against all other peers colluding, holds the larger epsilon of the run "
        "summary's per-adversary lines, where unshared noise holds 4 against any coalition. "
        "Test accuracy (%), mean ± std over seeds:",
        "",
        "| run | test (best val) | test (final) | per seed |",
        "|---|---|---|---|",
        *rows,
    ]


if __name__ == "__main__":
    main()
