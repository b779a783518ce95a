"""The input scaling of a precomputed backbone's propagated features: ``(x - shift) * factor``
per column, the shift and factor measured once on the party's own table when it trains
(``models.data.propagation.scale_statistics``) and kept as buffers, so a saved model scores new
rows with its training's statistics, not with those of the table it scores."""

from __future__ import annotations

import torch
from torch import nn


class FeatureScale(nn.Module):
    """Per column ``(x - shift) * factor``; the identity until :meth:`set_statistics`."""

    shift: torch.Tensor
    factor: torch.Tensor

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("shift", torch.zeros(width))
        self.register_buffer("factor", torch.ones(width))

    def set_statistics(self, shift: torch.Tensor, factor: torch.Tensor) -> None:
        if shift.shape != self.shift.shape or factor.shape != self.factor.shape:
            raise ValueError(
                f"expected statistics of {self.shift.numel()} columns, "
                f"got {shift.numel()} and {factor.numel()}"
            )
        self.shift.copy_(shift)
        self.factor.copy_(factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.shift) * self.factor
