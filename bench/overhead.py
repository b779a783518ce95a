"""What encryption costs a federated training over real HTTP (the service and the workers as
processes on loopback, `glasu train --transport http`), as ratios from interleaved pairs of runs:

1. CKKS against plaintext: Cora, DP off, the same seed; CPU time of the service and the workers,
   wall time and bytes, and the test accuracy of both (equal: encrypted runs reproduce plaintext
   runs);
2. the service's CPU per pass with M = 8 against M = 2 clients (CKKS, Cora): linear in the
   shares it adds would be 4;
3. CPU per round, PubMed against Cora (CKKS), with the bytes.

Each pair runs both sides back to back, the side that goes first alternating from pair to pair,
so both see the same machine; a ratio is computed per pair and reported as the median and the
range over pairs. CPU time is that of the child processes (``RUSAGE_CHILDREN``: the service and
the workers); the service's own is read from ``/proc/<pid>/stat`` once it is healthy and again
just before it is stopped, so its start-up is not counted. Writes bench/results/overhead.json
and the "overhead" section of docs/results.md.

    python -m bench.overhead [--pairs 3] [--rounds 60] [--clients-pairs 2] [--clients-rounds 10]
        [--dataset-pairs 2] [--dataset-rounds 10] [--render]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.results_doc import add_data_dir_argument, single_thread, write_section
from bench.startup import cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "overhead.json"


@dataclass(frozen=True)
class Run:
    """One training over HTTP."""

    label: str
    wall_seconds: float
    cpu_seconds: float  # service and workers
    service_cpu_seconds: float  # after start-up
    passes: int
    rounds: int
    bytes: int
    test_accuracy: float

    @property
    def service_cpu_per_pass(self) -> float:
        return self.service_cpu_seconds / self.passes

    @property
    def cpu_per_round(self) -> float:
        return self.cpu_seconds / self.rounds


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def service_cpu_probe() -> Iterator[list[float]]:
    """The service's CPU seconds when it became healthy and just before it was stopped, read by
    wrapping the two calls of clients.local.federation that see its process then."""
    from clients.local import federation
    from clients.local.processes import ServedService

    readings: list[float] = []
    wait_healthy, stop_all = ServedService.wait_healthy, federation.stop_all

    def healthy_then_read(service: ServedService, *args: Any, **kwargs: Any) -> None:
        wait_healthy(service, *args, **kwargs)
        readings.append(cpu_seconds(service.process.pid))

    def read_then_stop(processes: Sequence[Any], *args: Any, **kwargs: Any) -> None:
        if processes and processes[0].process.poll() is None:
            readings.append(cpu_seconds(processes[0].process.pid))
        stop_all(processes, *args, **kwargs)

    ServedService.wait_healthy, federation.stop_all = healthy_then_read, read_then_stop
    try:
        yield readings
    finally:
        ServedService.wait_healthy, federation.stop_all = wait_healthy, stop_all


def run_over_http(label: str, config: Any, data_dir: Path) -> Run:
    from clients.local.federation import train_over_http
    from models.data.planetoid import load_dataset
    from models.layout import layout_federation
    from secure.schedule import pass_schedule

    dataset = load_dataset(config.dataset, data_dir=data_dir, seed=config.seed)
    layout = layout_federation(config, dataset)
    cpu_before, wall_before = children_cpu_seconds(), time.perf_counter()
    with service_cpu_probe() as service_cpu:
        report = train_over_http(config, layout, dataset, progress=False)
    run = Run(
        label=label,
        wall_seconds=time.perf_counter() - wall_before,
        cpu_seconds=children_cpu_seconds() - cpu_before,
        service_cpu_seconds=service_cpu[-1] - service_cpu[0],
        passes=len(pass_schedule(rounds=config.rounds, eval_every=config.eval_every)),
        rounds=config.rounds,
        bytes=report.bytes_up + report.bytes_down,
        test_accuracy=report.test_accuracy,
    )
    print(json.dumps(asdict(run)), flush=True)
    return run


def interleaved_pairs(
    first: Callable[[], Run], second: Callable[[], Run], *, pairs: int
) -> list[tuple[Run, Run]]:
    """``pairs`` pairs of runs, the side that goes first alternating."""
    result = []
    for index in range(pairs):
        if index % 2 == 0:
            a = first()
            b = second()
        else:
            b = second()
            a = first()
        result.append((a, b))
    return result


def ratio(pairs: Sequence[tuple[Run, Run]], value: Callable[[Run], float]) -> dict[str, float]:
    """Per pair ``value(first) / value(second)``: median, min, max."""
    values = [value(a) / value(b) for a, b in pairs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread(stats: dict[str, float]) -> str:
    return f"{stats['median']:.2f}x ({stats['min']:.2f}-{stats['max']:.2f})"


Pairs = list[tuple[Run, Run]]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--pairs", type=int, default=3, help="CKKS/plaintext pairs on Cora")
    parser.add_argument("--rounds", type=int, default=60, help="rounds of those runs")
    parser.add_argument("--clients-pairs", type=int, default=2, help="M=8/M=2 pairs")
    parser.add_argument("--clients-rounds", type=int, default=10, help="rounds of those runs")
    parser.add_argument("--dataset-pairs", type=int, default=2, help="PubMed/Cora pairs")
    parser.add_argument("--dataset-rounds", type=int, default=10, help="rounds of those runs")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/results.md")
    parser.add_argument(
        "--render", action="store_true", help="no runs: summarize the runs saved in --out again"
    )
    args = parser.parse_args(argv)
    if args.render:
        saved = json.loads(args.out.read_text())
        settings = saved["settings"]
        comparisons = {
            name: [(Run(**a), Run(**b)) for a, b in pairs] for name, pairs in saved["pairs"].items()
        }
    else:
        settings, comparisons = measure(args)
    results = summarize(settings, comparisons)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    section = markdown(results, comparisons["ckks_over_plain"])
    print(section)
    if not args.no_doc:
        write_section("overhead", section)


def measure(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Pairs]]:
    single_thread()
    from models.config import TrainConfig

    data_dir = Path(args.data_dir)
    base = TrainConfig(data_dir=data_dir, rounds=args.rounds, seed=0, dp=False)

    def run(label: str, **changes: Any) -> Callable[[], Run]:
        return lambda: run_over_http(label, replace(base, **changes), data_dir)

    comparisons = {
        "ckks_over_plain": interleaved_pairs(
            run("ckks", encryption="ckks"), run("plain", encryption="none"), pairs=args.pairs
        ),
        "m8_over_m2": interleaved_pairs(
            run("ckks M=8", clients=8, rounds=args.clients_rounds),
            run("ckks M=2", clients=2, rounds=args.clients_rounds),
            pairs=args.clients_pairs,
        ),
        "pubmed_over_cora": interleaved_pairs(
            run("ckks pubmed", dataset="pubmed", rounds=args.dataset_rounds),
            run("ckks cora", dataset="cora", rounds=args.dataset_rounds),
            pairs=args.dataset_pairs,
        ),
    }
    settings = {
        "rounds": args.rounds,
        "eval_every": base.eval_every,
        "clients_rounds": args.clients_rounds,
        "dataset_rounds": args.dataset_rounds,
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
    }
    return settings, comparisons


def summarize(settings: dict[str, Any], comparisons: dict[str, Pairs]) -> dict[str, Any]:
    he = comparisons["ckks_over_plain"]
    clients, datasets = comparisons["m8_over_m2"], comparisons["pubmed_over_cora"]
    return {
        "settings": settings,
        "ckks_over_plain": {
            "cpu": ratio(he, lambda r: r.cpu_seconds),
            "wall": ratio(he, lambda r: r.wall_seconds),
            "service_cpu": ratio(he, lambda r: r.service_cpu_seconds),
            "bytes": ratio(he, lambda r: r.bytes),
            "same_accuracy": all(a.test_accuracy == b.test_accuracy for a, b in he),
        },
        "m8_over_m2": {
            "service_cpu_per_pass": ratio(clients, lambda r: r.service_cpu_per_pass),
            "bytes": ratio(clients, lambda r: r.bytes),
            "service_cpu_per_byte": ratio(clients, lambda r: r.service_cpu_seconds / r.bytes),
        },
        "pubmed_over_cora": {
            "cpu_per_round": ratio(datasets, lambda r: r.cpu_per_round),
            "service_cpu_per_round": ratio(datasets, lambda r: r.service_cpu_seconds / r.rounds),
            "bytes": ratio(datasets, lambda r: r.bytes),
        },
        "pairs": {
            name: [[asdict(a), asdict(b)] for a, b in pairs] for name, pairs in comparisons.items()
        },
    }


def markdown(results: dict[str, Any], he: Sequence[tuple[Run, Run]]) -> str:
    settings, over = results["settings"], results["ckks_over_plain"]
    clients, datasets = results["m8_over_m2"], results["pubmed_over_cora"]
    plain_wall = statistics.median(b.wall_seconds for _, b in he)
    plain_cpu = statistics.median(b.cpu_seconds for _, b in he)
    accuracy = f"{100 * he[0][0].test_accuracy:.1f}"
    return "\n".join(
        [
            "## Encryption over HTTP (`bench/overhead.py`)",
            "",
            f"`glasu train --transport http` on loopback, GLASU (K=2, Q=4), DP off, seed 0,"
            f" evaluation every {settings['eval_every']} rounds; {settings['cpu_count']} cores"
            f" (load average {settings['load_average_1min']:.1f} at the end, the runs' own"
            " included). Ratios per interleaved pair of runs, median (min-max). CPU is that of the"
            " service and the workers, their start-up included (imports, data loading: roughly"
            " 15 s of a run's CPU on Cora, from the runs of 10 and of 60 rounds); service CPU"
            " excludes the service's start-up.",
            "",
            "| comparison | measure | ratio |",
            "|---|---|---|",
            f"| CKKS / plaintext, Cora, {settings['rounds']} rounds, {len(he)} pairs"
            f" (plaintext: {plain_wall:.0f} s wall, {plain_cpu:.0f} s CPU) | CPU |"
            f" {spread(over['cpu'])} |",
            f"| | wall time | {spread(over['wall'])} |",
            f"| | service CPU | {spread(over['service_cpu'])} |",
            f"| | bytes | {spread(over['bytes'])} |",
            f"| M = 8 / M = 2 clients, CKKS, Cora, {settings['clients_rounds']} rounds |"
            f" service CPU per pass | {spread(clients['service_cpu_per_pass'])} |",
            f"| | bytes | {spread(clients['bytes'])} |",
            f"| | service CPU per byte | {spread(clients['service_cpu_per_byte'])} |",
            f"| PubMed / Cora, CKKS, {settings['dataset_rounds']} rounds | CPU per round |"
            f" {spread(datasets['cpu_per_round'])} |",
            f"| | service CPU per round | {spread(datasets['service_cpu_per_round'])} |",
            f"| | bytes | {spread(datasets['bytes'])} |",
            "",
            f"Test accuracy: {accuracy} in both columns of every CKKS/plaintext pair."
            if over["same_accuracy"]
            else "Test accuracy differs between CKKS and plaintext runs: a bug.",
        ]
    )


if __name__ == "__main__":
    main()
