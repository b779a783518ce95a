"""How one client samples the layers of a pass from its own graph: the walk a GLASU client takes
down the layers of a training pass (``models/federated.py``), and the samplers of its
evaluation passes (``models/layerwise.py``).

The walk is a generator, like the client's pass: at an aggregation layer below the top it asks
for the union of the clients' node sets (``secure.protocol.NodesRequest``) and is resumed with
it. Anything that needs to know which nodes a run samples (design 3's per-node accounting,
``models/node_releases.py``) drives this same walk.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph, sampling_rng
from secure.protocol import NodesRequest, check_union


class PassSampling:
    """Client ``partition.client``'s samplers: one per fanout (training and evaluation),
    capped by the occurrence cap (a DP assumption) at every layer up to the first aggregation
    layer; the layers above it are never released and sample freely."""

    def __init__(self, partition: ClientPartition, config: ClientConfig) -> None:
        self.partition = partition
        self.config = config
        graph = SamplingGraph.from_edge_index(partition.edge_index, num_nodes=partition.num_nodes)
        self._samplers = {
            (fanout, capped): NeighbourSampler(
                graph,
                fanout=fanout,
                occurrence_cap=config.occurrence_cap if capped else None,
            )
            for fanout in {config.fanout, config.eval_fanout}
            for capped in (False, True)
        }

    def sampler(self, fanout: int, depth: int) -> NeighbourSampler:
        """The sampler of graph layer ``depth``: capped up to the first aggregation layer."""
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
