"""What the party-alone reference costs a private run: CPU time of the default private
arrangement on Cora in process (encryption and DP on) with the reference, against the same run
with the reference switched off (by patching, for this measurement only), in interleaved pairs.

    python -m bench.reference_cost [--rounds 100] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.frontier import without_reference
from bench.results_doc import load_copied
from models.config import TrainConfig
from models.trainer import train_inprocess

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument(
        "--data-dir", default=str(ROOT.parent / "shared" / "datasets" / "planetoid")
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset = load_copied("cora", scratch=Path(tmp), source=Path(args.data_dir), seed=0)
    config = TrainConfig(rounds=args.rounds)
    ratios, rows = [], []
    for _ in range(args.pairs):
        timed = {}
        for label in ("with", "without"):
            started = time.process_time()
            if label == "with":
                report = train_inprocess(config, dataset=dataset, progress=False)
            else:
                with without_reference():
                    report = train_inprocess(config, dataset=dataset, progress=False)
            timed[label] = (time.process_time() - started, report.test_accuracy)
        ratios.append(timed["with"][0] / timed["without"][0])
        rows.append({k: {"cpu_seconds": round(v[0], 2), "test": v[1]} for k, v in timed.items()})
    result = {
        "rounds": args.rounds,
        "cpu_ratio_median": round(statistics.median(ratios), 3),
        "cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "pairs": rows,
    }
    print(json.dumps(result, indent=2))
    (ROOT / "bench" / "results" / "reference_cost.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
