"""What CKKS encryption costs a Cora training: accuracy against plaintext with the same seed, and
wall time as a ratio, with DP off so that encryption is the only difference.

Accuracy: 3 seeds in process (300 rounds, GLASU K=2 Q=4, the default evaluation schedule). Wall
time: the same two runs over real HTTP (service and 3 worker processes on loopback), where
encryption also multiplies the bytes on the wire; bench/overhead.py measures that in interleaved
pairs, in CPU time. The table goes to docs/results.md.

    python -m bench.encryption_overhead [--rounds 300] [--http-rounds 100]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.results_doc import add_data_dir_argument, publish, single_thread

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--http-rounds", type=int, default=100)
    args = parser.parse_args()
    single_thread()
    from clients.local.federation import train_over_http
    from models.config import TrainConfig
    from models.data.planetoid import load_dataset
    from models.layout import layout_federation
    from models.trainer import train_inprocess
    from secure.ckks_context import SUM_ERROR_BOUND

    rows = []
    for seed in SEEDS:
        dataset = load_dataset("cora", data_dir=Path(args.data_dir), seed=seed)
        row = {"seed": seed}
        for encryption in ("none", "ckks"):
            config = TrainConfig(
                data_dir=Path(args.data_dir),
                rounds=args.rounds,
                seed=seed,
                encryption=encryption,
                dp=False,
            )
            report = train_inprocess(config, dataset=dataset, progress=False)
            key = "ckks" if encryption == "ckks" else "plain"
            row[f"{key}_test"] = report.test_accuracy
            row[f"{key}_final"] = report.final_test_accuracy
            row[f"{key}_seconds"] = report.wall_seconds
        rows.append(row)
        print(json.dumps(row), flush=True)
    dataset = load_dataset("cora", data_dir=Path(args.data_dir), seed=0)
    http = {}
    for encryption in ("none", "ckks"):
        config = TrainConfig(
            data_dir=Path(args.data_dir),
            rounds=args.http_rounds,
            seed=0,
            encryption=encryption,
            dp=False,
        )
        report = train_over_http(
            config, layout_federation(config, dataset), dataset, progress=False
        )
        http["ckks" if encryption == "ckks" else "plain"] = {
            "seconds": report.wall_seconds,
            "bytes": report.bytes_up + report.bytes_down,
            "test": report.test_accuracy,
        }
        print(json.dumps(http), flush=True)
    out = ROOT / "bench" / "results" / "encryption_overhead.json"
    out.write_text(json.dumps({"inprocess": rows, "http": http}, indent=2))

    def pct(x: float) -> str:
        return f"{100 * x:.1f}"

    lines = [
        "## Encryption: accuracy and overhead (`bench/encryption_overhead.py`)",
        "",
        f"Cora, paper split, GLASU (K=2, Q=4), 4-layer GCNII, M=3, DP off, same seed for "
        f"both columns, evaluation every {TrainConfig().eval_every} rounds. In process, "
        f"{args.rounds} rounds:",
        "",
        "| seed | plaintext test acc. | CKKS test acc. | difference (points) | plaintext "
        "final | CKKS final | wall-time ratio CKKS / plaintext |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {pct(r['plain_test'])} | {pct(r['ckks_test'])} | "
            f"{100 * (r['ckks_test'] - r['plain_test']):+.1f} | {pct(r['plain_final'])} | "
            f"{pct(r['ckks_final'])} | {r['ckks_seconds'] / r['plain_seconds']:.2f}x |"
        )
    p, c = http["plain"], http["ckks"]
    lines += [
        "",
        f"Over real HTTP on loopback ({args.http_rounds} rounds, seed 0, every pass's "
        "bodies counted, evaluation included): wall time "
        f"{c['seconds'] / p['seconds']:.2f}x, bytes {c['bytes'] / p['bytes']:.2f}x "
        f"({p['bytes'] / 2**20:.0f} MiB plaintext, {c['bytes'] / 2**20:.0f} MiB CKKS); "
        f"test accuracy {pct(p['test'])} vs {pct(c['test'])}.",
        "",
        "Shares travel on a fixed-point grid of step 2^-12 and decoded sums are rounded "
        "back to it (docs/encryption.md), which removes the CKKS decoding error (below "
        f"{SUM_ERROR_BOUND:.1e} for a sum of up to 16 shares except with probability 2^-40 per "
        "value): with the same seed the encrypted run is the plaintext run, so any "
        "difference above would be a bug, not noise. Only time and bytes differ.",
    ]
    publish("encryption", lines)


if __name__ == "__main__":
    main()
