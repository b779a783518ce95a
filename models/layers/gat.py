"""GAT layer on a sampled block, through PyG's bipartite ``GATConv`` (self-loops are part of the
sampled block, so PyG adds none)."""

from __future__ import annotations

import torch
from torch import nn

from models.layers.block import Block


class GATLayer(nn.Module):
    def __init__(self, in_width: int, out_width: int, *, heads: int = 8) -> None:
        super().__init__()
        if out_width % heads:
            raise ValueError(f"GAT width {out_width} must be divisible by heads={heads}")
        # Imported here: torch_geometric.nn costs ~2 s of CPU at import (it loads torch._dynamo),
        # which every worker of a GCN or GCNII model would otherwise pay at start-up.
        from torch_geometric.nn import GATConv

        self.conv = GATConv(
            in_width, out_width // heads, heads=heads, add_self_loops=False, concat=True
        )

    def forward(
        self, h: torch.Tensor, block: Block, h0: torch.Tensor | None = None
    ) -> torch.Tensor:
        targets = h[block.target_positions]
        out = self.conv((h, targets), block.edge_index, size=(h.shape[0], block.num_targets))
        return torch.nn.functional.elu(out)
