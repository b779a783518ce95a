"""GCN layer on a sampled block: ReLU(Â H W), Â the row-normalised sampled adjacency."""

from __future__ import annotations

import torch
from torch import nn

from models.layers.block import Block


class GCNLayer(nn.Module):
    def __init__(self, in_width: int, out_width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_width, out_width)
        nn.init.xavier_uniform_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(
        self, h: torch.Tensor, block: Block, h0: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.relu(self.linear(torch.sparse.mm(block.adjacency, h)))
