"""Privacy-utility trade-off of private GLASU on Cora and CiteSeer.

Test accuracy at epsilon in {1, 2, 4, 8, 16} and without noise (delta 1e-6, RDP accountant,
noise calibrated over every pass of the run, shared noise under CKKS encryption), for Q=1 and
Q=4 with the same number of local steps, beside the two references a user would weigh it
against: standalone training (no collaboration, nothing released) and non-private GLASU (K=2).
3 seeds, mean ± std, in process with encryption on. Cached per run in
bench/results/privacy/; the table goes to docs/results.md.

    python -m bench.privacy_utility [--workers 2] [--steps 200]
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.frontier import NO_NOISE_Z
from bench.results_doc import (
    add_data_dir_argument,
    cached,
    mean_std,
    publish,
    train_one_thread,
)

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / "results" / "privacy"
EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0, None)  # None: the private arrangement without noise
SEEDS = (0, 1, 2)
DELTA = 1e-6


def schedule(q: int, steps: int) -> dict:
    """Same number of local steps for every Q; ten evaluation passes (releases too)."""
    rounds = steps // q
    return {"stale": q, "rounds": rounds, "eval_every": max(1, rounds // 10)}


def run_one(job: dict) -> dict:
    return cached(CACHE / f"{job['name']}.json", lambda: train(job))


def train(job: dict) -> dict:
    report = train_one_thread(
        dataset=job["dataset"],
        data_dir=Path(job["data_dir"]),
        seed=job["seed"],
        delta=DELTA,
        **job["settings"],
    )
    privacy = report.privacy or {}
    result = {
        **job,
        "test_accuracy": report.test_accuracy,
        "epsilon": privacy.get("epsilon"),
        "noise_multiplier": privacy.get("noise_multiplier"),
        "releases": privacy.get("releases"),
        "wall_seconds": report.wall_seconds,
    }
    print(
        f"{job['name']}: test {report.test_accuracy:.3f} eps {result['epsilon']} "
        f"z {result['noise_multiplier']} ({report.wall_seconds:.0f} s)",
        flush=True,
    )
    return result


def jobs(data_dir: str, steps: int) -> list[dict]:
    out = []
    for dataset in ("cora", "citeseer"):
        for seed in SEEDS:
            base = {"dataset": dataset, "seed": seed, "data_dir": data_dir}
            out.append(
                {
                    **base,
                    "name": f"{dataset}-standalone-s{seed}",
                    "row": "standalone",
                    "settings": {"mode": "standalone", **schedule(1, steps)},
                }
            )
            for q in (1, 4):
                out.append(
                    {
                        **base,
                        "name": f"{dataset}-glasu-q{q}-s{seed}",
                        "row": f"non-private GLASU (K=2, Q={q})",
                        "settings": {"dp": False, "encryption": "none", **schedule(q, steps)},
                    }
                )
                for eps in EPSILONS:
                    privacy = (
                        {"epsilon": eps}
                        if eps is not None
                        else {"epsilon": None, "noise_multiplier": NO_NOISE_Z}
                    )
                    out.append(
                        {
                            **base,
                            "name": f"{dataset}-private-q{q}-e{eps}-s{seed}",
                            "row": f"private GLASU, Q={q}",
                            "eps": eps,
                            "settings": {**privacy, **schedule(q, steps)},
                        }
                    )
    return out


def table(results: list[dict], dataset: str) -> str:
    rows = [r for r in results if r["dataset"] == dataset]
    head = "| | " + " | ".join(f"ε = {e:g}" if e else "no noise" for e in EPSILONS) + " |"
    lines = [head, "|---|" + "---|" * len(EPSILONS)]
    for q in (1, 4):
        cells = [
            mean_std(
                [
                    r["test_accuracy"]
                    for r in rows
                    if r["row"] == f"private GLASU, Q={q}" and r.get("eps") == e
                ]
            )
            for e in EPSILONS
        ]
        lines.append(f"| private GLASU, Q={q} | " + " | ".join(cells) + " |")
        zs = [
            next(
                (
                    r["noise_multiplier"]
                    for r in rows
                    if r["row"] == f"private GLASU, Q={q}" and r.get("eps") == e
                ),
                None,
            )
            for e in EPSILONS
        ]
        lines.append(
            f"| noise multiplier z, Q={q} | "
            + " | ".join(
                "-" if z is None or (isinstance(z, float) and math.isinf(z)) else f"{z:.3g}"
                for z in zs
            )
            + " |"
        )
    for reference in ("standalone", "non-private GLASU (K=2, Q=1)", "non-private GLASU (K=2, Q=4)"):
        value = mean_std([r["test_accuracy"] for r in rows if r["row"] == reference])
        lines.append(f"| {reference} (reference) | {value} |" + " |" * (len(EPSILONS) - 1))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200, help="local steps per client")
    args = parser.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(run_one, jobs(args.data_dir, args.steps)))
    doc = [
        "## Privacy-utility trade-off (`bench/privacy_utility.py`)",
        "",
        f"Test accuracy (%), paper split, 3 seeds, mean ± std. {args.steps} local steps per "
        "client in every run (Q=1: that many rounds; Q=4: a quarter), ten evaluation passes; "
        "every pass (training or evaluation) is one release. Private GLASU: the private "
        "arrangement of docs/privacy.md (one noisy layer-1 release of width 16 per pass, "
        f"clip 1, occurrence cap 1, replace-one sensitivity 2√2), delta {DELTA:g}, RDP "
        "accountant, z calibrated to spend exactly epsilon over the run, noise shared "
        "between the 3 clients under CKKS encryption (accounted against one curious peer).",
        "",
    ]
    for dataset in ("cora", "citeseer"):
        doc += [f"### {dataset}", "", table(results, dataset), ""]
    publish("privacy-utility", doc)


if __name__ == "__main__":
    main()
