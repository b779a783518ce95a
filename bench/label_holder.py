"""One label holder (GLASU Appendix B.2) against the baselines a bank compares with: the label
holder training alone on its own features and edges, and GLASU with every party holding the
labels; without and with differential privacy (the product's private arrangement at its default
epsilon). In process, plaintext sums (CKKS reproduces them on the share grid), the benchmark's
own split, M = 3, client 0 holds the labels.

Under DP the passive parties only release (the private arrangement sends nothing
label-derived), and the holder's party-alone reference is trained in the same run on the same
batches: "alone" there is that reference.

    python -m bench.label_holder --datasets cora citeseer pubmed --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.results_doc import (
    add_results_arguments,
    federation_settings,
    grouped,
    load_copied,
    rewrote_docs_only,
    rounded_mean_std,
    write_results,
    write_section,
)
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.trainer import train_inprocess

RESULTS = Path(__file__).resolve().parent / "results" / "label_holder.json"
HOLDER = 0
METHODS = ("label holder", "holder alone", "all labels")


def runs(base: TrainConfig, *, private: bool) -> dict[str, TrainConfig]:
    if private:
        return {
            "label holder": dataclasses.replace(base, dp=True, label_holder=HOLDER),
            "all labels": dataclasses.replace(base, dp=True),
        }
    return {
        "label holder": dataclasses.replace(base, label_holder=HOLDER),
        "holder alone": dataclasses.replace(base, mode="standalone", label_holder=HOLDER),
        "all labels": base,
    }


def one_seed(dataset: GraphDataset, base: TrainConfig, *, private: bool) -> dict[str, dict]:
    results = {}
    for method, config in runs(base, private=private).items():
        started = time.process_time()
        report = train_inprocess(config, dataset=dataset, progress=False)
        results[method] = {
            "test_accuracy": report.test_accuracy,
            "reference_test_accuracy": report.reference_test_accuracy,
            "epsilon": report.privacy.get("epsilon") if report.privacy else None,
            "cpu_s": round(time.process_time() - started, 1),
        }
        if private and method == "label holder":  # the holder's own reference, same batches
            results["holder alone"] = {
                "test_accuracy": report.reference_test_accuracy,
                "note": "the label holder's party-alone reference of the private run",
            }
        print(
            f"  {dataset.name} seed {base.seed} {'DP' if private else 'no DP'} {method:>12}: "
            f"test {report.test_accuracy:.3f} ({results[method]['cpu_s']} s CPU)",
            flush=True,
        )
    return results


def summary(records: list[dict]) -> list[dict]:
    rows = []
    datasets = dict.fromkeys(r["dataset"] for r in records)
    for where, group in grouped(records, {"dataset": datasets, "private": (False, True)}):
        row: dict = {"dataset": where["dataset"], "dp": where["private"], "seeds": len(group)}
        for method in METHODS:
            mean, std = rounded_mean_std([r["results"][method]["test_accuracy"] for r in group])
            row[method] = {"mean": mean, "std": std}
        rows.append(row)
    return rows


def settings(base: TrainConfig) -> dict:
    return {
        **federation_settings(base),
        "label_holder": HOLDER,
        "epsilon_target": base.epsilon,
        "split": "paper",
    }


def markdown(out: dict) -> str:
    """The docs/results.md section of ``out``."""
    config = out["config"]
    lines = [
        "## One label holder (`bench/label_holder.py`)",
        "",
        f"GLASU Appendix B.2: only client {config['label_holder']} of M = {config['clients']} "
        "holds the labels and the split; the others learn from the gradient it broadcasts (no "
        "DP), or only release (DP, the private arrangement at epsilon "
        f"{config['epsilon_target']}). *Holder alone*: the holder on its own features and "
        "edges (no DP: `--mode standalone --label-holder 0`; DP: the private run's party-alone "
        "reference, same batches). *All labels*: GLASU with every party holding the labels, "
        "accuracy averaged over the parties. K = "
        f"{config['agg_layers']}, Q = {config['stale']}, {config['rounds']} rounds, hidden "
        f"{config['hidden']}, the paper split, plaintext sums. Test accuracy (%), mean ± std "
        "over seeds.",
        "",
        "| dataset | DP | seeds | label holder | holder alone | all labels | gain over alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in out["summary"]:
        cells = [f"{100 * row[m]['mean']:.1f} ± {100 * row[m]['std']:.1f}" for m in METHODS]
        gain = 100 * (row["label holder"]["mean"] - row["holder alone"]["mean"])
        lines.append(
            f"| {row['dataset']} | {'yes' if row['dp'] else 'no'} | {row['seeds']} | "
            + " | ".join(cells)
            + f" | {gain:+.1f} |"
        )
    lines += [
        "",
        "Reproduce: `python -m bench.label_holder --datasets cora citeseer pubmed --seeds 0 1 2` "
        "(results in `bench/results/label_holder.json`; `--docs-only` rewrites this section).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["cora", "citeseer", "pubmed"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--no-dp-only", action="store_true", help="skip the private runs")
    add_results_arguments(parser, RESULTS)
    args = parser.parse_args()
    if rewrote_docs_only(args, "label-holder", markdown):
        return
    torch.set_num_threads(1)
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets:
            dataset = load_copied(name, scratch=Path(tmp), split="paper", seed=0)
            for private in (False,) if args.no_dp_only else (False, True):
                for seed in args.seeds:
                    base = TrainConfig(
                        dataset=name,
                        encryption="none",
                        dp=False,
                        rounds=args.rounds,
                        eval_every=25,
                        seed=seed,
                    )
                    records.append(
                        {
                            "dataset": name,
                            "private": private,
                            "seed": seed,
                            "results": one_seed(dataset, base, private=private),
                        }
                    )
                    write_results(
                        args.out, config=settings(base), summary=summary(records), runs=records
                    )
    for row in summary(records):
        cells = ", ".join(f"{m} {row[m]['mean']:.3f}+-{row[m]['std']:.3f}" for m in METHODS)
        print(f"{row['dataset']} {'DP' if row['dp'] else 'no DP'}: {cells}")
    write_section("label-holder", markdown(json.loads(args.out.read_text())))
    print(f"wrote {args.out} and docs/results.md")


if __name__ == "__main__":
    main()
