"""The ``sign`` backbone's layers (SIGN, Frasca et al. 2020; SGC, Wu et al. 2019): a network over
features propagated K hops ahead of training (``models/data/propagation.py``), so no layer reads
a neighbour.

- :class:`HopProjection`, the input projection: one linear map per hop, ReLU, and a linear
  combination of the hops' (K + 1) hidden rows into one (SIGN's inception layer);
- :class:`SignLayer`, each of the L layers: ReLU(W h) of the block's targets' rows. Its block
  holds the targets alone (``models.sampler.IdentitySampler``), or, where another party's
  sampled sources widened the set agreed at an aggregation layer, the targets among them.
"""

from __future__ import annotations

import torch
from torch import nn

from models.layers.block import Block
from models.layers.gcn import GCNLayer


class HopProjection(nn.Module):
    """(n, (K + 1) d) rows, the hops side by side, to (n, width): per hop ReLU(x_k W_k + b_k),
    then one linear map of the hops' rows side by side."""

    def __init__(self, in_width: int, out_width: int, *, hops: int) -> None:
        super().__init__()
        self.in_width = in_width
        self.per_hop = nn.Parameter(torch.empty(hops + 1, in_width, out_width))
        for weight in self.per_hop:
            nn.init.xavier_uniform_(weight)
        self.per_hop_bias = nn.Parameter(torch.zeros(hops + 1, out_width))
        self.combine = nn.Linear((hops + 1) * out_width, out_width)
        nn.init.xavier_uniform_(self.combine.weight)
        nn.init.zeros_(self.combine.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hops, width = self.per_hop.shape[0], self.in_width
        if x.shape[1] != hops * width:
            raise ValueError(
                f"expected {hops} hops of {width} features ({hops * width} columns), "
                f"got {x.shape[1]}"
            )
        per_hop = torch.einsum("nkd,kdh->nkh", x.reshape(-1, hops, width), self.per_hop)
        per_hop = torch.relu(per_hop + self.per_hop_bias)
        return self.combine(per_hop.reshape(x.shape[0], -1))


class SignLayer(GCNLayer):
    """ReLU(h W + b) of the block's targets: a layer of the MLP over the propagated features
    (GCN's layer without its neighbours)."""

    def forward(
        self, h: torch.Tensor, block: Block, h0: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.relu(self.linear(h[block.target_positions]))
