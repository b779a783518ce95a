"""Per-node accounting of a private run (design 3 of issue 29, docs/privacy.md 4.4): in how
many releases each node's row is, counted ahead of the run, and the noise that keeps the worst
node's releases within a budget.

A training pass's layer-1 release at party m holds the rows S_m[0] of its layer-1 sample: the
parties sample from the pass's output nodes down to layer 1, their layer-1 sets are joined (the
union the service returns), and party m's capped layer-1 draw from that union gives the rows
whose features enter its release. The count walks exactly the clients' own sampling
(``models.sampler.PassSampling.walk``) over the run's own partitions, schedule and
seeds, and never reads a feature value. Every evaluation pass releases every node (layer-wise
evaluation over all N). Nothing here is built into the service or the worker: their accounting
is per pass (``secure/accounting.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.inprocess import answer_in_step
from models.layout import layout_federation, session_schedule
from models.sampler import PassSampling
from secure.accounting import calibrate_noise_multiplier
from secure.aggregation import PlainSumAggregator
from secure.privacy import RELEASE_LAYER


@dataclass(frozen=True)
class NodeReleases:
    """Per party and node, the training passes whose layer-1 release holds the node's row;
    every evaluation pass holds every node."""

    train: np.ndarray  # (parties, nodes), int64
    train_passes: int
    eval_passes: int

    @property
    def total(self) -> int:
        """Releases of the run: what per-pass accounting calibrates for."""
        return self.train_passes + self.eval_passes

    @property
    def worst(self) -> int:
        """Releases that hold the worst node at the worst party: what per-node accounting
        calibrates for."""
        return int(self.train.max()) + self.eval_passes

    def train_stats(self) -> dict[str, float]:
        return {
            "mean": round(float(self.train.mean()), 2),
            "p99": float(np.percentile(self.train, 99)),
            "max": int(self.train.max()),
        }

    def noise_multiplier(self, *, epsilon: float, delta: float, accountant: str) -> float:
        """The z that keeps the worst node's releases within (``epsilon``, ``delta``) by
        ``accountant``, each release of the sensitivity of a per-pass release."""
        return calibrate_noise_multiplier(
            epsilon=epsilon, delta=delta, releases=self.worst, accountant=accountant
        )


def node_releases(config: TrainConfig, dataset: GraphDataset) -> NodeReleases:
    """The releases that hold each node's row in a private run of ``config`` on ``dataset``."""
    layout = layout_federation(config, dataset)
    client_config = layout.client_config
    if client_config.agg_layers != (RELEASE_LAYER,):
        raise ValueError("per-node accounting is for the private arrangement (one release at 1)")
    schedule = session_schedule(config, dataset)
    parts = layout.partitions
    samplings = [PassSampling(part, client_config) for part in parts]
    count = np.zeros((len(parts), dataset.num_nodes), dtype=np.int64)
    train_passes = [p for p in schedule.passes if p.kind == "train"]
    for spec in train_passes:
        output_nodes = schedule.output_nodes(spec.index)
        walks = [s.walk(spec.index, output_nodes, client_config.fanout) for s in samplings]
        for part, sampled in zip(parts, answer_in_step(walks, PlainSumAggregator()), strict=True):
            count[part.client, sampled[0].sources] += 1
    return NodeReleases(
        train=count,
        train_passes=len(train_passes),
        eval_passes=len(schedule.passes) - len(train_passes),
    )
