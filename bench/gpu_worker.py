"""The worker's tensor path on a GPU against the CPU, on the same graph and batches.

Three parties of a CSBM graph (100 features each, degree 10, 5 classes; the graph of
``bench/scale.py``) train with the product's private arrangement (DP on) in one process
(``models/trainer.py``'s clients, answered by function calls), once per device: ``--rounds``
training passes, then one evaluation pass over every node. Encryption is off: CKKS encoding runs
on the CPU whatever the device, so the ratio isolates what ``--device`` changes (sampling, the
projection, propagation and the optimiser steps of all three parties).

    python -m bench.gpu_worker --nodes 1000000 --devices cpu cuda [--rounds 8] [--label L]
    python -m bench.gpu_worker --docs-only    # docs/results.md's section from the results file

Each run is kept in the results file under its ``--label`` (e.g. the code before and after a
change), the docs section shows them all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.results_doc import (
    add_labelled_results_arguments,
    keep_labelled,
    rewrote_docs_only,
    write_section,
)
from models.config import TrainConfig
from models.data.csbm import SIGNALS, csbm
from models.device import resolve_device
from models.inprocess import run_pass_inprocess
from models.layout import layout_federation, session_schedule
from models.trainer import prepare_security

FEATURES_PER_PARTY = 100
PARTIES = 3
OUT = Path(__file__).resolve().parent / "results" / "gpu_worker.json"
SECTION = "gpu-worker"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(dataset: Any, *, device_name: str, rounds: int, seed: int) -> dict[str, Any]:
    """Seconds per training pass (after one warm-up pass) and for one evaluation pass."""
    config = TrainConfig(
        dataset="csbm", clients=PARTIES, encryption="none", rounds=rounds + 1,
        eval_every=rounds + 1, device=device_name, seed=seed, epsilon=4.0,
    )  # fmt: skip
    device = resolve_device(config.device)
    layout = layout_federation(config, dataset)
    schedule = session_schedule(config, dataset)
    security = prepare_security(config, passes_total=schedule.passes_total, clients=PARTIES)
    clients = [security.make_client(p, layout, config, device) for p in layout.partitions]
    train_seconds: list[float] = []
    eval_seconds = None
    eval_accuracy = None
    for spec in schedule.passes:
        _synchronize(device)
        started = time.perf_counter()
        outcomes = run_pass_inprocess(
            clients, security.aggregator, pass_index=spec.index, kind=spec.kind,
            output_nodes=schedule.output_nodes(spec.index),
        )  # fmt: skip
        _synchronize(device)
        seconds = time.perf_counter() - started
        if spec.kind == "train":
            train_seconds.append(seconds)
        else:
            eval_seconds = seconds
            eval_accuracy = float(np.mean([o.test_accuracy for o in outcomes]))
        print(f"  {device}: pass {spec.index} ({spec.kind}) {seconds:.2f} s", flush=True)
    peak_gpu = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "train_pass_seconds": float(np.median(train_seconds[1:] or train_seconds)),
        "eval_pass_seconds": eval_seconds,
        "test_accuracy": eval_accuracy,
        "peak_gpu_bytes": peak_gpu,
    }


def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "## The worker's tensor path on a GPU (`bench/gpu_worker.py`)",
        "",
        "Three parties of a CSBM graph (100 features each, degree 10, 5 classes) with the "
        "private arrangement (DP on), in one process, once per device on the same graph and "
        "batches: the median training pass (after a warm-up pass) and one evaluation pass. "
        "Encryption off: CKKS runs on the CPU whatever the device, so the ratio is what "
        "`--device cuda` changes. The device machine: 16 CPU cores (torch uses them all on the "
        "CPU run) and one GPU.",
        "",
        "| code | N | device | train pass (s) | eval pass (s) | train CPU/GPU | eval CPU/GPU |"
        " peak GPU memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, result in payload.items():
        base = result["runs"][0]
        for run in result["runs"]:
            peak = run["peak_gpu_bytes"]
            lines.append(
                f"| {label} | {result['nodes']:,} | {run['device_name']} "
                f"| {run['train_pass_seconds']:.3f} | {run['eval_pass_seconds']:.2f} "
                f"| {base['train_pass_seconds'] / run['train_pass_seconds']:.2f} "
                f"| {base['eval_pass_seconds'] / run['eval_pass_seconds']:.2f} "
                f"| {'-' if peak is None else f'{peak / 2**30:.1f} GiB'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    parser.add_argument("--rounds", type=int, default=8, help="training passes per device (>= 2)")
    add_labelled_results_arguments(parser, OUT)
    args = parser.parse_args(argv)
    if rewrote_docs_only(args, SECTION, markdown):
        return 0
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (the first pass is a warm-up)")
    started = time.perf_counter()
    dataset = csbm(
        nodes=args.nodes, classes=5, degree=10.0, features=PARTIES * FEATURES_PER_PARTY,
        signal=SIGNALS["weak"], train_per_class=max(60, args.nodes // 100), seed=args.seed,
    )  # fmt: skip
    print(f"graph of {args.nodes} nodes in {time.perf_counter() - started:.1f} s", flush=True)
    results = {
        "nodes": args.nodes,
        "rounds": args.rounds,
        "runs": [
            measure(dataset, device_name=name, rounds=args.rounds, seed=args.seed)
            for name in args.devices
        ],
    }
    write_section(SECTION, markdown(keep_labelled(args.out, args.label, results)))
    base = results["runs"][0]
    print(f"{'device':<28}{'train pass s':>14}{'eval pass s':>13}{'train x':>9}{'eval x':>8}")
    for run in results["runs"]:
        train_ratio = base["train_pass_seconds"] / run["train_pass_seconds"]
        eval_ratio = (base["eval_pass_seconds"] or 0) / (run["eval_pass_seconds"] or 1)
        print(
            f"{run['device_name']:<28}{run['train_pass_seconds']:>14.3f}"
            f"{run['eval_pass_seconds'] or 0:>13.2f}{train_ratio:>9.2f}{eval_ratio:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
