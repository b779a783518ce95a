"""Layer-wise neighbour sampling (GLASU Algorithm 2), one client's graph at a time.

Going down from the output nodes S[L], a layer with targets S[l] draws for every target at most
``fanout`` distinct neighbours from the client's own graph, uniformly without replacement (all
of them if it has fewer); its sources are S[l-1] = S[l] ∪ drawn. Node sets are sorted node ids,
so the service can form a union of the clients' sets that every client reads in the same order.

With ``occurrence_cap`` c, a node is drawn as a neighbour by at most c targets of one layer (the
differential-privacy sensitivity bound relies on this cap; see docs/privacy.md). The capped draw
is the serial one (targets visited in a uniformly random order, each drawing uniformly among the
neighbours not yet drawn c times), computed in vectorised rounds instead of a loop per target:
every candidate edge (target, neighbour) gets a priority (the target's visiting rank, then a
random key within the target), and a round accepts every edge that is among the ``fanout`` best
remaining edges of its target and among the best remaining ``c - drawn`` edges of its neighbour.
Greedy acceptance in priority order accepts exactly these, so the rounds reproduce the serial draw
and its distribution; the cap holds exactly, and who gets a contested neighbour depends only on
the random visiting order, never on node ids.

:class:`PassSampling` is one client's walk down the layers of a training pass (at an aggregation
layer below the top it asks for the union of the clients' node sets: a generator, like the
client's pass) and the samplers of its evaluation passes; anything that needs to know which
nodes a run samples (``models/node_releases.py``) drives this same walk. A backbone whose
propagation is precomputed (``sign``) samples no neighbour: its samplers are
:class:`IdentitySampler`s, whose blocks hold the targets alone (what fanout 0 would draw, without
building or reading the graph).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from secure.protocol import NodesRequest, check_union

if TYPE_CHECKING:  # annotations only: models.client_config imports this module (models.layers)
    from models.client_config import ClientConfig
    from models.data.partition import ClientPartition

#: Above this many nodes a sampled set is formed with a sort rather than a mask over all nodes.
_MASK_FRACTION = 64


@dataclass(frozen=True)
class SampledLayer:
    """One graph layer's bipartite block: rows ``targets``, columns ``sources``."""

    targets: np.ndarray  # sorted node ids, S[l]
    sources: np.ndarray  # sorted node ids, S[l-1] ⊇ S[l]
    edge_target: np.ndarray  # row position (into targets) of every edge, self-loops included
    edge_source: np.ndarray  # column position (into sources) of every edge

    @property
    def target_positions(self) -> np.ndarray:
        """Where each target sits among the sources."""
        return np.searchsorted(self.sources, self.targets)

    def mean_adjacency(self, device: torch.device) -> torch.Tensor:
        """Row-normalised (|targets| x |sources|) sparse matrix: each target averages itself and
        its drawn neighbours."""
        rows = torch.from_numpy(self.edge_target)
        cols = torch.from_numpy(self.edge_source)
        degree = torch.bincount(rows, minlength=len(self.targets)).float()
        values = 1.0 / degree[rows]
        adjacency = torch.sparse_coo_tensor(
            torch.stack([rows, cols]),
            values,
            (len(self.targets), len(self.sources)),
            check_invariants=False,
        )
        return adjacency.coalesce().to(device)

    def with_sources(self, union: np.ndarray) -> SampledLayer:
        """The same edges with the columns re-indexed into ``union`` ⊇ ``sources`` (the node set
        agreed at an aggregation layer)."""
        union = np.asarray(union, dtype=np.int64)
        nodes = self.sources[self.edge_source]
        columns = np.searchsorted(union, nodes)
        if columns.size and (columns.max() >= len(union) or (union[columns] != nodes).any()):
            raise ValueError("the agreed node set does not contain this client's sampled nodes")
        return SampledLayer(
            targets=self.targets, sources=union, edge_target=self.edge_target, edge_source=columns
        )

    def edge_index(self, device: torch.device) -> torch.Tensor:
        """(2, E) source-to-target edges for message-passing layers (row 0 sources)."""
        return torch.from_numpy(np.stack([self.edge_source, self.edge_target])).long().to(device)


class SamplingGraph:
    """One client's graph as a compressed adjacency (CSR): the neighbours of node v are
    ``neighbours[indptr[v]:indptr[v + 1]]``, sorted, distinct, self-loops dropped. Built once per
    partition and shared by all its samplers; node ids are 32-bit below 2^31 nodes, offsets
    32-bit below 2^31 adjacency entries."""

    def __init__(self, indptr: np.ndarray, neighbours: np.ndarray) -> None:
        self.indptr = indptr
        self.neighbours = neighbours
        self.num_nodes = len(indptr) - 1

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, *, num_nodes: int) -> SamplingGraph:
        """``edge_index`` holds both directions of every edge; the neighbours of v are every u
        with an edge u -> v."""
        src, dst = edge_index.numpy().astype(np.int64, copy=False)
        keep = src != dst
        pairs = np.sort(dst[keep] * num_nodes + src[keep])  # by (dst, src)
        pairs = pairs[np.diff(pairs, prepend=-1) != 0]  # distinct (np.unique hashes: slower)
        node_type = np.int32 if num_nodes < 2**31 else np.int64
        offset_type = np.int32 if len(pairs) < 2**31 else np.int64
        indptr = np.zeros(num_nodes + 1, dtype=offset_type)
        np.cumsum(np.bincount(pairs // max(num_nodes, 1), minlength=num_nodes), out=indptr[1:])
        return cls(indptr, (pairs % max(num_nodes, 1)).astype(node_type))

    def neighbours_of(self, node: int) -> np.ndarray:
        return self.neighbours[self.indptr[node] : self.indptr[node + 1]]

    def segments(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The adjacency entries of ``nodes``, concatenated in their order: for every entry the
        position (into ``nodes``) of the node it belongs to, and its index into ``neighbours``."""
        starts = self.indptr[nodes].astype(np.int64)
        lengths = self.indptr[nodes + 1] - starts
        owner = np.repeat(np.arange(len(nodes), dtype=np.int64), lengths)
        first = np.cumsum(lengths) - lengths
        return owner, np.arange(len(owner), dtype=np.int64) + (starts - first)[owner]


class NeighbourSampler:
    """Samples one client's graph (see the module docstring for the draw)."""

    def __init__(
        self, graph: SamplingGraph, *, fanout: int, occurrence_cap: int | None = None
    ) -> None:
        if fanout < 0:
            raise ValueError(f"fanout must be >= 0, got {fanout}")
        if occurrence_cap is not None and occurrence_cap < 0:
            raise ValueError(f"occurrence_cap must be >= 0, got {occurrence_cap}")
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.fanout = fanout
        self.occurrence_cap = occurrence_cap

    def sample_layer(self, targets: np.ndarray, *, rng: np.random.Generator) -> SampledLayer:
        """Draw the neighbours of ``targets`` (sorted, unique) for one layer."""
        targets = np.asarray(targets, dtype=np.int64)
        if self.occurrence_cap is None:
            rows, entries = self._draw(targets, rng)
        else:
            rows, entries = self._draw_capped(targets, self.occurrence_cap, rng)
        return self._layer(targets, rows, entries)

    def sample_all(self, *, chunk: int, rng: np.random.Generator) -> Iterator[SampledLayer]:
        """Every node of the graph as a target, in layers of at most ``chunk`` targets (an
        evaluation pass's layer-wise inference). Without a cap: consecutive id ranges. With a
        cap: ONE capped draw of all nodes, cut into chunks of one uniformly random visiting
        order, the occurrences counted across the chunks: the serial draw of the module
        docstring over all nodes, so the cap holds across the whole layer, and the extra memory
        is two integers per node besides the chunk's."""
        if chunk < 1:
            raise ValueError(f"a chunk holds at least one target, got {chunk}")
        if self.occurrence_cap is None:
            for start in range(0, self.num_nodes, chunk):
                targets = np.arange(start, min(start + chunk, self.num_nodes), dtype=np.int64)
                yield self.sample_layer(targets, rng=rng)
            return
        visit = rng.permutation(self.num_nodes)
        draw = _CappedDraw(self.num_nodes, self.occurrence_cap)
        for start in range(0, self.num_nodes, chunk):
            ordered = visit[start : start + chunk]
            order = np.argsort(ordered)
            position = np.empty_like(order)
            position[order] = np.arange(len(order))
            if self.fanout == 0 or self.occurrence_cap == 0:
                rows, entries = np.empty(0, np.int64), np.empty(0, np.int64)
            else:
                rows, entries = self._draw_in_order(ordered, draw, rng)
            yield self._layer(ordered[order], position[rows], entries)

    def _layer(self, targets: np.ndarray, rows: np.ndarray, entries: np.ndarray) -> SampledLayer:
        """The block of ``targets`` (sorted) with the drawn adjacency ``entries`` of the targets
        at positions ``rows``, self-loops added."""
        drawn = self.graph.neighbours[entries].astype(np.int64)
        sources, column_of = _union_with_positions(targets, drawn, self.num_nodes)
        self_rows = np.arange(len(targets), dtype=np.int64)
        return SampledLayer(
            targets=targets,
            sources=sources,
            edge_target=np.concatenate([self_rows, rows]),
            edge_source=np.concatenate([column_of(targets), column_of(drawn)]),
        )

    def _draw(self, targets: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Without a cap: every neighbour of a target with at most ``fanout`` of them, else a
        uniform ``fanout``-subset (Floyd's algorithm, one column at a time for all targets)."""
        indptr = self.graph.indptr
        degrees = (indptr[targets + 1] - indptr[targets]).astype(np.int64)
        few = degrees <= self.fanout
        owner, entries = self.graph.segments(targets[few])
        rows = [np.flatnonzero(few)[owner]]
        picks = [entries]
        many = np.flatnonzero(~few)
        if many.size:
            sizes = degrees[many]
            chosen = np.empty((len(many), self.fanout), dtype=np.int64)
            for column in range(self.fanout):
                last = sizes - self.fanout + column
                offset = rng.integers(0, last + 1)
                taken = (chosen[:, :column] == offset[:, None]).any(axis=1)
                chosen[:, column] = np.where(taken, last, offset)
            rows.append(np.repeat(many, self.fanout))
            picks.append((indptr[targets[many]].astype(np.int64)[:, None] + chosen).ravel())
        return np.concatenate(rows), np.concatenate(picks)

    def _draw_capped(
        self, targets: np.ndarray, cap: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The serial capped draw, in rounds of locally best edges (module docstring)."""
        if self.fanout == 0 or cap == 0 or not len(targets):
            return np.empty(0, np.int64), np.empty(0, np.int64)
        visit = rng.permutation(len(targets))  # visiting order: row positions
        ranks, entries = self._draw_in_order(targets[visit], _CappedDraw(self.num_nodes, cap), rng)
        return visit[ranks], entries

    def _draw_in_order(
        self, ordered: np.ndarray, draw: _CappedDraw, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The serial capped draw of ``ordered`` (targets in visiting order), each neighbour
        drawn at most ``draw.capacity`` more times (which it lowers): the visiting rank and the
        adjacency entry of every drawn edge, in priority order."""
        # candidate edges in priority order: by visiting rank, then a random key in the target
        owner, entries = self.graph.segments(ordered)
        degrees = np.bincount(owner, minlength=len(ordered))
        shuffle = np.flatnonzero(degrees[owner] > self.fanout)  # others take all: no order
        if shuffle.size:
            keys = owner[shuffle] << 32 | rng.integers(0, 2**32, len(shuffle), dtype=np.int64)
            entries[shuffle] = entries[shuffle[np.argsort(keys)]]
        nodes = self.graph.neighbours[entries]
        slots = np.full(len(ordered), self.fanout, dtype=np.int64)  # per visiting rank
        capacity = draw.capacity
        alive = np.flatnonzero(capacity[nodes] > 0)
        accepted = []
        while alive.size:
            ranks, alive_nodes = owner[alive], nodes[alive]
            run_start = np.flatnonzero(np.diff(ranks, prepend=-1))  # alive edges of one target
            run = np.repeat(run_start, np.diff(np.append(run_start, len(ranks))))
            take = np.arange(len(ranks)) - run < slots[ranks]
            take &= _first_per_node(alive_nodes, capacity, draw.best)
            accepted.append(alive[take])
            slots -= np.bincount(ranks[take], minlength=len(slots))
            np.subtract.at(capacity, alive_nodes[take], 1)
            alive = alive[~take & (slots[ranks] > 0) & (capacity[alive_nodes] > 0)]
        kept = np.concatenate(accepted) if accepted else np.empty(0, np.int64)
        kept.sort()  # priority order: the visiting order of the targets
        return owner[kept], entries[kept]


class IdentitySampler:
    """The sampler of a backbone whose propagation is precomputed: every layer's block is its
    targets, each with its self-loop alone (the block a fanout of 0 draws); no graph is read."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes

    def sample_layer(self, targets: np.ndarray, *, rng: np.random.Generator) -> SampledLayer:
        targets = np.asarray(targets, dtype=np.int64)
        positions = np.arange(len(targets), dtype=np.int64)
        return SampledLayer(
            targets=targets, sources=targets, edge_target=positions, edge_source=positions
        )

    def sample_all(self, *, chunk: int, rng: np.random.Generator) -> Iterator[SampledLayer]:
        """Every node as a target, ``chunk`` consecutive ids at a time."""
        if chunk < 1:
            raise ValueError(f"a chunk holds at least one target, got {chunk}")
        for span in range(0, self.num_nodes, chunk):
            targets = np.arange(span, min(span + chunk, self.num_nodes), dtype=np.int64)
            yield self.sample_layer(targets, rng=rng)


class _CappedDraw:
    """What a capped draw carries from chunk to chunk: how many more times each node may be
    drawn, and ``_first_per_node``'s scratch array."""

    def __init__(self, num_nodes: int, cap: int) -> None:
        self.capacity = np.full(num_nodes, cap, dtype=np.int64)
        self.best = np.full(num_nodes, np.iinfo(np.int64).max, dtype=np.int64)


def _first_per_node(nodes: np.ndarray, capacity: np.ndarray, best: np.ndarray) -> np.ndarray:
    """Which entries are among the first ``capacity[node]`` entries of their node (entries in
    priority order). ``best`` is a scratch array over all nodes, all at its maximum, and left so."""
    first = np.zeros(len(nodes), dtype=bool)
    pending = np.arange(len(nodes), dtype=np.int64)
    level = 0
    while pending.size:
        pending = pending[capacity[nodes[pending]] > level]
        pending_nodes = nodes[pending]
        np.minimum.at(best, pending_nodes, pending)
        hit = best[pending_nodes] == pending
        best[pending_nodes] = np.iinfo(np.int64).max
        first[pending[hit]] = True
        pending = pending[~hit]
        level += 1
    return first


def _union_with_positions(
    targets: np.ndarray, drawn: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """The sorted union of ``targets`` and ``drawn``, and a function from node ids in it to their
    positions: a mask over all nodes when the union is a fair part of the graph, a sort else."""
    if (len(targets) + len(drawn)) * _MASK_FRACTION < num_nodes:
        union = np.sort(np.concatenate([targets, drawn]))
        union = union[np.diff(union, prepend=-1) != 0]  # np.unique hashes: far slower here
        return union, lambda nodes: np.searchsorted(union, nodes)
    present = np.zeros(num_nodes, dtype=bool)
    present[targets] = True
    present[drawn] = True
    union = np.flatnonzero(present)
    position = np.empty(num_nodes, dtype=np.int64)
    position[union] = np.arange(len(union), dtype=np.int64)
    return union, lambda nodes: position[nodes]


#: The stream of inference passes (evaluation, scoring): not a pass index.
INFERENCE_STREAM = 0x1EFE_1EFE


def sampling_rng(
    *, seed: int, client: int, pass_index: int | None, layer: int
) -> np.random.Generator:
    """The generator for one (client, pass, layer): reproducible and independent across them.
    ``pass_index=None``: the one stream of inference passes, so that a model scores the same
    output nodes the same way in any pass (a scoring session reproduces an evaluation pass)."""
    entropy = [seed, client, layer, INFERENCE_STREAM] if pass_index is None else [
        seed, client, pass_index, layer
    ]  # fmt: skip
    return np.random.default_rng(np.random.SeedSequence(entropy))


class PassSampling:
    """Client ``partition.client``'s samplers: one per fanout (training and evaluation),
    capped by the occurrence cap (a DP assumption) at every layer up to the first aggregation
    layer; the layers above it are never released and sample freely. A precomputed backbone's:
    one :class:`IdentitySampler` for every layer and fanout."""

    def __init__(self, partition: ClientPartition, config: ClientConfig) -> None:
        from models.data.derived import sampling_graph

        self.partition = partition
        self.config = config
        self._identity = IdentitySampler(partition.num_nodes) if config.model.precomputed else None
        if self._identity is not None:
            self._samplers: dict[tuple[int, bool], NeighbourSampler] = {}
            return
        graph = sampling_graph(partition)  # built once per loaded partition
        self._samplers = {
            (fanout, capped): NeighbourSampler(
                graph,
                fanout=fanout,
                occurrence_cap=config.occurrence_cap if capped else None,
            )
            for fanout in {config.fanout, config.eval_fanout}
            for capped in (False, True)
        }

    def sampler(self, fanout: int, depth: int) -> NeighbourSampler | IdentitySampler:
        """The sampler of graph layer ``depth``: capped up to the first aggregation layer."""
        if self._identity is not None:
            return self._identity
        return self._samplers[(fanout, depth <= self.config.agg_layers[0])]

    def walk(
        self, pass_index: int, output_nodes: np.ndarray, fanout: int
    ) -> Generator[NodesRequest, np.ndarray, list[SampledLayer]]:
        """Top-down: sample each layer's sources from its targets; at an aggregation layer below
        the top, replace the client's own set by the union agreed with the others. The layers
        bottom-up (layer 1 first)."""
        config, partition = self.config, self.partition
        sampled: list[SampledLayer] = []
        targets = output_nodes
        for depth in range(config.model.layers, 0, -1):
            rng = sampling_rng(
                seed=config.seed, client=partition.client, pass_index=pass_index, layer=depth
            )
            layer = self.sampler(fanout, depth).sample_layer(targets, rng=rng)
            if depth - 1 in config.agg_layers:
                union = yield NodesRequest(layer=depth - 1, nodes=layer.sources)
                union = check_union(
                    union, own=layer.sources, num_nodes=partition.num_nodes, layer=depth - 1
                )
                layer = layer.with_sources(union)
            sampled.append(layer)
            targets = layer.sources
        sampled.reverse()
        return sampled
