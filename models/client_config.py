"""The settings every client of a federation shares: its model, sampling, optimiser, and which
layers meet at the service how often."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.backbone import ModelConfig


@dataclass(frozen=True)
class ClientConfig:
    """The settings every client of a federation shares."""

    model: ModelConfig = field(default_factory=ModelConfig)
    agg_layers: tuple[int, ...] = (2, 4)
    stale: int = 4
    cache_rounds: int = 1  # W: rounds whose statistics local steps reuse (CELU-VFL)
    instance_weighting: bool = False  # CELU-VFL's staleness weights for local steps
    weight_threshold: float = 0.5  # cos(xi): instances less similar than this get weight 0
    fanout: int = 3
    eval_fanout: int = 10
    occurrence_cap: int | None = None
    # Partly shared nodes (the union of the parties' nodes): each share carries a presence
    # column and the mean divides each row by the number of parties holding the node.
    count_aware: bool = False
    # GLASU Appendix B.2: only this client holds labels; the others learn from the gradient it
    # broadcasts for the top layer (None: every client holds the labels)
    label_holder: int | None = None
    lr: float = 0.01
    weight_decay: float = 5e-4
    seed: int = 0
    # the head's width when it must match a saved model (scoring); default: the labels'
    num_classes: int | None = None
    # a scoring session that shares the answering party's predictions (models/answer.py): the
    # width of its answer layer, L + 1 (None: not shared)
    shared_answer_width: int | None = None
    # values per part of a share (secure.protocol.part_rows): the session's, sized by the
    # service to its body limit (None: the protocol's default)
    part_values: int | None = None

    def __post_init__(self) -> None:
        layers = self.model.layers
        if not self.agg_layers or list(self.agg_layers) != sorted(set(self.agg_layers)):
            raise ValueError(f"agg_layers must be non-empty and ascending: {self.agg_layers}")
        if self.agg_layers[0] < 1 or self.agg_layers[-1] > layers:
            raise ValueError(f"agg_layers {self.agg_layers} must lie in 1..{layers}")
        if self.stale < 1:
            raise ValueError(f"stale (Q) must be >= 1, got {self.stale}")
        if self.cache_rounds < 1:
            raise ValueError(f"cache rounds (W) must be >= 1, got {self.cache_rounds}")
        if self.part_values is not None and self.part_values < 1:
            raise ValueError(f"a part holds one value at least, got {self.part_values}")
        if not -1.0 <= self.weight_threshold <= 1.0:
            raise ValueError(f"the weight threshold is a cosine, got {self.weight_threshold}")
        if self.model.hops < 0:
            raise ValueError(f"hops must be >= 0, got {self.model.hops}")
        # the private arrangement's model is the one with a receiver of the others' release;
        # a precomputed backbone has none (the private sign design trains locally)
        if self.model.precomputed and self.model.receiver_width > 0:
            raise ValueError(
                f"the {self.model.backbone} backbone reads the others' release as propagated "
                "features, not through a receiver layer (models/private_sign.py)"
            )


def uniform_agg_layers(*, layers: int, count: int) -> tuple[int, ...]:
    """K aggregation layers spread uniformly, always including the last: K=1 -> (L,),
    K=2 -> (L/2, L), K=L -> (1..L)."""
    if not 1 <= count <= layers:
        raise ValueError(f"agg-layers K must be between 1 and L={layers}, got {count}")
    return tuple(sorted({round(layers * (i + 1) / count) for i in range(count)}))
