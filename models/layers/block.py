"""A sampled layer moved to the device once per pass, reused by every local step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.sampler import SampledLayer


@dataclass(frozen=True)
class Block:
    adjacency: torch.Tensor  # sparse (targets x sources), row-normalised, self-loops included
    edge_index: torch.Tensor  # (2, E) source position -> target position
    target_positions: torch.Tensor  # (targets,) position of each target among the sources
    num_targets: int

    @classmethod
    def from_sampled(cls, layer: SampledLayer, device: torch.device) -> Block:
        return cls(
            adjacency=layer.mean_adjacency(device),
            edge_index=layer.edge_index(device),
            target_positions=torch.from_numpy(layer.target_positions).long().to(device),
            num_targets=len(layer.targets),
        )

    def to(self, device: torch.device) -> Block:
        return Block(
            adjacency=self.adjacency.to(device),
            edge_index=self.edge_index.to(device),
            target_positions=self.target_positions.to(device),
            num_targets=self.num_targets,
        )
