"""What a client computes at its aggregation layers, and what it shares there: its arrangement.

A :class:`models.federated.GlasuClient` runs the steps of a pass (sampling, local steps, GLASU
B.2's gradient broadcast); its arrangement says how the layers of its network meet the others'
through the joint aggregation (``models/joint.py``):

- :class:`GlasuArrangement`, GLASU itself: at every aggregation layer the client shares its
  layer's representation and goes on with the mean of all clients';
- ``models.private.PrivateArrangement``: the one differentially private release of a fixed map
  of the features at layer 1, and a party-alone reference trained beside it.

How a share leaves the client (as it is, noised, masked) is the joint aggregation's release
policy (``models/release.py``), not the arrangement's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from models.layerwise import Stack, combine_all, propagate_all
from models.outcome import PassOutcome
from models.release import PassContext
from models.workset import CachedBatch, combine
from secure.protocol import Request, Response

if TYPE_CHECKING:
    from models.federated import GlasuClient


class Arrangement(ABC):
    """The aggregation layers of ``client``'s network: its forward pass, its inference over all
    nodes, and what it keeps besides the client's state."""

    #: What the client's ``state_dict`` says it is; a state of another arrangement is refused.
    name: ClassVar[str]

    def __init__(self, client: GlasuClient) -> None:
        self.client = client

    @property
    def gradient_layer(self) -> int | None:
        """The wire layer of GLASU B.2's broadcast gradient, or None (none is sent)."""
        return None

    @abstractmethod
    def forward(
        self, context: PassContext, batch: CachedBatch, *, grad: bool
    ) -> Generator[Request, Response, torch.Tensor]:
        """All L layers of the network on ``batch``: its top layer. An aggregation layer whose
        others' part is not yet in ``batch.others`` is exchanged (the joint inference)."""

    @abstractmethod
    def after_step(self, batch: CachedBatch) -> None:
        """Called after every local step with the batch it used."""

    @abstractmethod
    def infer_all(self, context: PassContext) -> Generator[Request, Response, list[Stack]]:
        """Every layer of every aligned node (an evaluation pass): the top layers, this
        client's network's first."""

    def infer_batch(
        self, context: PassContext, batch: CachedBatch
    ) -> Generator[Request, Response, list[Stack]]:
        """A sampled evaluation pass (``ClientConfig.sampled_eval``): the top layer of
        ``batch``'s output nodes, of the networks :meth:`infer_all` infers, by the forward pass
        of a training pass (its exchanges) in inference mode."""
        client = self.client
        client.network.eval()
        h = yield from self.forward(context, batch, grad=False)
        return [Stack(client.network, client.generator, h, h, nodes=context.output_nodes)]

    def outcome(self, tops: Sequence[Stack], output_nodes: np.ndarray) -> PassOutcome:
        """The outcome of an evaluation pass from the top layers :meth:`infer_all` (or
        :meth:`infer_batch`) computed."""
        return self.client.evaluation.outcome(tops[0], output_nodes)

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What the arrangement adds to the client's ``state_dict``."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`state_dict` added."""


def batch_rows(batch: CachedBatch, depth: int) -> np.ndarray:
    """The node ids of the rows of graph layer ``depth`` of ``batch`` (its targets)."""
    return batch.input_nodes[batch.h0_rows[depth - 1]].cpu().numpy().astype(np.int64)


class GlasuArrangement(Arrangement):
    """GLASU: the representation of every aggregation layer is shared, and each client goes on
    with the mean of all clients' (``models.workset.combine``)."""

    name = "glasu"

    def __init__(self, client: GlasuClient) -> None:
        super().__init__(client)
        layers, agg_layers = client.layers, client.config.agg_layers
        if self.gradient_layer is not None and layers not in agg_layers:
            raise ValueError(
                f"a single label holder needs aggregation at the top layer L={layers} "
                f"(GLASU B.2), got aggregation layers {agg_layers}"
            )

    @property
    def gradient_layer(self) -> int | None:
        """The wire layer L + 1 of GLASU B.2's broadcast gradient when one client holds the
        labels, or None."""
        client = self.client
        return None if client.config.label_holder is None else client.layers + 1

    def forward(
        self, context: PassContext, batch: CachedBatch, *, grad: bool
    ) -> Generator[Request, Response, torch.Tensor]:
        """At an aggregation layer whose "all but me" part is already in ``batch.others`` (a
        local step), combine locally; otherwise this is the joint inference: upload the share,
        download the sum and extract the others' part into ``batch.others``.

        Grad mode is set per synchronous stretch, never held across a ``yield``: other clients'
        code runs while this generator is suspended."""
        client = self.client
        network, generator = client.network, client.generator
        others = batch.others
        with torch.set_grad_enabled(grad):
            h0 = network.project(client.feature_rows(batch.input_nodes), generator=generator)
        h = h0
        for depth, block in enumerate(batch.blocks, start=1):
            with torch.set_grad_enabled(grad):
                initial = h0[batch.h0_rows[depth - 1]] if network.uses_initial_residual else None
                h = network.propagate(depth, h, block, initial, generator=generator)
            if depth not in client.config.agg_layers:
                continue
            if depth not in others:
                others[depth] = yield from client.joint.aggregate(
                    context, depth, h, rows=batch_rows(batch, depth),
                    presence=batch.presence.get(depth),
                )  # fmt: skip
            with torch.set_grad_enabled(grad):
                stale = others[depth]
                h = combine(stale.others, h, count=stale.count, presence=stale.presence)
        return h

    def after_step(self, batch: CachedBatch) -> None:
        """Nothing trains beside the network."""

    def state_dict(self) -> dict[str, Any]:
        """Nothing besides the client's own state."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to put back."""

    def infer_all(self, context: PassContext) -> Generator[Request, Response, list[Stack]]:
        """The aggregation layers' shares over all nodes in order (rows 0..N-1, sent in parts):
        the top layer of this client's network."""
        client = self.client
        evaluation = client.evaluation
        stack = evaluation.all_nodes(client.network, client.generator)
        presence = evaluation.all_presence()
        for depth in range(1, client.layers + 1):
            propagate_all(depth, [stack], evaluation.layer_chunks(depth), device=client.device)
            if depth not in client.config.agg_layers:
                continue
            extracted = yield from client.joint.aggregate(
                context, depth, stack.h, rows=evaluation.all_rows(), presence=presence
            )
            stack.h = combine_all(extracted, stack.h)
        return [stack]
