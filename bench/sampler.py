"""The vectorised neighbour sampler against the loop it replaced and against PyG's operator.

One synthetic graph (``--nodes`` nodes, every node linked to ``--degree``/2 uniformly random
others, both directions: average degree ``--degree``) and the batches of a worker with the
default 4 layers and the occurrence cap 1 on layers 1-2 (up to the first aggregation layer):
a training batch of ``--batch`` output nodes with fanout 10 and with the default training fanout
3, and an evaluation batch of a tenth of the graph with fanout 10. Every batch is sampled
top-down over the 4 layers by each sampler in turn, ``--repeats`` times interleaved; the report
gives median seconds and the ratios. PyG's operator
(``torch.ops.pyg.neighbor_sample`` from pyg-lib, else torch-sparse's) samples the same layers
without the cap (its semantics have none); where neither is installed the report says so.

    python -m bench.sampler [--nodes 200000] [--degree 10] [--repeats 2] [--docs-only]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.results_doc import add_results_arguments, rewrote_docs_only, write_json, write_section
from models.sampler import NeighbourSampler, SamplingGraph, sampling_rng

SECTION = "sampler"
OUT = Path(__file__).resolve().parent / "results" / "sampler.json"

LAYERS = 4
CAPPED_LAYERS = 2  # depth <= the first aggregation layer (TrainConfig's default K = 2)
CAP = 1


class LoopSampler:
    """The sampler before it was vectorised: a Python loop per target (the reference)."""

    def __init__(self, edge_index: torch.Tensor, *, num_nodes: int, fanout: int,
                 occurrence_cap: int | None) -> None:  # fmt: skip
        self.fanout = fanout
        self.occurrence_cap = occurrence_cap
        src, dst = edge_index.numpy()
        keep = src != dst
        src, dst = src[keep], dst[keep]
        order = np.lexsort((src, dst))
        self._indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=num_nodes))])
        self._neighbours = src[order]

    def sample_layer(self, targets: np.ndarray, *, rng: random.Random) -> np.ndarray:
        """The layer's sources (targets ∪ drawn)."""
        drawn_by: dict[int, int] = {}
        drawn: list[int] = []
        visit = list(range(len(targets)))
        rng.shuffle(visit)
        for position in visit:
            node = int(targets[position])
            candidates = self._neighbours[self._indptr[node] : self._indptr[node + 1]]
            pool = sorted(set(candidates.tolist()))
            if self.occurrence_cap is not None:
                pool = [u for u in pool if drawn_by.get(u, 0) < self.occurrence_cap]
            chosen = pool if len(pool) <= self.fanout else rng.sample(pool, self.fanout)
            for u in chosen:
                drawn_by[u] = drawn_by.get(u, 0) + 1
                drawn.append(u)
        return np.union1d(targets, np.asarray(drawn, dtype=np.int64))


def synthetic_graph(nodes: int, degree: int, seed: int) -> torch.Tensor:
    generator = np.random.default_rng(seed)
    src = np.repeat(np.arange(nodes, dtype=np.int64), degree // 2)
    dst = generator.integers(0, nodes, len(src))
    return torch.from_numpy(np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]))


def vectorised_pass(
    samplers: dict[tuple[int, bool], NeighbourSampler], output: np.ndarray, fanout: int
) -> int:
    targets = output
    for depth in range(LAYERS, 0, -1):
        rng = sampling_rng(seed=0, client=0, pass_index=0, layer=depth)
        sampler = samplers[(fanout, depth <= CAPPED_LAYERS)]
        targets = sampler.sample_layer(targets, rng=rng).sources
    return len(targets)


def loop_pass(
    samplers: dict[tuple[int, bool], LoopSampler], output: np.ndarray, fanout: int
) -> int:
    targets = output
    for depth in range(LAYERS, 0, -1):
        rng = random.Random(depth)
        targets = samplers[(fanout, depth <= CAPPED_LAYERS)].sample_layer(targets, rng=rng)
    return len(targets)


def pyg_operator(graph: SamplingGraph) -> Callable[[np.ndarray, int], int] | None:
    """PyG's compiled neighbour sampling over the 4 layers (no cap), or None if not installed."""
    rowptr = torch.from_numpy(graph.indptr.astype(np.int64))
    col = torch.from_numpy(graph.neighbours.astype(np.int64))
    pyg = getattr(torch.ops, "pyg", None)
    if pyg is not None and hasattr(pyg, "neighbor_sample"):

        def run(output: np.ndarray, fanout: int) -> int:
            seed = torch.from_numpy(output)
            # (rowptr, col, seed, num_neighbors, time, seed_time, edge_weight, csc, replace,
            #  directed, disjoint, temporal_strategy, return_edge_id)
            nodes = pyg.neighbor_sample(rowptr, col, seed, [fanout] * LAYERS, None, None, None,
                                        True, False, True, False, "uniform", False)[2]  # fmt: skip
            return len(nodes)

        return run
    sparse = getattr(torch.ops, "torch_sparse", None)
    if sparse is not None and hasattr(sparse, "neighbor_sample"):

        def run(output: np.ndarray, fanout: int) -> int:
            seed = torch.from_numpy(output)
            nodes = sparse.neighbor_sample(rowptr, col, seed, [fanout] * LAYERS, False, True)[0]
            return len(nodes)

        return run
    return None


def time_into(times: list[float], run: Callable[[np.ndarray, int], int], output: np.ndarray,
              fanout: int) -> None:  # fmt: skip
    start = time.perf_counter()
    run(output, fanout)
    times.append(time.perf_counter() - start)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every batch sampled by every sampler ``args.repeats`` times, interleaved: the median
    seconds of each, with the graph's size and its CSR's bytes per node."""
    edge_index = synthetic_graph(args.nodes, args.degree, seed=0)
    start = time.perf_counter()
    graph = SamplingGraph.from_edge_index(edge_index, num_nodes=args.nodes)
    built = time.perf_counter() - start
    fanouts, caps = (3, 10), {False: None, True: CAP}
    vectorised = {(fanout, capped): NeighbourSampler(graph, fanout=fanout, occurrence_cap=cap)
                  for fanout in fanouts for capped, cap in caps.items()}  # fmt: skip
    loop = {(fanout, capped): LoopSampler(edge_index, num_nodes=args.nodes, fanout=fanout,
                                          occurrence_cap=cap)
            for fanout in fanouts for capped, cap in caps.items()}  # fmt: skip
    pyg = pyg_operator(graph)
    runners: dict[str, Callable[[np.ndarray, int], int]] = {
        "vectorised": lambda output, fanout: vectorised_pass(vectorised, output, fanout),
        "loop": lambda output, fanout: loop_pass(loop, output, fanout),
    }
    if pyg is not None:
        runners["pyg"] = pyg
    generator = np.random.default_rng(1)
    training = np.sort(generator.choice(args.nodes, args.batch, replace=False))
    evaluation = np.sort(generator.choice(args.nodes, args.nodes // 10, replace=False))
    batches = []
    for name, output, fanout in [
        ("training", training, 3),
        ("training", training, 10),
        ("evaluation", evaluation, 10),
    ]:
        layer_zero = vectorised_pass(vectorised, output, fanout)
        times: dict[str, list[float]] = {runner: [] for runner in runners}
        for _ in range(args.repeats):
            for runner, run in runners.items():
                time_into(times[runner], run, output, fanout)
        seconds = {runner: statistics.median(values) for runner, values in times.items()}
        batches.append({"batch": name, "output_nodes": len(output), "fanout": fanout,
                        "layer_zero_nodes": layer_zero, "seconds": seconds})  # fmt: skip
        timings = ", ".join(f"{runner} {value:.3f} s" for runner, value in seconds.items())
        print(f"{name} batch, fanout {fanout}: {timings}", flush=True)
    return {
        "nodes": args.nodes, "degree": args.degree, "repeats": args.repeats,
        "adjacency_entries": len(graph.neighbours), "csr_seconds": round(built, 2),
        "csr_bytes_per_node": (graph.indptr.nbytes + graph.neighbours.nbytes) / args.nodes,
        "pyg": "not installed (neither pyg-lib nor torch-sparse)" if pyg is None else "compared",
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"load average {os.getloadavg()[0]:.1f} at the start",
        "batches": batches,
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "## The neighbour sampler: vectorised, the loop it replaced, PyG's operator "
        "(`bench/sampler.py`)",
        "",
        f"One synthetic graph of {result['nodes']:,} nodes (average degree {result['degree']}, "
        f"{result['adjacency_entries']:,} adjacency entries), the batches of a worker with the "
        f"default 4 layers and the occurrence cap {CAP} on layers 1-{CAPPED_LAYERS}, each "
        f"sampled top-down by every sampler in turn, {result['repeats']} times interleaved "
        f"(median seconds; {result['machine']}). One CSR with 32-bit indices is shared by all "
        f"of a worker's samplers: {result['csr_bytes_per_node']:.0f} bytes per node, built in "
        f"{result['csr_seconds']} s. PyG's operator: {result['pyg']}"
        + (
            "; no build of either exists for torch 2.13, which CI installs, and the GPU machine "
            "lent to this project had neither, so there is no measured ratio to PyG."
            if result["pyg"].startswith("not installed")
            else "."
        ),
        "",
        "```",
        f"python -m bench.sampler --nodes {result['nodes']} --repeats {result['repeats']}",
        "```",
        "",
        "| batch | output nodes | fanout | layer-0 nodes | vectorised (s) | loop (s) "
        "| loop / vectorised | PyG (s) | vectorised / PyG |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch in result["batches"]:
        seconds = batch["seconds"]
        pyg = seconds.get("pyg")
        against_pyg = "-" if pyg is None else f"{seconds['vectorised'] / pyg:.2f}x"
        lines.append(
            f"| {batch['batch']} | {batch['output_nodes']:,} | {batch['fanout']} "
            f"| {batch['layer_zero_nodes']:,} | {seconds['vectorised']:.3f} "
            f"| {seconds['loop']:.3f} | {seconds['loop'] / seconds['vectorised']:.1f}x "
            f"| {'-' if pyg is None else f'{pyg:.3f}'} "
            f"| {against_pyg} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--degree", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    add_results_arguments(parser, OUT)
    args = parser.parse_args(argv)
    if rewrote_docs_only(args, SECTION, markdown):
        return 0
    result = measure(args)
    write_json(args.out, result)
    write_section(SECTION, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
