"""One client's part of the split GNN: an input projection of its feature block, L graph layers
and its own classifier head. Aggregation between layers happens outside (models/federated.py).

The ``sign`` backbone reads its feature block propagated K hops ahead of training
(models/data/propagation.py): its input projection is SIGN's per-hop one, its L layers read no
neighbour (models/layers/sign.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.config import (
    DEFAULT_HOPS,
    PRECOMPUTED_BACKBONES,
    BackboneName,
    FeatureScaleName,
)
from models.layers import (
    Block,
    FeatureScale,
    GATLayer,
    GCNIILayer,
    GCNLayer,
    HopProjection,
    SignLayer,
)


@dataclass(frozen=True)
class ModelConfig:
    backbone: BackboneName = "gcnii"
    layers: int = 4
    hidden: int = 128
    dropout: float = 0.5
    alpha: float = 0.1  # GCNII initial-residual weight
    theta: float = 0.5  # GCNII identity-mapping strength
    gat_heads: int = 8
    hops: int = DEFAULT_HOPS  # K of a precomputed backbone's propagation (sign)
    feature_scale: FeatureScaleName = "auto"  # of its propagated columns (sign)
    receiver_width: int = 0  # private arrangement: width of the others' noisy release

    @property
    def precomputed(self) -> bool:
        """The features are propagated before training; the layers read no neighbour."""
        return self.backbone in PRECOMPUTED_BACKBONES


def dropout(
    x: torch.Tensor, *, p: float, generator: torch.Generator, training: bool
) -> torch.Tensor:
    """Inverted dropout drawing from the client's own generator, so that a client's masks do not
    depend on how many other clients share its process."""
    if not training or p == 0.0:
        return x
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= p
    return x * keep / (1.0 - p)


class ClientNetwork(nn.Module):
    def __init__(self, *, in_features: int, num_classes: int, config: ModelConfig) -> None:
        super().__init__()
        if config.layers < 1:
            raise ValueError(f"layers must be >= 1, got {config.layers}")
        self.config = config
        # a precomputed backbone's columns scaled with its training table's statistics
        self.scale = FeatureScale(in_features * (config.hops + 1)) if config.precomputed else None
        self.input = self._input(in_features)
        self.convs = nn.ModuleList(self._layer(depth) for depth in range(1, config.layers + 1))
        # Maps the others' noisy release into the hidden space (private arrangement only).
        self.receiver = (
            nn.Linear(config.receiver_width, config.hidden) if config.receiver_width else None
        )
        self.classifier = nn.Linear(config.hidden, num_classes)
        nn.init.xavier_uniform_(self.classifier.weight)
        nn.init.zeros_(self.classifier.bias)

    def _input(self, in_features: int) -> nn.Module:
        """The input projection of ``in_features`` columns (of every hop, for sign)."""
        if self.config.precomputed:
            return HopProjection(in_features, self.config.hidden, hops=self.config.hops)
        linear = nn.Linear(in_features, self.config.hidden)
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
        return linear

    def _layer(self, depth: int) -> nn.Module:
        width = self.config.hidden
        match self.config.backbone:
            case "gcnii":
                return GCNIILayer(
                    width, depth=depth, alpha=self.config.alpha, theta=self.config.theta
                )
            case "gcn":
                return GCNLayer(width, width)
            case "gat":
                return GATLayer(width, width, heads=self.config.gat_heads)
            case "sign":
                return SignLayer(width, width)
        raise ValueError(f"unknown backbone {self.config.backbone!r}")

    @property
    def uses_initial_residual(self) -> bool:
        return self.config.backbone == "gcnii"

    def project(self, features: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        if self.scale is not None:
            features = self.scale(features)
        x = dropout(features, p=self.config.dropout, generator=generator, training=self.training)
        return torch.relu(self.input(x))

    def propagate(
        self,
        depth: int,
        h: torch.Tensor,
        block: Block,
        h0: torch.Tensor | None,
        *,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Graph layer ``depth`` (1-based) from its sources' rows to its targets' rows."""
        h = dropout(h, p=self.config.dropout, generator=generator, training=self.training)
        return self.convs[depth - 1](h, block, h0)

    def classify(self, h: torch.Tensor, *, generator: torch.Generator) -> torch.Tensor:
        h = dropout(h, p=self.config.dropout, generator=generator, training=self.training)
        return self.classifier(h)
