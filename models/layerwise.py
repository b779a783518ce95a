"""Layer-wise inference over every aligned node: what an evaluation pass computes.

An evaluation pass exchanges no node sets (docs/protocol.md): every graph layer is computed for
all N aligned nodes, one chunk of targets at a time (``models.sampler.NeighbourSampler.
sample_all``), each chunk's sources read from the layer below, which is kept whole. What a pass
holds in memory is therefore per chunk (a sampled block, the chunk's rows): the few N x width
float32 arrays per network (the input projection h0, GCNII's initial residual; the layer below
and the layer being computed; at an aggregation layer the others' part) are
``models.node_arrays.node_array``s, mapped from a temporary file on the CPU, and every
operation over all nodes runs chunk by chunk.

A chunk's block is built straight as a CSR matrix whose columns are node ids (targets x N): one
sparse product with the whole layer below reads the sampled sources' rows where they lie, with
no gathered copy of them, no coalesced COO matrix and, for consecutive targets (every layer but
a capped one), no index into the arrays at all (bench/eval_speed.py measures it against
full-graph inference). GAT's PyG convolution transforms every source row it is given, so it
alone is given the chunk's sources, gathered.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.layers import Block
from models.node_arrays import chunk_rows, node_array
from models.outcome import EvaluationScores, PassOutcome, score_evaluation
from models.sampler import PassSampling, SampledLayer, sampling_rng
from models.workset import Extracted, combine

#: Targets per chunk of a layer-wise layer: with fanout 10 a chunk gathers up to about 45,000
#: source rows (23 MB at width 128).
EVAL_CHUNK_NODES = 4096


@dataclass
class Stack:
    """One network's representations of every node: the input projection and the current
    layer (both N x hidden)."""

    network: ClientNetwork
    generator: torch.Generator
    h0: torch.Tensor
    h: torch.Tensor


def project_all(
    network: ClientNetwork,
    generator: torch.Generator,
    rows: Callable[[np.ndarray], torch.Tensor],
    *,
    num_nodes: int,
    device: torch.device,
) -> Stack:
    """The input projection of every node, ``rows(nodes)`` reading the features of a chunk."""
    h0 = node_array(num_nodes, network.config.hidden, device=device)
    with torch.no_grad():
        for span in chunk_rows(num_nodes, chunk=EVAL_CHUNK_NODES):
            nodes = np.arange(span.start, span.stop, dtype=np.int64)
            h0[span] = network.project(rows(nodes), generator=generator)
    return Stack(network, generator, h0, h0)


#: Called with every chunk of a layer (its block on the device, its columns the chunk's sources,
#: and its sampled structure).
ChunkHook = Callable[[Block, SampledLayer], None]

#: Backbones whose layer is given a chunk's sources gathered rather than every node's rows: PyG's
#: GATConv transforms every source row it is given.
GATHERING_BACKBONES = frozenset({"gat"})


def chunk_block(
    layer: SampledLayer, device: torch.device, *, num_nodes: int | None = None
) -> Block:
    """``layer``'s block, its row-normalised adjacency built as a CSR matrix (the matrix
    ``SampledLayer.mean_adjacency`` builds, without a COO matrix to coalesce). Its columns are
    the positions among ``layer.sources``; with ``num_nodes``, node ids (targets x
    ``num_nodes``, the target positions node ids too): a block whose sources are all nodes, so a
    layer reads the rows of the whole layer below where they lie."""
    rows = layer.edge_target
    order = np.argsort(rows, kind="stable")
    degree = np.bincount(rows, minlength=len(layer.targets))
    crow = np.zeros(len(degree) + 1, dtype=np.int64)
    np.cumsum(degree, out=crow[1:])
    columns = layer.edge_source[order].astype(np.int64, copy=False)
    if num_nodes is None:
        width, target_positions = len(layer.sources), layer.target_positions
    else:
        columns = layer.sources[columns]
        width, target_positions = num_nodes, layer.targets
    values = np.reciprocal(degree.astype(np.float32))[rows[order]]
    with warnings.catch_warnings():  # "sparse CSR support is in beta": products are not
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        adjacency = torch.sparse_csr_tensor(
            torch.from_numpy(crow), torch.from_numpy(columns), torch.from_numpy(values),
            (len(layer.targets), width), check_invariants=False,
        )  # fmt: skip
    return Block(
        adjacency=adjacency.to(device),
        edge_index=torch.from_numpy(np.stack([columns, rows[order]])).to(device),
        target_positions=torch.from_numpy(target_positions).long().to(device),
        num_targets=len(layer.targets),
    )


def node_rows(nodes: np.ndarray, device: torch.device) -> slice | torch.Tensor:
    """An index of the rows of ``nodes`` (sorted, distinct) into an array over all nodes: a
    slice (a view, no copy) when they are consecutive."""
    if len(nodes) and int(nodes[-1]) - int(nodes[0]) + 1 == len(nodes):
        return slice(int(nodes[0]), int(nodes[-1]) + 1)
    return torch.from_numpy(nodes).to(device)


def propagate_all(
    depth: int,
    stacks: Iterable[Stack],
    chunks: Iterable[SampledLayer],
    *,
    device: torch.device,
    on_chunk: ChunkHook | None = None,
) -> None:
    """Graph layer ``depth`` for every node of every stack, chunk by chunk of ``chunks`` (one
    sample shared by the stacks); ``on_chunk`` sees every chunk too (the private release)."""
    stacks = list(stacks)
    computed = [node_array(*stack.h.shape, device=device) for stack in stacks]
    gathers = [s.network.config.backbone in GATHERING_BACKBONES for s in stacks]
    with torch.no_grad():
        for layer in chunks:
            targets = node_rows(layer.targets, device)
            block = chunk_block(layer, device) if any(gathers) or on_chunk else None
            in_place = (
                None if all(gathers) else chunk_block(layer, device, num_nodes=len(stacks[0].h))
            )
            for stack, out, gather in zip(stacks, computed, gathers, strict=True):
                initial = stack.h0[targets] if stack.network.uses_initial_residual else None
                if gather:
                    sources = torch.from_numpy(layer.sources).to(device)
                    h, chunk = stack.h[sources], block
                else:
                    h, chunk = stack.h, in_place
                assert chunk is not None
                out[targets] = stack.network.propagate(
                    depth, h, chunk, initial, generator=stack.generator
                )
            if on_chunk is not None:
                assert block is not None
                on_chunk(block, layer)
    for stack, out in zip(stacks, computed, strict=True):
        stack.h = out


@dataclass
class LayerwiseEvaluation:
    """A client's evaluation passes (``models.federated.GlasuClient``): every layer of every
    aligned node, chunk by chunk, with the samplers of ``sampling`` and the features
    ``feature_rows`` reads; scored at the output nodes against ``labels``."""

    partition: ClientPartition
    config: ClientConfig
    sampling: PassSampling
    feature_rows: Callable[[np.ndarray], torch.Tensor]
    labels: torch.Tensor
    held: torch.Tensor  # 1 where this client holds the node (count-aware sessions)
    device: torch.device

    def outcome(self, top: Stack, output_nodes: np.ndarray) -> PassOutcome:
        """The outcome of an evaluation pass from ``top``, a network's top layer of every node."""
        scores = self.score(top, output_nodes)
        return PassOutcome(
            kind="eval",
            loss=scores.loss,
            val_accuracy=scores.val_accuracy,
            test_accuracy=scores.test_accuracy,
            probabilities=scores.probabilities,
            test_metrics=scores.test_metrics,
        )

    def score(self, top: Stack, output_nodes: np.ndarray) -> EvaluationScores:
        """``top``'s network's predictions at the output nodes, scored."""
        nodes = torch.from_numpy(output_nodes).to(self.device)
        with torch.no_grad():
            logits = torch.cat([
                top.network.classify(top.h[nodes[span]], generator=top.generator)
                for span in chunk_rows(len(nodes), chunk=EVAL_CHUNK_NODES)
            ])  # fmt: skip
        return score_evaluation(logits, self.labels[nodes], output_nodes, self.partition)

    def all_nodes(self, network: ClientNetwork, generator: torch.Generator) -> Stack:
        """The input projection of every node by ``network`` (put in inference mode)."""
        network.eval()
        return project_all(
            network, generator, self.feature_rows,
            num_nodes=self.partition.num_nodes, device=self.device,
        )  # fmt: skip

    def layer_chunks(self, depth: int) -> Iterator[SampledLayer]:
        """Graph layer ``depth`` of an inference pass sampled over all nodes, chunk by chunk:
        the same sample in every inference pass of this model (``sampling_rng``)."""
        rng = sampling_rng(
            seed=self.config.seed, client=self.partition.client, pass_index=None, layer=depth
        )
        sampler = self.sampling.sampler(self.config.eval_fanout, depth)
        return sampler.sample_all(chunk=EVAL_CHUNK_NODES, rng=rng)

    def all_presence(self) -> torch.Tensor | None:
        """The presence column of every node (count-aware sessions only)."""
        if not self.config.count_aware:
            return None
        return self.held.to(self.device, torch.float32).unsqueeze(1)

    def all_rows(self) -> np.ndarray:
        """The node ids of the rows of a share over all nodes (in order: 0..N-1)."""
        return np.arange(self.partition.num_nodes, dtype=np.int64)


def combine_all(extracted: Extracted, own: torch.Tensor) -> torch.Tensor:
    """:func:`models.workset.combine` of every node, chunk by chunk, written over the others'
    part (which it returns): no temporary over all nodes."""
    combined = extracted.others
    count = extracted.count
    with torch.no_grad():
        for span in chunk_rows(len(own), chunk=EVAL_CHUNK_NODES):
            combined[span] = combine(
                combined[span],
                own[span],
                count=count[span] if isinstance(count, torch.Tensor) else count,
                presence=None if extracted.presence is None else extracted.presence[span],
            )
    return combined
