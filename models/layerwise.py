"""Layer-wise inference over every aligned node: what an evaluation pass computes.

An evaluation pass exchanges no node sets (docs/protocol.md): every graph layer is computed for
all N aligned nodes, one chunk of targets at a time (``models.sampler.NeighbourSampler.
sample_all``), each chunk's sources read from the layer below, which is kept whole. What a pass
holds in memory is therefore per span of a few chunks (their blocks, their rows): the few N x width
float32 arrays per network (the input projection h0, GCNII's initial residual; the layer below
and the layer being computed; at an aggregation layer the others' part) are
``models.node_arrays.node_array``s, mapped from a temporary file on the CPU, and every
operation over all nodes runs chunk by chunk.

How a chunk's block is built and when it is sampled (in spans of chunks, by a thread ahead of
the computation, the sources read in place): ``models/chunk_blocks.py``; bench/eval_speed.py
measures the pass against full-graph inference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from models.backbone import ClientNetwork
from models.chunk_blocks import GATHERING_BACKBONES, node_rows, sampled_ahead, spans
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.layers import Block
from models.node_arrays import chunk_rows, node_array
from models.outcome import EvaluationScores, PassOutcome, score_evaluation
from models.sampler import PassSampling, SampledLayer, sampling_rng
from models.workset import Extracted, combine

#: Targets per sampled chunk of a layer-wise layer (one draw of the sampler each: the sample
#: depends on it); a pass computes ``models.chunk_blocks.EVAL_SPAN_CHUNKS`` chunks at once.
EVAL_CHUNK_NODES = 4096


@dataclass
class Stack:
    """One network's representations of every node: the input projection and the current
    layer (both N x hidden); of a sampled pass, the top layer of its output ``nodes`` alone."""

    network: ClientNetwork
    generator: torch.Generator
    h0: torch.Tensor
    h: torch.Tensor
    nodes: np.ndarray | None = None  # the (sorted) node ids of h's rows; None: 0..N-1

    def rows_of(self, nodes: np.ndarray) -> np.ndarray:
        """Where ``nodes`` (among :attr:`nodes`) sit in ``h``."""
        return nodes if self.nodes is None else np.searchsorted(self.nodes, nodes)


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
    work = spans(
        chunks, num_nodes=len(stacks[0].h), device=device,
        span_block_needed=not all(gathers), chunk_blocks_needed=any(gathers) or bool(on_chunk),
    )  # fmt: skip
    with torch.no_grad():
        for span in sampled_ahead(work):
            for stack, out, gather in zip(stacks, computed, gathers, strict=True):
                if gather:
                    for layer, block in zip(span.layers, span.chunk_blocks, strict=True):
                        _propagate_gathered(depth, stack, out, layer, block, device)
                    continue
                assert span.block is not None
                initial = stack.h0[span.targets] if stack.network.uses_initial_residual else None
                out[span.targets] = stack.network.propagate(
                    depth, stack.h, span.block, initial, generator=stack.generator
                )
            if on_chunk is not None:
                for layer, block in zip(span.layers, span.chunk_blocks, strict=True):
                    on_chunk(block, layer)
    for stack, out in zip(stacks, computed, strict=True):
        stack.h = out


def _propagate_gathered(
    depth: int,
    stack: Stack,
    out: torch.Tensor,
    layer: SampledLayer,
    block: Block,
    device: torch.device,
) -> None:
    """Chunk ``layer`` of graph layer ``depth`` on its sources' rows, gathered."""
    targets = node_rows(layer.targets, device)
    initial = stack.h0[targets] if stack.network.uses_initial_residual else None
    sources = stack.h[torch.from_numpy(layer.sources).to(device)]
    out[targets] = stack.network.propagate(
        depth, sources, block, initial, generator=stack.generator
    )


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
        rows = torch.from_numpy(top.rows_of(output_nodes)).to(self.device)
        with torch.no_grad():
            logits = torch.cat([
                top.network.classify(top.h[rows[span]], generator=top.generator)
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
