"""Layer-wise inference over every aligned node: what an evaluation pass computes.

An evaluation pass exchanges no node sets (docs/protocol.md): every graph layer is computed for
all N aligned nodes, one chunk of targets at a time (``models.sampler.NeighbourSampler.
sample_all``), each chunk's sources read from the layer below, which is kept whole. What a pass
holds is therefore per chunk (a sampled block, the rows it gathers) plus a few N x width float32
arrays per network: the input projection h0 (GCNII's initial residual), the layer below and the
layer being computed, and at an aggregation layer the share and the others' part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from models.backbone import ClientNetwork
from models.layers import Block
from models.sampler import SampledLayer

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
    h0 = torch.empty(num_nodes, network.config.hidden, device=device)
    with torch.no_grad():
        for start in range(0, num_nodes, EVAL_CHUNK_NODES):
            nodes = np.arange(start, min(start + EVAL_CHUNK_NODES, num_nodes), dtype=np.int64)
            h0[start : start + len(nodes)] = network.project(rows(nodes), generator=generator)
    return Stack(network, generator, h0, h0)


#: Called with every chunk of a layer (its block on the device and its sampled structure).
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
    computed = [torch.empty_like(stack.h) for stack in stacks]
    with torch.no_grad():
        for layer in chunks:
            block = Block.from_sampled(layer, device)
            sources = torch.from_numpy(layer.sources).to(device)
            targets = torch.from_numpy(layer.targets).to(device)
            for stack, out in zip(stacks, computed, strict=True):
                network = stack.network
                initial = stack.h0[targets] if network.uses_initial_residual else None
                out[targets] = network.propagate(
                    depth, stack.h[sources], block, initial, generator=stack.generator
                )
            if on_chunk is not None:
                on_chunk(block, layer)
    for stack, out in zip(stacks, computed, strict=True):
        stack.h = out
