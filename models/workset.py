"""The stale statistics that local steps reuse (CELU-VFL, ``../shared/papers/celu-vfl.txt``).

A GLASU round is one joint inference on a mini-batch (local step 0) and Q - 1 local steps that
reuse the others' parts of that inference instead of meeting again. CELU-VFL keeps the
statistics of the last W rounds in a *workset* and spreads the local steps over them round-robin
(the least recently used cached batch first, so no batch is reused within W - 1 steps), and it
weights each instance by how far its cached statistics have drifted: the cosine similarity
between the client's current local output for the instance and the one it had at the joint
inference, zero below a threshold cos(xi). W = 1 is GLASU's own stale updates (every local step
on the round's batch), with no weighting unless asked for.

Under differential privacy the cache holds only the others' noisy releases, already accounted
when they were summed: reusing them is post-processing and spends no budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from models.data.party import NO_LABEL
from models.layers import Block


@dataclass(frozen=True)
class Extracted:
    """What one joint aggregation leaves a client: the others' part ``H_{-m} = H - share / count``
    and how its own output enters the mean in the local steps that reuse it."""

    others: torch.Tensor
    count: int | torch.Tensor  # M, or per row (rows, 1): the parties that hold each node
    presence: torch.Tensor | None = None  # (rows, 1): 1 where this client holds the node

    def to(self, device: torch.device) -> Extracted:
        return Extracted(
            self.others.to(device),
            self.count.to(device) if isinstance(self.count, torch.Tensor) else self.count,
            None if self.presence is None else self.presence.to(device),
        )


def combine(
    stale_others: torch.Tensor,
    own: torch.Tensor,
    *,
    count: int | torch.Tensor,
    presence: torch.Tensor | None = None,
) -> torch.Tensor:
    """The aggregate as one client sees it in a local step: value ``stale_others + own / M``
    (per row ``own / count`` where nodes are partly shared, nothing where it lacks the node).

    The gradient reaches ``own`` as if its coefficient were 1, not 1/M: the true 1/M shrinks every
    client's gradient by M at each aggregation layer it crosses and collapses training
    (notes/calibration.md)."""
    if presence is not None:
        own = own * presence
    return stale_others + own.detach() / count + (own - own.detach())


@dataclass
class CachedBatch:
    """One joint inference: the batch's sampled structure, labels, the others' parts at each
    aggregation layer, and this client's own local output then (for the instance weights)."""

    blocks: Sequence[Block]
    input_nodes: torch.Tensor
    h0_rows: Sequence[torch.Tensor]
    labels: torch.Tensor
    # per aggregation layer, 1 where this client holds the node (count-aware sessions only)
    presence: dict[int, torch.Tensor] = field(default_factory=dict)
    others: dict[int, Extracted] = field(default_factory=dict)
    own_output: torch.Tensor | None = None
    # GLASU B.2: the label holder's gradient for the top-layer aggregate, per row (mean loss)
    gradient: torch.Tensor | None = None
    last_used: int = -1  # the local step that last used this batch

    def to(self, device: torch.device) -> CachedBatch:
        return CachedBatch(
            blocks=[block.to(device) for block in self.blocks],
            input_nodes=self.input_nodes.to(device),
            h0_rows=[rows.to(device) for rows in self.h0_rows],
            labels=self.labels.to(device),
            presence={depth: p.to(device) for depth, p in self.presence.items()},
            others={depth: e.to(device) for depth, e in self.others.items()},
            own_output=None if self.own_output is None else self.own_output.to(device),
            gradient=None if self.gradient is None else self.gradient.to(device),
            last_used=self.last_used,
        )


#: The classes a saved workset holds besides tensors: what ``torch.load(weights_only=True)`` must
#: be allowed to rebuild (``torch.serialization.safe_globals``).
STATE_CLASSES: tuple[type, ...] = (CachedBatch, Extracted, Block)


class Workset:
    """The last ``capacity`` rounds' statistics, handed out round-robin for local steps."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"the workset holds at least one round, got {capacity}")
        self.capacity = capacity
        self._batches: list[CachedBatch] = []
        self._step = 0

    def __len__(self) -> int:
        return len(self._batches)

    def add(self, batch: CachedBatch) -> None:
        """The newest round's statistics; the oldest round falls out beyond the capacity."""
        batch.last_used = self._step
        self._step += 1
        self._batches.append(batch)
        del self._batches[: -self.capacity]

    def next_batch(self) -> CachedBatch:
        """The least recently used batch (the oldest on ties): with W = 1 always the newest."""
        if not self._batches:
            raise RuntimeError("no round in the workset yet")
        batch = min(self._batches, key=lambda b: b.last_used)
        batch.last_used = self._step
        self._step += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The cached rounds and the step counter (their classes: :data:`STATE_CLASSES`)."""
        return {"capacity": self.capacity, "step": self._step, "batches": list(self._batches)}

    def load_state_dict(self, state: Mapping[str, Any], *, device: torch.device) -> None:
        """Put back a :meth:`state_dict` of a workset of the same capacity, on ``device``."""
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"the saved workset holds {state['capacity']} rounds, this one "
                f"{self.capacity} (--cache-rounds differs)"
            )
        batches = state["batches"]
        if not all(isinstance(batch, CachedBatch) for batch in batches):
            raise ValueError("the saved workset holds something other than batches")
        self._batches = [batch.to(device) for batch in batches]
        self._step = int(state["step"])


def instance_weights(
    current: torch.Tensor, cached: torch.Tensor, *, threshold: float
) -> torch.Tensor:
    """CELU-VFL's weight of each instance (row): cos(current row, cached row), or 0 where that
    is below ``threshold`` (cos xi). Computed without gradient."""
    with torch.no_grad():
        similarity = F.cosine_similarity(current, cached, dim=1, eps=1e-12)
        return torch.where(similarity >= threshold, similarity, torch.zeros_like(similarity))


def weighted_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None
) -> torch.Tensor:
    """The mean loss, or the weighted mean sum(w l) / sum(w) (zero if every weight is zero),
    over the instances with a label (a party of a union lacks the labels of others' nodes)."""
    labelled = labels != NO_LABEL
    if not labelled.all():
        logits, labels = logits[labelled], labels[labelled]
        weights = None if weights is None else weights[labelled]
        if labels.numel() == 0:
            return logits.sum() * 0.0  # nothing to learn from this batch
    if weights is None:
        return F.cross_entropy(logits, labels)
    per_instance = F.cross_entropy(logits, labels, reduction="none")
    return (weights * per_instance).sum() / weights.sum().clamp_min(1e-12)
