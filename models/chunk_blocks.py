"""The blocks of a layer-wise evaluation pass (``models.layerwise``), built before they are used.

A sampled chunk's block is built straight as a CSR matrix (the row-normalised adjacency that
``SampledLayer.mean_adjacency`` builds, without a COO matrix to coalesce). The pass computes
``EVAL_SPAN_CHUNKS`` consecutive chunks at once, as one span: a CSR matrix whose rows are the
chunks' targets in order and whose columns are node ids (targets x N), so one sparse product
with the whole layer below reads the sampled sources' rows where they lie, with no gathered copy
of them and, for consecutive targets (every layer but a capped one), no index into the arrays
at all. A span rather than a chunk: fewer, larger products, each a parallel region whose torch
threads meet at its end. The sample is still drawn chunk by chunk, so a span computes what its
chunks compute. GAT's PyG convolution transforms every source row it is given, so it alone is
given each chunk's sources, gathered, with the chunk's own block.

The spans are sampled and built by a thread at most ``SAMPLED_AHEAD`` spans ahead of the one
being computed (:func:`sampled_ahead`): the sampling (numpy, one core) runs while torch computes,
and draws the same sample as inline, since one thread draws every chunk in order.
"""

from __future__ import annotations

import itertools
import queue
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import numpy as np
import torch

from models.layers import Block
from models.sampler import SampledLayer

#: Sampled chunks computed as one span (8 chunks of 4,096 targets: 16 MB per row array of the
#: span at width 128)
EVAL_SPAN_CHUNKS = 8
#: Spans a pass samples and builds ahead of the one it computes (a few MB each)
SAMPLED_AHEAD = 2
#: Backbones whose layer is given a chunk's sources gathered rather than every node's rows: PyG's
#: GATConv transforms every source row it is given.
GATHERING_BACKBONES = frozenset({"gat"})


def chunk_block(layer: SampledLayer, device: torch.device) -> Block:
    """``layer``'s block, its columns the positions among ``layer.sources``."""
    return _block([layer], device, num_nodes=None)


def span_block(layers: Sequence[SampledLayer], device: torch.device, *, num_nodes: int) -> Block:
    """The block of ``layers`` (chunks of one layer) together: rows their targets in order,
    columns (and target positions) node ids, ``num_nodes`` of them."""
    return _block(layers, device, num_nodes=num_nodes)


def _block(layers: Sequence[SampledLayer], device: torch.device, *, num_nodes: int | None) -> Block:
    degrees, columns, rows, targets = [], [], [], []
    for layer in layers:
        order = np.argsort(layer.edge_target, kind="stable")
        positions = layer.edge_source[order].astype(np.int64, copy=False)
        columns.append(positions if num_nodes is None else layer.sources[positions])
        rows.append(layer.edge_target[order] + sum(len(d) for d in degrees))
        degrees.append(np.bincount(layer.edge_target, minlength=len(layer.targets)))
        targets.append(layer.target_positions if num_nodes is None else layer.targets)
    degree = np.concatenate(degrees)
    row = np.concatenate(rows)
    column = np.concatenate(columns)
    crow = np.zeros(len(degree) + 1, dtype=np.int64)
    np.cumsum(degree, out=crow[1:])
    values = np.reciprocal(degree.astype(np.float32))[row]
    width = len(layers[0].sources) if num_nodes is None else num_nodes
    with warnings.catch_warnings():  # "sparse CSR support is in beta": products are not
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        adjacency = torch.sparse_csr_tensor(
            torch.from_numpy(crow), torch.from_numpy(column), torch.from_numpy(values),
            (len(degree), width), check_invariants=False,
        )  # fmt: skip
    return Block(
        adjacency=adjacency.to(device),
        edge_index=torch.from_numpy(np.stack([column, row])).to(device),
        target_positions=torch.from_numpy(np.concatenate(targets)).long().to(device),
        num_targets=len(degree),
    )


def node_rows(nodes: np.ndarray, device: torch.device) -> slice | torch.Tensor:
    """An index of the rows of ``nodes`` (distinct) into an array over all nodes: a slice (a
    view, no copy) when they are consecutive and ascending."""
    if len(nodes) and bool((np.diff(nodes) == 1).all()):
        return slice(int(nodes[0]), int(nodes[-1]) + 1)
    return torch.from_numpy(nodes).to(device)


@dataclass(frozen=True)
class Span:
    """Consecutive chunks of one layer: ``targets`` indexes their targets in order, ``block``
    is their block over node-id columns (None where no stack reads it), ``chunk_blocks`` each
    chunk's own block (empty where nothing reads them)."""

    layers: tuple[SampledLayer, ...]
    targets: slice | torch.Tensor
    block: Block | None
    chunk_blocks: tuple[Block, ...]


def spans(
    chunks: Iterable[SampledLayer],
    *,
    num_nodes: int,
    device: torch.device,
    span_block_needed: bool,
    chunk_blocks_needed: bool,
) -> Iterator[Span]:
    """``chunks`` in spans of ``EVAL_SPAN_CHUNKS``, with the blocks asked for."""
    chunks = iter(chunks)
    while layers := tuple(itertools.islice(chunks, EVAL_SPAN_CHUNKS)):
        targets = np.concatenate([layer.targets for layer in layers])
        yield Span(
            layers=layers,
            targets=node_rows(targets, device),
            block=span_block(layers, device, num_nodes=num_nodes) if span_block_needed else None,
            chunk_blocks=tuple(chunk_block(layer, device) for layer in layers)
            if chunk_blocks_needed
            else (),
        )


Item = TypeVar("Item")


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_DONE = object()


def sampled_ahead(items: Iterable[Item], *, ahead: int = SAMPLED_AHEAD) -> Iterator[Item]:
    """``items`` in their order, drawn by a thread at most ``ahead`` items before they are
    used; an error of the drawing is raised here. When the consumer stops early, the thread
    stops after the item it is drawing."""
    ready: queue.Queue[object] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def draw() -> None:
        try:
            for item in items:
                if stop.is_set():
                    break
                ready.put(item)
        except BaseException as error:  # raised in the consumer, whatever it is
            ready.put(_Failed(error))
        finally:
            ready.put(_DONE)

    thread = threading.Thread(target=draw, name="glasu-sampling", daemon=True)
    thread.start()
    done = False
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield cast(Item, item)
        done = True
    finally:
        stop.set()
        while not done:  # frees the thread's put until it ends
            done = ready.get() is _DONE
        thread.join()
