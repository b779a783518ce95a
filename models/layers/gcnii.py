"""GCNII layer (Chen et al. 2020) on a sampled block, with initial residual and identity mapping:
ReLU(((1 - alpha) Â H + alpha H0) ((1 - beta) I + beta W)), beta = log(theta / depth + 1).

PyG's ``GCN2Conv`` needs a square adjacency; a sampled block is bipartite (targets x sources), so
the propagation is written out here with the same formula."""

from __future__ import annotations

import math

import torch
from torch import nn

from models.layers.block import Block


class GCNIILayer(nn.Module):
    def __init__(self, width: int, *, depth: int, alpha: float = 0.1, theta: float = 0.5) -> None:
        super().__init__()
        self.alpha = alpha
        self.beta = math.log(theta / depth + 1.0)
        self.weight = nn.Parameter(torch.empty(width, width))
        nn.init.xavier_uniform_(self.weight)

    def forward(
        self, h: torch.Tensor, block: Block, h0: torch.Tensor | None = None
    ) -> torch.Tensor:
        if h0 is None:
            raise ValueError("GCNII needs the initial representation h0 of the targets")
        support = (1 - self.alpha) * torch.sparse.mm(block.adjacency, h) + self.alpha * h0
        return torch.relu((1 - self.beta) * support + self.beta * (support @ self.weight))
