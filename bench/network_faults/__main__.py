"""``python -m bench.network_faults``: every scenario, the results file and the docs section."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import bench.network_faults
from bench.network_faults.processes import ROOT, prepare
from bench.network_faults.proxy import ProxyLoop
from bench.network_faults.report import (
    add_ratios,
    environment,
    progress_line,
    section,
    table,
    write_results,
)
from bench.network_faults.scenario import SCENARIOS, plans, run_scenario
from bench.results_doc import add_data_dir_argument, write_section

RESULTS = ROOT / "bench" / "results" / "network_faults.json"
DESCRIPTION = (bench.network_faults.__doc__ or "").split("\n\n")[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.network_faults", description=DESCRIPTION)
    add_data_dir_argument(parser)
    parser.add_argument(
        "--quick", action="store_true", help="4 rounds, eval every 2, 10 s partition"
    )
    parser.add_argument("--rounds", type=int, help="communication rounds (10; --quick: 4)")
    parser.add_argument("--eval-every", type=int, help="evaluate every N rounds (5; --quick: 2)")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--delay", type=float, default=0.1, help="one-way delay per chunk, s")
    parser.add_argument("--loss", type=float, default=0.05, help="stall probability")
    parser.add_argument("--partition-seconds", type=float, help="30; --quick: 10")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--timeout", type=float, default=900.0, help="per scenario, s")
    parser.add_argument("--seed", type=int, default=0, help="seeds the proxies' stalls")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every scenario")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-doc", action="store_true", help="do not touch docs/results.md")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing: rewrite the docs section from the results file (--out)",
    )
    args = parser.parse_args(argv)
    defaults = (4, 2, 10.0) if args.quick else (10, 5, 30.0)
    for name, default in zip(("rounds", "eval_every", "partition_seconds"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_results:
        write_section("network-faults", section(json.loads(args.out.read_text())))
        return 0
    root = Path(tempfile.mkdtemp(prefix="glasu-netfaults-"))
    loop = ProxyLoop()
    results: list[dict[str, Any]] = []
    try:
        print(f"preparing keys and partitions in {root}", flush=True)
        setup = prepare(root, data_dir=Path(args.data_dir))
        for run in range(args.repeat):
            for plan in plans(args):
                plan = replace(plan, seed=plan.seed + 1000 * run)
                print(f"run {run + 1}/{args.repeat}, scenario {plan.name}: {plan.faults}, "
                      f"partition {plan.partition_seconds} s", flush=True)  # fmt: skip
                results.append({"run": run, **run_scenario(plan, setup, loop)})
                print(progress_line(results[-1]), flush=True)
    finally:
        loop.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    add_ratios(results)
    payload = {
        "description": DESCRIPTION,
        "command": " ".join(
            [".venv/bin/python", "-m", "bench.network_faults", *(argv or sys.argv[1:])]
        ),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "results": results,
    }
    write_results(payload, path=args.out)
    print(table(results))
    if not args.no_doc:
        write_section("network-faults", section(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
