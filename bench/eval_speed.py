"""The evaluation pass at scale: the product's layer-wise pass against PyG's full-graph inference
of the same network, and training throughput (issue 37, "Speed").

On one of the scale map's CSBM graphs (``bench/frontier_scale.py``: 5 classes, weak signal,
degree 16, 1% labelled, 48 features cut into M = 3 blocks; each party keeps 80% of the edges), a
federation of the product's default arrangement (DP on, so layer 1's evaluation sample is the
capped draw; encryption off: CKKS runs on the CPU whatever the code, and is measured apart by
``bench/he.py``) trains ``--train-passes`` rounds in one process (``models/inprocess.py``), then
client 0's trained network is evaluated over every node, ``--repeats`` times, interleaved:

- **layer-wise**: the product's evaluation pass of the network (``models/layerwise.py``: the
  input projection, every graph layer chunk by chunk with its evaluation sample, the head at the
  validation and test nodes), without the aggregation between clients;
- **PyG full graph**: the same weights in PyG's ``GCN2Conv`` / ``GCNConv`` over the client's
  whole graph at once (every neighbour, the row-normalised adjacency with self-loops as a
  ``torch.sparse_csr`` matrix built once before the timing), the same projection and head.

Each is timed for wall and CPU seconds, peak RSS (VmHWM, reset before the pass; it counts the
file-mapped node arrays of ``models/node_arrays.py``) and peak anonymous memory (RssAnon,
polled), with one torch thread and with every thread. Before that, on a small graph with an
evaluation fanout above every degree, both give the same top layer (the reference is the
product's network). Training throughput: labelled output nodes per second of the whole
federation's rounds (each round a batch of ``batch_size`` labelled nodes, Q local steps).

    python -m bench.eval_speed --nodes 100000 --repeats 2 --threads 1 2 --label after
    python -m bench.eval_speed --docs-only    # docs/results.md's section from the results file
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import os
import re
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.frontier_scale import ScaleGraph
from bench.results_doc import (
    add_labelled_results_arguments,
    keep_labelled,
    rewrote_docs_only,
    write_section,
)
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layerwise import EVAL_CHUNK_NODES, propagate_all
from models.layout import eval_nodes, layout_federation, session_schedule
from models.sampler import SamplingGraph
from models.trainer import prepare_security

OUT = Path(__file__).resolve().parent / "results" / "eval_speed.json"
SECTION = "eval-speed"
PARTIES = 3
STATUS = Path("/proc/self/status")
LIBC = ctypes.CDLL("libc.so.6")


#: The docs section's paragraph (``str.format``-ed with a result's settings)
INTRO = re.sub(
    r"\s+",
    " ",
    """One of the scale map's CSBM graphs (5 classes, weak signal, degree 16, 1% labelled, 48
features in M = 3 blocks, each party 80% of the edges); the product's default arrangement
({backbone}, 4 layers of width 128, DP on so layer 1's evaluation sample is the capped draw,
evaluation fanout {eval_fanout}; encryption off). After the training rounds below, client 0's
network is evaluated over every node by the product's **layer-wise** pass
(`models/layerwise.py`, chunks of {chunk_nodes:,} targets, the aggregation between clients left
out) and by **PyG**'s `GCN2Conv` (gcnii; `GCNConv`: gcn) with the same weights over the client's
whole graph at once (every neighbour, the row-normalised adjacency as a `torch.sparse_csr`
matrix, built before the timing), interleaved, medians of the repeats. Ratios are layer-wise
over PyG. Memory is the peak over what the process held when the pass began (the graph, the
federation; freed memory returned to the system first). Peak RSS counts the layer-wise pass's
N-row arrays, which live in file-backed mappings (`models/node_arrays.py`) that the kernel can
drop; peak anonymous memory is what must stay in memory. Training: labelled output nodes per
second of the three parties' rounds in one process (batch {batch_size}, Q = {stale} steps a
round). CPU only: no GPU was available to these runs. The machine: 2 CPU cores, shared with
other runs (the load average at the start and the end of each run in the table).""",
)


#: What the labels of the runs stand for
CODE = re.sub(
    r"\s+",
    " ",
    """Each run at its commit (the before runs with this bench copied in). The code: **before
    (8cda906)** built each chunk's block as a coalesced COO matrix over the chunk's sources,
    gathered the sources' rows and scattered the targets' rows, and sampled inline; **CSR
    blocks, chunk by chunk (8893568)** builds each block as a CSR matrix over node-id columns,
    multiplied with the whole layer below in place; **after** computes spans of 8 chunks as one
    such block, sampled and built by a thread ahead of the computation
    (`models/chunk_blocks.py`). The sample, and so what the pass computes, is the same
    (`tests/models/test_layerwise_blocks.py`). Its peak anonymous memory, about 0.3 GB, is the
    spans (32,768 targets computed at once, two more spans sampled ahead) and does not grow with
    N; at 100,000 nodes the N-row arrays (51 MB each) stay in memory, under the 64 MiB above
    which they are mapped from files, so the peak there counts them too. On this shared machine,
    the 2-thread rows measure contention as much as the code: torch's two threads meet at the
    end of every parallel product, and wait there for a thread the other runs have descheduled,
    so the passes with many small products (the chunk-by-chunk ones) lose the most; CPU seconds
    are steadier than wall seconds. The 100,000-node runs of 8cda906 and 8893568 measured memory
    without first returning the memory freed before the pass to the system. Training is the same
    code in every row (these changes touch only evaluation): its rates differ with the load, and
    the two 1,000,000-node runs ran at the same time.""",
)


@dataclasses.dataclass
class Usage:
    """Wall and CPU seconds of a block, and how far its peak RSS and peak anonymous memory rose
    above what the process held when it began (MB)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0
    peak_anon_mb: float = 0.0


def _status_mb(field: str) -> float:
    found = re.search(rf"^{field}:\s+(\d+)", STATUS.read_text(), re.MULTILINE)
    return int(found.group(1)) / 1024 if found else 0.0


@contextmanager
def measured() -> Iterator[Usage]:
    """The usage of the block: VmHWM reset before it (``/proc/self/clear_refs``), RssAnon polled
    every 5 ms by a thread."""
    usage = Usage()
    gc.collect()
    LIBC.malloc_trim(0)  # memory freed before the block leaves the process: its peak is its own
    Path("/proc/self/clear_refs").write_text("5")
    rss, anon = _status_mb("VmRSS"), _status_mb("RssAnon")
    peak_anon = anon
    done = threading.Event()

    def poll() -> None:
        nonlocal peak_anon
        while not done.wait(0.005):
            peak_anon = max(peak_anon, _status_mb("RssAnon"))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        yield usage
    finally:
        usage.wall_s = time.perf_counter() - wall
        usage.cpu_s = time.process_time() - cpu
        done.set()
        poller.join()
        usage.peak_anon_mb = max(peak_anon, _status_mb("RssAnon")) - anon
        usage.peak_rss_mb = _status_mb("VmHWM") - rss


def federation(
    dataset: GraphDataset, *, backbone: str, seed: int, **settings: Any
) -> tuple[TrainConfig, list[GlasuClient], Any]:
    config = TrainConfig(
        dataset="csbm", clients=PARTIES, backbone=backbone, encryption="none", device="cpu",
        seed=seed, **settings,
    )  # fmt: skip
    layout = layout_federation(config, dataset)
    security = prepare_security(config, passes_total=config.rounds + 1, clients=PARTIES)
    cpu = torch.device("cpu")
    clients = [security.make_client(p, layout, config, cpu) for p in layout.partitions]
    return config, clients, security.aggregator


def layerwise_pass(client: GlasuClient, output_nodes: np.ndarray) -> torch.Tensor:
    """The product's evaluation pass of ``client``'s network: the top layer of every node (the
    head's scores at ``output_nodes`` computed too)."""
    evaluation = client.evaluation
    stack = evaluation.all_nodes(client.network, client.generator)
    for depth in range(1, client.layers + 1):
        propagate_all(depth, [stack], evaluation.layer_chunks(depth), device=client.device)
    evaluation.score(stack, output_nodes)
    return stack.h


def full_adjacency(client: GlasuClient) -> torch.Tensor:
    """The client's whole graph, each node averaging itself and all its neighbours: the
    (N x N) CSR matrix a layer-wise block samples from."""
    graph = SamplingGraph.from_edge_index(
        client.partition.edge_index, num_nodes=client.partition.num_nodes
    )
    n = graph.num_nodes
    degree = np.diff(graph.indptr).astype(np.int64) + 1
    crow = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=crow[1:])
    columns = np.empty(crow[-1], dtype=np.int64)
    own = crow[:-1]  # each row's self-loop first, then its neighbours
    neighbour = np.ones(len(columns), dtype=bool)
    neighbour[own] = False
    columns[own] = np.arange(n)
    columns[neighbour] = graph.neighbours
    values = np.repeat(np.reciprocal(degree.astype(np.float32)), degree)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(crow), torch.from_numpy(columns), torch.from_numpy(values), (n, n),
            check_invariants=False,
        )  # fmt: skip


def pyg_layers(client: GlasuClient) -> list[torch.nn.Module]:
    """PyG's layers with the weights of ``client``'s graph layers (no normalisation of their
    own: the adjacency is given normalised)."""
    from torch_geometric.nn import GCN2Conv, GCNConv

    model = client.network.config
    layers: list[torch.nn.Module] = []
    for depth, conv in enumerate(client.network.convs, start=1):
        if model.backbone == "gcnii":
            pyg = GCN2Conv(
                model.hidden, alpha=model.alpha, theta=model.theta, layer=depth,
                shared_weights=True, normalize=False,
            )  # fmt: skip
            pyg.weight1.data.copy_(conv.weight.data)
        elif model.backbone == "gcn":
            pyg = GCNConv(model.hidden, model.hidden, normalize=False, add_self_loops=False)
            pyg.lin.weight.data.copy_(conv.linear.weight.data)
            assert pyg.bias is not None
            pyg.bias.data.copy_(conv.linear.bias.data)
        else:
            raise ValueError(f"no PyG reference for the {model.backbone} backbone")
        layers.append(pyg.eval())
    return layers


def full_graph_pass(
    client: GlasuClient,
    adjacency: torch.Tensor,
    layers: list[torch.nn.Module],
    output_nodes: np.ndarray,
) -> torch.Tensor:
    """PyG's full-graph inference of the same network: every node at once, every layer."""
    network = client.network
    with torch.no_grad():
        features = client.feature_rows(np.arange(client.partition.num_nodes, dtype=np.int64))
        h0 = h = network.project(features, generator=client.generator)
        for layer in layers:
            h = torch.relu(
                layer(h, h0, adjacency) if network.uses_initial_residual else layer(h, adjacency)
            )
        network.classify(h[torch.from_numpy(output_nodes)], generator=client.generator)
    return h


def reference_check(backbone: str) -> float:
    """The largest difference between the two passes' top layers on a small graph, evaluation
    fanout above every degree and no cap (so the layer-wise sample is every neighbour)."""
    dataset = ScaleGraph(3000, 0.01, "weak", 16.0, 0).load()
    _, clients, _ = federation(
        dataset, backbone=backbone, seed=0, dp=False, eval_fanout=1000, rounds=1
    )
    client = clients[0]
    client.network.eval()
    nodes = eval_nodes(dataset)
    layerwise = layerwise_pass(client, nodes)
    full = full_graph_pass(client, full_adjacency(client), pyg_layers(client), nodes)
    return float((layerwise - full).abs().max())


def train_rounds(
    clients: list[GlasuClient], aggregator: Any, schedule: Any, passes: list[int]
) -> Usage:
    with measured() as usage:
        for index in passes:
            run_pass_inprocess(
                clients, aggregator, pass_index=index, kind="train",
                output_nodes=schedule.output_nodes(index),
            )  # fmt: skip
    return usage


def measure(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    dataset = ScaleGraph(args.nodes, 0.01, "weak", 16.0, args.seed).load()
    print(f"graph of {args.nodes:,} nodes in {time.perf_counter() - started:.1f} s", flush=True)
    rounds = 1 + len(args.threads) * args.train_passes  # a warm-up, then each thread count's
    config, clients, aggregator = federation(
        dataset, backbone=args.backbone, seed=args.seed, rounds=rounds, eval_every=0
    )
    schedule = session_schedule(config, dataset)
    train_rounds(clients, aggregator, schedule, [0])
    client, nodes = clients[0], eval_nodes(dataset)
    started = time.perf_counter()
    adjacency = full_adjacency(client)
    adjacency_s = time.perf_counter() - started
    layers: list[torch.nn.Module] = []  # PyG's layers with the weights trained so far
    passes: dict[str, Callable[[], torch.Tensor]] = {
        "layer-wise": lambda: layerwise_pass(client, nodes),
        "PyG full graph": lambda: full_graph_pass(client, adjacency, layers, nodes),
    }
    runs = []
    next_pass = 1
    for threads in args.threads:
        torch.set_num_threads(threads)
        span = list(range(next_pass, next_pass + args.train_passes))
        next_pass += args.train_passes
        train = train_rounds(clients, aggregator, schedule, span)
        layers[:] = pyg_layers(client)
        client.network.eval()
        for repeat in range(args.repeats):
            order = list(passes) if repeat % 2 == 0 else list(reversed(passes))
            for name in order:
                with measured() as usage:
                    passes[name]()
                record = {"threads": threads, "pass": name, "repeat": repeat}
                runs.append({**record, **dataclasses.asdict(usage)})
                print(f"  {threads} thread(s) {name}: {usage}", flush=True)
        runs.append({
            "threads": threads, "pass": "training", "rounds": args.train_passes,
            "labelled_per_s": config.batch_size * args.train_passes / train.wall_s,
            **dataclasses.asdict(train),
        })  # fmt: skip
        print(f"  {threads} thread(s) training: {runs[-1]['labelled_per_s']:.1f} labelled/s")
    return {
        "nodes": args.nodes, "backbone": args.backbone, "batch_size": config.batch_size,
        "stale": config.stale, "eval_fanout": config.eval_fanout,
        "chunk_nodes": EVAL_CHUNK_NODES, "adjacency_build_s": adjacency_s,
        "reference_max_difference": reference_check(args.backbone),
        "torch": torch.__version__, "device": "cpu (no GPU available to this run)",
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "runs": runs,
    }  # fmt: skip


def _median(runs: list[dict[str, Any]], name: str, field: str) -> float:
    return float(np.median([r[field] for r in runs if r["pass"] == name]))


def summary_rows(result: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Per thread count: the medians of both passes, their ratios, and the training rate."""
    for threads in sorted({r["threads"] for r in result["runs"]}):
        runs = [r for r in result["runs"] if r["threads"] == threads]
        row: dict[str, Any] = {"threads": threads}
        for field in ("wall_s", "cpu_s", "peak_rss_mb", "peak_anon_mb"):
            mine, pyg = _median(runs, "layer-wise", field), _median(runs, "PyG full graph", field)
            row[field] = (mine, pyg, mine / pyg)
        row["labelled_per_s"] = next(r["labelled_per_s"] for r in runs if r["pass"] == "training")
        yield row


def markdown(payload: dict[str, Any]) -> str:
    any_result = next(iter(payload.values()))
    lines = [
        "## The evaluation pass against full-graph inference, and training throughput "
        "(issue 37) (`bench/eval_speed.py`)",
        "",
        INTRO.format(**any_result),
        "",
        "```",
        *(r["command"] for r in payload.values()),
        "```",
        "",
        "| code | N | load avg. | torch threads | layer-wise wall (s) | PyG wall (s) | wall ratio "
        "| CPU ratio | peak RSS added, MB (ratio) | peak anonymous added, MB (ratio) "
        "| training labelled nodes/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in payload.values():
        load = " / ".join(f"{x:g}" for x in result["load_average"])
        for row in summary_rows(result):
            wall, cpu, rss, anon = (
                row[f] for f in ("wall_s", "cpu_s", "peak_rss_mb", "peak_anon_mb")
            )
            lines.append(
                f"| {result['label']} | {result['nodes']:,} | {load} | {row['threads']} "
                f"| {wall[0]:.2f} "
                f"| {wall[1]:.2f} | {wall[2]:.2f} | {cpu[2]:.2f} "
                f"| {rss[0]:,.0f} / {rss[1]:,.0f} ({rss[2]:.2f}) "
                f"| {anon[0]:,.0f} / {anon[1]:,.0f} ({anon[2]:.2f}) | {row['labelled_per_s']:.1f} |"
            )
    differences = {f"{r['reference_max_difference']:.1e}" for r in payload.values()}
    lines += [
        "",
        CODE,
        "",
        "The reference is the product's network: on a 3,000-node graph with an evaluation "
        "fanout above every degree and no cap, the two passes' top layers differ by at most "
        f"{', '.join(sorted(differences))}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--backbone", choices=["gcnii", "gcn"], default="gcnii")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, torch.get_num_threads()])
    parser.add_argument("--train-passes", type=int, default=8, help="timed rounds per thread count")
    add_labelled_results_arguments(parser, OUT)
    args = parser.parse_args(argv)
    if rewrote_docs_only(args, SECTION, markdown):
        return 0
    result = measure(args)
    result["command"] = "python -m bench.eval_speed " + shlex.join(argv or sys.argv[1:])
    result["label"] = args.label
    markdown_text = markdown(keep_labelled(args.out, f"{args.label} n={args.nodes}", result))
    write_section(SECTION, markdown_text)
    print(markdown_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
