"""The blocks of a layer-wise evaluation pass (models/chunk_blocks.py): a span of chunks' CSR
block over node-id columns, multiplied with the whole layer below, computes what each chunk's
sampled block computes on its gathered sources (the pass before these blocks); the chunks are
sampled ahead by a thread."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import models.chunk_blocks
from models.backbone import ClientNetwork, ModelConfig
from models.chunk_blocks import chunk_block, node_rows, sampled_ahead, span_block
from models.layers import Block
from models.layerwise import Stack, propagate_all
from models.sampler import IdentitySampler, NeighbourSampler, SampledLayer, SamplingGraph

CPU = torch.device("cpu")
NODES, WIDTH = 300, 8


def random_graph(seed: int = 0) -> SamplingGraph:
    rng = np.random.default_rng(seed)
    pairs = rng.integers(0, NODES, size=(4 * NODES, 2))
    edges = torch.from_numpy(np.concatenate([pairs, pairs[:, ::-1]]).T.copy())
    return SamplingGraph.from_edge_index(edges, num_nodes=NODES)


def gathered(depth: int, stack: Stack, layers: list[SampledLayer]) -> torch.Tensor:
    """The layer as the pass computed it before: each chunk's COO block (coalesced, columns the
    positions among its sources) on the gathered rows of its sources."""
    out = torch.zeros_like(stack.h)
    with torch.no_grad():
        for layer in layers:
            block = Block.from_sampled(layer, CPU)
            targets = torch.from_numpy(layer.targets)
            initial = stack.h0[targets] if stack.network.uses_initial_residual else None
            out[targets] = stack.network.propagate(
                depth, stack.h[torch.from_numpy(layer.sources)], block, initial,
                generator=stack.generator,
            )  # fmt: skip
    return out


@pytest.mark.parametrize("backbone", ["gcnii", "gcn", "gat", "sign"])
@pytest.mark.parametrize("cap", [None, 1])
@pytest.mark.parametrize("span_chunks", [1, 2, 8])
def test_a_layer_over_node_id_columns_equals_the_layer_on_gathered_sources(
    backbone: str, cap: int | None, span_chunks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backbone, consecutive chunks (no cap) and chunks of a random visiting order (the
    capped draw), in spans of one chunk, two (the last span shorter) and all five."""
    monkeypatch.setattr(models.chunk_blocks, "EVAL_SPAN_CHUNKS", span_chunks)
    torch.manual_seed(0)
    config = ModelConfig(backbone=backbone, layers=2, hidden=WIDTH, gat_heads=2, hops=0)
    network = ClientNetwork(in_features=WIDTH, num_classes=3, config=config).eval()
    h0, h = torch.rand(NODES, WIDTH), torch.rand(NODES, WIDTH)
    sampler = (
        IdentitySampler(NODES)
        if config.precomputed
        else NeighbourSampler(random_graph(), fanout=3, occurrence_cap=cap)
    )
    layers = list(sampler.sample_all(chunk=64, rng=np.random.default_rng(1)))
    stack = Stack(network, torch.Generator(), h0, h)
    expected = gathered(2, stack, layers)
    propagate_all(2, [stack], layers, device=CPU)
    torch.testing.assert_close(stack.h, expected, rtol=1e-5, atol=1e-6)
    assert stack.h.abs().sum() > 0


def test_a_chunk_block_is_the_sampled_mean_adjacency() -> None:
    """The same matrix as the sampled layer's COO mean adjacency, with either kind of column."""
    sampler = NeighbourSampler(random_graph(), fanout=4, occurrence_cap=2)
    layer = next(sampler.sample_all(chunk=50, rng=np.random.default_rng(3)))
    expected = layer.mean_adjacency(CPU).to_dense()
    local = chunk_block(layer, CPU)
    torch.testing.assert_close(local.adjacency.to_dense(), expected)
    assert torch.equal(local.target_positions, torch.from_numpy(layer.target_positions))
    over_all = span_block([layer], CPU, num_nodes=NODES)
    assert over_all.adjacency.shape == (len(layer.targets), NODES)
    sources = torch.from_numpy(layer.sources)
    torch.testing.assert_close(over_all.adjacency.to_dense()[:, sources], expected)
    outside = np.setdiff1d(np.arange(NODES), layer.sources)
    assert not over_all.adjacency.to_dense()[:, torch.from_numpy(outside)].any()


def test_a_span_block_stacks_its_chunks_rows_in_order() -> None:
    sampler = NeighbourSampler(random_graph(), fanout=4, occurrence_cap=1)
    first, second = itertools.islice(sampler.sample_all(chunk=40, rng=np.random.default_rng(5)), 2)
    span = span_block([first, second], CPU, num_nodes=NODES)
    alone = [span_block([layer], CPU, num_nodes=NODES) for layer in (first, second)]
    torch.testing.assert_close(
        span.adjacency.to_dense(), torch.cat([b.adjacency.to_dense() for b in alone])
    )
    assert span.target_positions.tolist() == [*first.targets, *second.targets]


@pytest.mark.parametrize(
    ("nodes", "view"),
    [([5, 6, 7, 8], True), ([2, 3, 7], False), ([0, 2, 1, 3], False), ([4], True)],
)
def test_consecutive_ascending_nodes_index_a_view_and_others_an_index(
    nodes: list[int], view: bool
) -> None:
    rows = node_rows(np.array(nodes), CPU)
    if view:
        assert rows == slice(nodes[0], nodes[-1] + 1)
    else:
        assert isinstance(rows, torch.Tensor) and rows.tolist() == nodes


def test_chunks_sampled_ahead_come_in_order_and_a_drawing_error_is_raised() -> None:
    assert list(sampled_ahead(iter(range(50)), ahead=2)) == list(range(50))

    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("no graph")

    with pytest.raises(ValueError, match="no graph"):
        list(sampled_ahead(failing()))
    assert not [t for t in threading.enumerate() if t.name == "glasu-sampling"]


def test_a_consumer_that_stops_early_stops_the_sampling_thread() -> None:
    drawn: list[int] = []

    def chunks() -> Iterator[int]:
        for i in range(1000):
            drawn.append(i)
            yield i

    ahead = sampled_ahead(chunks(), ahead=2)
    assert next(ahead) == 0
    ahead.close()  # returns once the thread has ended
    assert not [t for t in threading.enumerate() if t.name == "glasu-sampling"]
    assert len(drawn) <= 5  # the one used, two queued, at most one more and the one stopped
