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

    PYTHONPATH=. python -m bench.sampler [--nodes 200000] [--degree 10] [--repeats 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from models.sampler import NeighbourSampler, SamplingGraph, sampling_rng

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--degree", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    edge_index = synthetic_graph(args.nodes, args.degree, seed=0)
    start = time.perf_counter()
    graph = SamplingGraph.from_edge_index(edge_index, num_nodes=args.nodes)
    print(f"graph: {args.nodes:,} nodes, {len(graph.neighbours):,} adjacency entries, "
          f"CSR built in {time.perf_counter() - start:.2f} s, "
          f"{(graph.indptr.nbytes + graph.neighbours.nbytes) / args.nodes:.0f} bytes per node "
          f"(shared by all samplers)")  # fmt: skip
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
    if pyg is None:
        print("PyG's operator: not installed (neither pyg-lib nor torch-sparse), not compared")
    else:
        runners["pyg"] = pyg
    generator = np.random.default_rng(1)
    training = np.sort(generator.choice(args.nodes, args.batch, replace=False))
    evaluation = np.sort(generator.choice(args.nodes, args.nodes // 10, replace=False))
    batches = [
        ("training", training, 3),
        ("training", training, 10),
        ("evaluation", evaluation, 10),
    ]
    for name, output, fanout in batches:
        layer_zero = vectorised_pass(vectorised, output, fanout)
        times: dict[str, list[float]] = {runner: [] for runner in runners}
        for _ in range(args.repeats):
            for runner, run in runners.items():
                time_into(times[runner], run, output, fanout)
        seconds = {runner: statistics.median(values) for runner, values in times.items()}
        line = ", ".join(f"{runner} {value:.3f} s" for runner, value in seconds.items())
        print(f"{name} batch ({len(output):,} output nodes, fanout {fanout}, "
              f"{layer_zero:,} layer-0 nodes): {line}")  # fmt: skip
        print(f"  loop / vectorised = {seconds['loop'] / seconds['vectorised']:.1f}x")
        if "pyg" in seconds:
            print(f"  vectorised / pyg = {seconds['vectorised'] / seconds['pyg']:.2f}x")


if __name__ == "__main__":
    main()
