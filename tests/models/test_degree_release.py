"""The degree-normalised release (docs/privacy.md 3.7), brute-forced: on small random and
adversarial graphs sampled by the product's capped sampler, one node's features are changed
arbitrarily and the release is computed again exactly; the L2 distance never exceeds
``secure.dp.degree_normalised_sensitivity`` and reaches it on a graph built to (a star whose hub
sits at the occurrence cap). Dropping the floor or the cap breaks the bound."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

import models.private as private
from models.config import TrainConfig
from models.layers.block import Block
from models.private import REPRODUCIBLE_NOISE_ENV, degree_normalised_aggregate
from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph, sampling_rng
from secure.dp import clip_rows, degree_normalised_sensitivity
from tests.models.test_private import PRIVATE, record_sends, with_node_changed

IN_FEATURES, WIDTH = 8, 16
CLIP = 0.25  # below the projected rows' norms (about 1), so the own-row clip binds
FANOUT = 3  # a target sums at most 4 rows: the default floor 4 normalises every full one


def undirected(pairs: list[tuple[int, int]], num_nodes: int) -> SamplingGraph:
    src = [a for a, b in pairs] + [b for a, b in pairs]
    dst = [b for a, b in pairs] + [a for a, b in pairs]
    return SamplingGraph.from_edge_index(torch.tensor([src, dst]), num_nodes=num_nodes)


def star(leaves: int) -> tuple[SamplingGraph, int]:
    return undirected([(0, i) for i in range(1, leaves + 1)], leaves + 1), leaves + 1


def clique(n: int) -> tuple[SamplingGraph, int]:
    return undirected([(a, b) for a in range(n) for b in range(a + 1, n)], n), n


def stars_sharing_leaves(hubs: int, leaves: int) -> tuple[SamplingGraph, int]:
    """Complete bipartite: every leaf sees every hub, so every hub is contested."""
    n = hubs + leaves
    return undirected([(h, hubs + i) for h in range(hubs) for i in range(leaves)], n), n


def random_graph(n: int, p: float, seed: int) -> tuple[SamplingGraph, int]:
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < p]
    return undirected(pairs or [(0, 1)], n), n


GRAPHS: dict[str, Callable[[], tuple[SamplingGraph, int]]] = {
    "star": lambda: star(12),
    "clique": lambda: clique(9),
    "bipartite": lambda: stars_sharing_leaves(3, 10),
    "sparse": lambda: random_graph(24, 0.08, seed=1),
    "dense": lambda: random_graph(16, 0.5, seed=2),
}


def sample(graph: SamplingGraph, n: int, *, cap: int | None, seed: int) -> SampledLayer:
    """One layer-1 sample over every node (an evaluation pass's release)."""
    sampler = NeighbourSampler(graph, fanout=FANOUT, occurrence_cap=cap)
    rng = sampling_rng(seed=seed, client=0, pass_index=0, layer=1)
    return sampler.sample_layer(np.arange(n), rng=rng)


def release(
    features: np.ndarray,
    layer: SampledLayer,
    block: Block,
    projection: torch.Tensor,
    *,
    floor: int,
) -> np.ndarray:
    """The clean release as a worker computes it: rows normalised and projected (row-wise, as
    ``PrivateArrangement.release_map``), degree-normalised, then the final clip of the send."""
    rows = torch.from_numpy(features[layer.sources]).float()
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    aggregate = degree_normalised_aggregate(block, rows @ projection, clip=CLIP, degree_floor=floor)
    return clip_rows(aggregate.double().numpy(), clip=CLIP)


def replacements(features: np.ndarray, v: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """What node ``v``'s row is replaced by: its negation, a large random row, a one-hot row and
    the zero row."""
    return (
        -features[v],
        rng.normal(size=IN_FEATURES) * 10,
        np.eye(IN_FEATURES)[v % IN_FEATURES],
        np.zeros(IN_FEATURES),
    )


def worst_ratio(*, cap: int | None, floor: int, bound_cap: int, bound_floor: int) -> float:
    """The largest distance over the bound, over every graph, sample seed, changed node and
    change (the node's row negated, a random one, a one-hot one, the zero row)."""
    bound = degree_normalised_sensitivity(
        clip=CLIP, occurrence_cap=bound_cap, degree_floor=bound_floor
    )
    rng = np.random.default_rng(0)
    projection = torch.randn(IN_FEATURES, WIDTH, generator=torch.Generator().manual_seed(0))
    projection /= WIDTH**0.5
    worst = 0.0
    for build in GRAPHS.values():
        graph, n = build()
        for seed in range(2):
            layer = sample(graph, n, cap=cap, seed=seed)
            block = Block.from_sampled(layer, torch.device("cpu"))
            features = rng.normal(size=(n, IN_FEATURES))
            base = release(features, layer, block, projection, floor=floor)
            for v in range(n):
                for changed in replacements(features, v, rng):
                    other = features.copy()
                    other[v] = changed
                    after = release(other, layer, block, projection, floor=floor)
                    worst = max(worst, float(np.linalg.norm(after - base)) / bound)
    return worst


@pytest.mark.parametrize(("cap", "floor"), [(1, 4), (2, 4), (3, 8), (3, 2), (1, 1)])
def test_one_node_never_moves_the_release_by_more_than_delta(cap: int, floor: int) -> None:
    worst = worst_ratio(cap=cap, floor=floor, bound_cap=cap, bound_floor=floor)
    # float32 aggregate: the bound holds to float32 rounding
    assert worst <= 1 + 1e-6, worst
    if floor >= FANOUT + 1:
        # every row sums at most fanout + 1 <= d_min rows, and the star's hub is drawn by
        # exactly `cap` leaves: negating its features moves cap + 1 rows by 2C / d_min each
        assert worst >= 0.999, worst
    else:
        # the hub's own row sums 4 > d_min rows: it moves by less (not tight, still bounded)
        assert worst > 0.3, worst


def test_without_the_floor_the_bound_fails() -> None:
    """A release that divides by the degree alone (floor 1) exceeds the floor-4 bound: a node
    that drew no neighbour releases its own clipped row, which moves by 2C."""
    assert worst_ratio(cap=1, floor=1, bound_cap=1, bound_floor=4) > 1.5


def test_without_the_cap_the_bound_fails() -> None:
    """A sampler without the occurrence cap lets the star's hub into every leaf's row."""
    assert worst_ratio(cap=None, floor=4, bound_cap=1, bound_floor=4) > 1.5


def test_rows_sum_over_the_neighbourhood_divided_by_the_floored_degree() -> None:
    # target 0 sums itself and 1, 2 (degree 3, floor 4); target 1 itself only
    layer = SampledLayer(
        targets=np.array([0, 1]),
        sources=np.array([0, 1, 2]),
        edge_target=np.array([0, 1, 0, 0]),
        edge_source=np.array([0, 1, 1, 2]),
    )
    rows = torch.tensor([[3.0, 0.0], [0.0, 0.5], [0.0, -0.2]])
    out = degree_normalised_aggregate(
        Block.from_sampled(layer, torch.device("cpu")), rows, clip=1.0, degree_floor=4
    )
    # row 0 clipped to norm 1 first, the others under the clip and kept
    assert out.numpy() == pytest.approx(np.array([[1.0 / 4, 0.3 / 4], [0.0, 0.5 / 4]]))
    out = degree_normalised_aggregate(
        Block.from_sampled(layer, torch.device("cpu")), rows, clip=1.0, degree_floor=1
    )
    assert out.numpy() == pytest.approx(np.array([[1.0 / 3, 0.3 / 3], [0.0, 0.5]]))


@pytest.mark.slow
def test_a_private_run_releases_degree_normalised_rows_within_delta(monkeypatch, cora) -> None:
    """In process, end to end: a degree-normalised run's releases move by at most its Delta
    (four times below clip-after's at the default floor) when one node's features change."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["degree_floor"])
        return degree_normalised_aggregate(*args, **kwargs)

    monkeypatch.setattr(private, "degree_normalised_aggregate", counted)
    config = TrainConfig(**{**PRIVATE, "release": "degree-normalised", "rounds": 2})
    node = int(cora.train_nodes[0])
    before = record_sends(monkeypatch, cora, config)
    after = record_sends(monkeypatch, with_node_changed(cora, node=node, client=0, seed=0), config)
    delta = degree_normalised_sensitivity(
        clip=config.clip, occurrence_cap=config.occurrence_cap, degree_floor=config.degree_floor
    )
    moved = [
        float(np.linalg.norm(a - b))
        for (kind, _, a), (_, _, b) in zip(before[0], after[0], strict=True)
        if kind == "share"
    ]
    assert 0 < max(moved) <= delta + 1e-4, (moved, delta)
    assert calls and set(calls) == {config.degree_floor}  # every release, the session's floor
