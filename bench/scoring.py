"""Joint scoring throughput over HTTP: nodes per second and bytes per node, encryption on vs
off, Cora and PubMed (docs/data.md, "Using the model").

Per dataset: a short private training (3 clients, DP on) keeps each client's model
(`--model-out`), then two scoring sessions (`kind: scoring`, the training's noise) score every
node with those models (one evaluation pass each), one with CKKS and one with plaintext shares,
interleaved `--repeats` times, each in real processes over loopback (the service and three
`glasu worker`s).
The wall time runs from the session's creation to the last worker's exit; bytes are the
workers' request and response bodies. Ratios (CKKS / plaintext) are taken within a repeat.

    python -m bench.scoring [--datasets cora pubmed] [--repeats 2]
    python -m bench.scoring --alignment-sizes 100000 1000000   (bench/alignment_update.py)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.results_doc import add_data_dir_argument, load_copied, write_section

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "scoring.json"
ALIGNMENT_OUT = ROOT / "bench" / "results" / "alignment_update.json"


def train_models(config, layout, dataset, root: Path) -> list[Path]:
    from clients.local.federation import train_over_http

    models = [root / "models" / f"client-{m}" for m in range(config.clients)]
    train_over_http(config, layout, dataset, progress=False, model_dirs=models)
    return models


def score_once(config, layout, models: list[Path], *, encrypted: bool) -> dict:
    import dataclasses

    from clients.local.federation import follow, local_federation
    from clients.local.session import scoring_request
    from models.artefact import read_manifest

    manifest = read_manifest(models[0])
    run = dataclasses.replace(
        config,
        encryption="ckks" if encrypted else "none",
        epsilon=None,
        noise_multiplier=manifest["release"]["noise_multiplier"],
    )
    training = {**manifest["session_config"], "encryption": run.encryption}
    nodes = np.arange(training["num_nodes"])
    with local_federation(encrypted=encrypted) as fed:
        started = time.perf_counter()
        created = fed.admin.create_session(
            scoring_request(training, model_session=manifest["session_id"], nodes=nodes)
        )
        fed.start_workers(
            run,
            layout.partitions,
            created,
            threads=1,
            extra=lambda m: ["--model", str(models[m]), "--max-lifetime-epsilon", "1000"],
        )
        follow(fed.admin, created["session_id"], fed.processes, created["passes_total"], False)
        wall = time.perf_counter() - started
        results = fed.results(config.clients)
    traffic = sum(r["bytes_up"] + r["bytes_down"] for r in results)
    return {
        "encrypted": encrypted,
        "nodes": int(nodes.size),
        "passes": created["passes_total"],
        "wall_seconds": wall,
        "nodes_per_second": nodes.size / wall,
        "bytes_per_node": traffic / nodes.size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir_argument(parser)
    parser.add_argument("--datasets", nargs="+", default=["cora", "pubmed"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument(
        "--alignment-sizes",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="measure the incremental alignment instead, at N ids per party (each size's rows "
        "are added to those of other sizes already measured)",
    )
    parser.add_argument(
        "--alignment-full-once",
        action="store_true",
        help="with --alignment-sizes: take the first alignment as the full one (no second)",
    )
    args = parser.parse_args()
    if args.alignment_sizes is not None:
        incremental_alignment(
            args.alignment_sizes,
            render_only=args.render_only,
            full_again=not args.alignment_full_once,
        )
        return
    if args.render_only:
        render(json.loads(OUT.read_text()), args)
        return
    from models.config import TrainConfig
    from models.layout import layout_federation

    rows = []
    with tempfile.TemporaryDirectory(prefix="glasu-scoring-") as tmp:
        for name in args.datasets:
            dataset = load_copied(name, scratch=Path(tmp), source=Path(args.data_dir))
            config = TrainConfig(
                dataset=name, rounds=args.rounds, eval_every=args.rounds, encryption="none",
                device="cpu", hidden=64,
            )  # fmt: skip
            layout = layout_federation(config, dataset)
            models = train_models(config, layout, dataset, Path(tmp) / name)
            for repeat in range(args.repeats):
                for encrypted in (True, False) if repeat % 2 == 0 else (False, True):
                    row = score_once(config, layout, models, encrypted=encrypted)
                    row.update(dataset=name, repeat=repeat)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    render({"rows": rows}, args)


def incremental_alignment(sizes: list[int], *, render_only: bool, full_again: bool) -> None:
    from bench.alignment_update import measure, render

    done = json.loads(ALIGNMENT_OUT.read_text())["rows"] if ALIGNMENT_OUT.exists() else []
    if not render_only:
        for size in sizes:
            done = [row for row in done if row["size"] != size]
            done.append(measure(size, full_again=full_again))
            ALIGNMENT_OUT.write_text(json.dumps({"rows": done}, indent=2) + "\n")
    done.sort(key=lambda row: row["size"])
    write_section(
        "incremental_alignment",
        "## Incremental alignment: 50 new customers (`bench/scoring.py --alignment-sizes`)\n\n"
        + render(done),
    )


def render(result: dict, args: argparse.Namespace) -> None:
    rows = result["rows"]
    # results from before scoring became one pass name their chunk of nodes per pass
    passes = f"chunks of {result['chunk']} nodes" if "chunk" in result else "one pass"
    lines = [
        f"Every node of the dataset scored by 3 workers with the models of a 20-round private "
        f"training (DP on, the training's z), {passes}, real processes "
        "over loopback, 2 shared cores; CKKS / plaintext ratios within each repeat.",
        "",
        "| dataset | nodes | passes | CKKS nodes/s | plaintext nodes/s | CKKS bytes/node | "
        "plaintext bytes/node | time CKKS/plain | bytes CKKS/plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        ckks = [r for r in mine if r["encrypted"]]
        plain = [r for r in mine if not r["encrypted"]]
        pairs = list(zip(sorted(ckks, key=lambda r: r["repeat"]),
                         sorted(plain, key=lambda r: r["repeat"]), strict=True))  # fmt: skip
        time_ratio = [c["wall_seconds"] / p["wall_seconds"] for c, p in pairs]
        byte_ratio = [c["bytes_per_node"] / p["bytes_per_node"] for c, p in pairs]
        lines.append(
            f"| {name} | {mine[0]['nodes']} | {mine[0]['passes']} "
            f"| {np.median([r['nodes_per_second'] for r in ckks]):.0f} "
            f"| {np.median([r['nodes_per_second'] for r in plain]):.0f} "
            f"| {np.median([r['bytes_per_node'] for r in ckks]):,.0f} "
            f"| {np.median([r['bytes_per_node'] for r in plain]):,.0f} "
            f"| {np.median(time_ratio):.2f}x ({min(time_ratio):.2f}-{max(time_ratio):.2f}) "
            f"| {np.median(byte_ratio):.2f}x |"
        )
    write_section(
        "scoring", "## Joint scoring throughput (`bench/scoring.py`)\n\n" + "\n".join(lines)
    )


if __name__ == "__main__":
    main()
