import random

import numpy as np
import pytest
import torch

from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph, sampling_rng


def star_and_path() -> torch.Tensor:
    # node 0 is a hub linked to 1..9; 10-11-12 is a path
    pairs = [(0, i) for i in range(1, 10)] + [(10, 11), (11, 12)]
    return undirected(pairs)


def undirected(pairs: list[tuple[int, int]]) -> torch.Tensor:
    src = [a for a, b in pairs] + [b for a, b in pairs]
    dst = [b for a, b in pairs] + [a for a, b in pairs]
    return torch.tensor([src, dst])


def sampler(
    edge_index: torch.Tensor, *, num_nodes: int, fanout: int, occurrence_cap: int | None = None
) -> NeighbourSampler:
    graph = SamplingGraph.from_edge_index(edge_index, num_nodes=num_nodes)
    return NeighbourSampler(graph, fanout=fanout, occurrence_cap=occurrence_cap)


def rng(layer: int = 1, pass_index: int = 0) -> np.random.Generator:
    return sampling_rng(seed=0, client=0, pass_index=pass_index, layer=layer)


def test_fanout_is_a_hard_cap() -> None:
    sampler_ = sampler(star_and_path(), num_nodes=13, fanout=3)
    layer = sampler_.sample_layer(np.array([0, 11]), rng=rng())
    per_target = np.bincount(layer.edge_target, minlength=2) - 1  # minus the self-loop
    assert per_target.tolist() == [3, 2]
    assert set(layer.targets) <= set(layer.sources)
    assert (np.diff(layer.sources) > 0).all()  # sorted and unique


def test_occurrence_cap_limits_how_often_a_node_is_drawn(cora) -> None:
    sampler_ = sampler(cora.edge_index, num_nodes=cora.num_nodes, fanout=5, occurrence_cap=1)
    targets = np.arange(0, 2708, 3)
    layer = sampler_.sample_layer(targets, rng=rng())
    neighbour_edges = layer.edge_source[len(targets) :]  # after the self-loops
    assert np.bincount(neighbour_edges).max() <= 1


def test_union_remaps_columns_and_keeps_order() -> None:
    sampler_ = sampler(star_and_path(), num_nodes=13, fanout=2)
    layer = sampler_.sample_layer(np.array([11]), rng=rng())
    union = np.union1d(layer.sources, [0, 3, 12])
    moved = layer.with_sources(union)
    assert np.array_equal(moved.sources, union)
    assert np.array_equal(moved.sources[moved.edge_source], layer.sources[layer.edge_source])
    with pytest.raises(ValueError, match="does not contain"):
        layer.with_sources(np.array([0, 1]))


def test_sampling_is_seeded() -> None:
    sampler_ = sampler(star_and_path(), num_nodes=13, fanout=2)
    a = sampler_.sample_layer(np.array([0]), rng=rng(1))
    b = sampler_.sample_layer(np.array([0]), rng=rng(1))
    assert np.array_equal(a.sources, b.sources)


def test_mean_adjacency_rows_sum_to_one() -> None:
    sampler_ = sampler(star_and_path(), num_nodes=13, fanout=3)
    layer = sampler_.sample_layer(np.array([0, 10, 11]), rng=rng())
    dense = layer.mean_adjacency(torch.device("cpu")).to_dense()
    assert torch.allclose(dense.sum(dim=1), torch.ones(3))


# -- the vectorised draw against its guarantees and against the loop it replaced ---------------


def reference_sample(
    edge_index: torch.Tensor,
    targets: np.ndarray,
    *,
    fanout: int,
    occurrence_cap: int | None,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """The sampler before it was vectorised (a loop per target): its (target, drawn) pairs."""
    src, dst = edge_index.numpy()
    neighbours: dict[int, set[int]] = {}
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        if u != v:
            neighbours.setdefault(v, set()).add(u)
    drawn_by: dict[int, int] = {}
    pairs: list[tuple[int, int]] = []
    visit = list(range(len(targets)))
    rng.shuffle(visit)
    for position in visit:
        node = int(targets[position])
        pool = sorted(neighbours.get(node, set()))
        if occurrence_cap is not None:
            pool = [u for u in pool if drawn_by.get(u, 0) < occurrence_cap]
        chosen = pool if len(pool) <= fanout else rng.sample(pool, fanout)
        for u in chosen:
            drawn_by[u] = drawn_by.get(u, 0) + 1
            pairs.append((node, u))
    return pairs


def drawn_pairs(layer: SampledLayer) -> list[tuple[int, int]]:
    """(target, drawn neighbour) of every edge but the self-loops."""
    rows, cols = layer.edge_target[len(layer.targets) :], layer.edge_source[len(layer.targets) :]
    return list(zip(layer.targets[rows].tolist(), layer.sources[cols].tolist(), strict=True))


def hubs_and_spokes() -> tuple[torch.Tensor, int]:
    """Adversarial for the cap and uneven: hub 0 is shared by targets 1..8; target 1 has only the
    hub, targets 2..4 have the hub and four leaves each, 5..8 share a second hub 9 and node 10,
    and 10 is also a neighbour of 2 (a contested non-hub)."""
    pairs = [(0, t) for t in range(1, 9)]
    leaf = 11
    for target in (2, 3, 4):
        pairs += [(target, leaf + k) for k in range(4)]
        leaf += 4
    pairs += [(9, t) for t in range(5, 9)] + [(10, t) for t in range(5, 9)] + [(10, 2)]
    return undirected(pairs), leaf


def complete_bipartite(left: int, right: int) -> torch.Tensor:
    return undirected([(a, left + b) for a in range(left) for b in range(right)])


def check_layer(layer: SampledLayer, graph: SamplingGraph, *, fanout: int, cap: int | None) -> None:
    pairs = drawn_pairs(layer)
    assert len(set(pairs)) == len(pairs)  # distinct neighbours per target
    for target, node in pairs:
        assert node in graph.neighbours_of(target)  # only real neighbours
    per_target = np.bincount(layer.edge_target, minlength=len(layer.targets)) - 1
    degrees = np.diff(graph.indptr)[layer.targets]
    assert (per_target <= fanout).all()
    if cap is None:
        assert np.array_equal(per_target, np.minimum(degrees, fanout))
    else:
        times_drawn = np.bincount([node for _, node in pairs], minlength=graph.num_nodes)
        assert times_drawn.max(initial=0) <= cap  # the cap holds exactly
    assert np.array_equal(layer.sources[layer.target_positions], layer.targets)


@pytest.mark.parametrize("cap", [None, 0, 1, 2, 3])
@pytest.mark.parametrize("fanout", [0, 1, 2, 5])
@pytest.mark.parametrize("graph_name", ["star", "hubs", "bipartite", "cora"])
def test_draws_keep_the_fanout_and_the_cap_on_adversarial_graphs(
    graph_name: str, fanout: int, cap: int | None, cora
) -> None:
    if graph_name == "star":  # every leaf is a target and wants the hub
        edge_index, num_nodes, targets = (
            undirected([(0, i) for i in range(1, 30)]),
            30,
            np.arange(30),
        )
    elif graph_name == "hubs":
        edge_index, num_nodes = hubs_and_spokes()
        targets = np.arange(1, 9)
    elif graph_name == "bipartite":
        edge_index, num_nodes, targets = complete_bipartite(12, 7), 19, np.arange(12)
    else:
        edge_index, num_nodes, targets = cora.edge_index, cora.num_nodes, np.arange(0, 2708, 2)
    sampler_ = sampler(edge_index, num_nodes=num_nodes, fanout=fanout, occurrence_cap=cap)
    for draw in range(5):
        check_layer(
            sampler_.sample_layer(targets, rng=rng(pass_index=draw)),
            sampler_.graph,
            fanout=fanout,
            cap=cap,
        )


@pytest.mark.parametrize("cap", [1, 2, 3])
@pytest.mark.parametrize("fanout", [1, 2, 5])
def test_a_capped_draw_on_a_complete_bipartite_graph_fills_every_slot_it_can(
    fanout: int, cap: int
) -> None:
    # the serial draw is maximal: it stops only when all targets are full or all nodes are used
    sampler_ = sampler(complete_bipartite(12, 7), num_nodes=19, fanout=fanout, occurrence_cap=cap)
    layer = sampler_.sample_layer(np.arange(12), rng=rng())
    assert len(drawn_pairs(layer)) == min(12 * fanout, 7 * cap)


def test_the_graph_has_distinct_neighbours_without_self_loops_in_32_bits() -> None:
    edge_index = torch.tensor([[1, 1, 2, 0, 0, 3, 3], [0, 0, 0, 1, 2, 3, 0]])
    graph = SamplingGraph.from_edge_index(edge_index, num_nodes=5)
    assert graph.indptr.dtype == np.int32 and graph.neighbours.dtype == np.int32
    assert [graph.neighbours_of(v).tolist() for v in range(5)] == [[1, 2, 3], [0], [0], [], []]


def test_the_same_generator_state_draws_the_same_layer(cora) -> None:
    for cap in (None, 1):
        sampler_ = sampler(cora.edge_index, num_nodes=cora.num_nodes, fanout=3, occurrence_cap=cap)
        targets = np.arange(0, 2708, 5)
        a = sampler_.sample_layer(targets, rng=rng(2, pass_index=7))
        b = sampler_.sample_layer(targets, rng=rng(2, pass_index=7))
        c = sampler_.sample_layer(targets, rng=rng(2, pass_index=8))
        for field in ("targets", "sources", "edge_target", "edge_source"):
            assert np.array_equal(getattr(a, field), getattr(b, field))
        assert drawn_pairs(a) != drawn_pairs(c)


def test_inference_passes_share_one_stream_and_training_passes_do_not() -> None:
    def first(pass_index: int | None, layer: int = 1, client: int = 0) -> int:
        generator = sampling_rng(seed=0, client=client, pass_index=pass_index, layer=layer)
        return int(generator.integers(2**62))

    assert first(None) == first(None)
    draws = {first(None), first(0), first(1), first(0, layer=2), first(0, client=1)}
    assert len(draws) == 5


DRAWS = 3000


def inclusion_frequencies(pairs_per_draw: list[list[tuple[int, int]]]) -> dict:
    counts: dict[tuple[int, int], int] = {}
    for pairs in pairs_per_draw:
        for pair in pairs:
            counts[pair] = counts.get(pair, 0) + 1
    return {pair: count / len(pairs_per_draw) for pair, count in counts.items()}


def test_without_a_cap_each_neighbour_is_drawn_with_probability_fanout_over_degree() -> None:
    edge_index, num_nodes = hubs_and_spokes()
    fanout, targets = 3, np.arange(0, 11)
    sampler_ = sampler(edge_index, num_nodes=num_nodes, fanout=fanout)
    frequencies = inclusion_frequencies(
        [drawn_pairs(sampler_.sample_layer(targets, rng=rng(pass_index=d))) for d in range(DRAWS)]
    )
    graph = sampler_.graph
    for target in targets.tolist():
        neighbours = graph.neighbours_of(target).tolist()
        expected = min(1.0, fanout / max(len(neighbours), 1))
        for node in neighbours:
            assert frequencies.get((target, node), 0.0) == pytest.approx(expected, abs=0.04)


@pytest.mark.parametrize("cap", [None, 1, 2])
def test_inclusion_frequencies_match_the_loop_sampler(cap: int | None) -> None:
    edge_index, num_nodes = hubs_and_spokes()
    fanout, targets = 2, np.arange(0, 11)
    sampler_ = sampler(edge_index, num_nodes=num_nodes, fanout=fanout, occurrence_cap=cap)
    new = inclusion_frequencies(
        [drawn_pairs(sampler_.sample_layer(targets, rng=rng(pass_index=d))) for d in range(DRAWS)]
    )
    old = inclusion_frequencies(
        [
            reference_sample(
                edge_index, targets, fanout=fanout, occurrence_cap=cap, rng=random.Random(d)
            )
            for d in range(DRAWS)
        ]
    )
    assert set(new) == set(old)
    for pair in old:
        assert new[pair] == pytest.approx(old[pair], abs=0.05), pair


def test_a_contested_hub_goes_to_each_target_alike() -> None:
    # who gets a contested neighbour does not depend on ids: each of 6 leaves gets the hub 1/6
    sampler_ = sampler(undirected([(0, i) for i in range(1, 7)]), num_nodes=7, fanout=1,
                       occurrence_cap=1)  # fmt: skip
    frequencies = inclusion_frequencies(
        [
            drawn_pairs(sampler_.sample_layer(np.arange(1, 7), rng=rng(pass_index=d)))
            for d in range(DRAWS)
        ]
    )
    for leaf in range(1, 7):
        assert frequencies[(leaf, 0)] == pytest.approx(1 / 6, abs=0.03)
