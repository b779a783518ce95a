"""What masked secure aggregation costs a federated training over real HTTP, against today's
CKKS sessions, as ratios from interleaved pairs of runs (bench/overhead.py's machinery: the
side that goes first alternates, a ratio per pair, median and range): Cora, 3 clients, DP off,
the same seed; wall time, bytes on the wire, the service's CPU per pass, and the test accuracy
of both (equal: the masked sum is exact, and CKKS sums are rounded to the same share grid).
Writes bench/results/masked_aggregation.json and the "masked aggregation" section of
docs/results.md.

    python -m bench.masked_aggregation [--pairs 3] [--rounds 40]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    single_thread()
    from models.config import TrainConfig

    data_dir = Path(args.data_dir)
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


if __name__ == "__main__":
    main()
