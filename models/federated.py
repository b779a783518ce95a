"""The GLASU client, written without I/O.

:meth:`GlasuClient.run_pass` is a generator: it yields a :class:`NodesRequest` when it needs the
union of the clients' node sets at an aggregation layer of a training pass, and an
:class:`EmbeddingRequest` when it uploads a part of its share of an aggregation layer (a share
travels in ``secure.protocol.part_count`` parts); it is resumed with the answer (the union, or the
summed part and how many shares it holds). An evaluation pass asks for no node set: it computes
every layer over all aligned nodes (``models/layerwise.py``). These are the wire messages of
``secure/protocol.py``. The in-process trainer answers all clients' requests with function
calls; the HTTP worker answers its one client's requests through the service. Both run exactly
this code.

One class: the steps of a training pass (sampling, the joint
aggregation in parts, the local steps, GLASU B.2's gradient broadcast) share the client's model,
generators and workset. Its settings (``models/client_config.py``), its stale statistics
(``models/workset.py``), its joint aggregation in parts (``models/joint.py``), its evaluation
passes (``models/layerwise.py``) and their scoring (``models/outcome.py``) live apart.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.joint import JointAggregation
from models.layers import Block
from models.layerwise import LayerwiseEvaluation
from models.outcome import PassOutcome
from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph, sampling_rng
from models.workset import (
    CachedBatch,
    Workset,
    combine,
    instance_weights,
    weighted_cross_entropy,
)
from secure.aggregation import EmbeddingCodec, PlainCodec
from secure.protocol import (
    NodesRequest,
    ProtocolViolation,
    Request,
    Response,
    check_node_set,
    check_union,
)

_GLOBAL_RNG_LOCK = threading.Lock()


class GlasuClient(LayerwiseEvaluation, JointAggregation):
    """Client ``partition.client``'s model, sampler, optimiser and GLASU pass logic."""

    def __init__(
        self,
        partition: ClientPartition,
        config: ClientConfig,
        *,
        codec: EmbeddingCodec | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.partition = partition
        self.config = config
        self.codec = codec or PlainCodec()
        # The pass being run (index, output nodes), and the digest of the release about to be
        # sent (private clients): what the owner's gate records before it leaves.
        self.current_pass: tuple[int, np.ndarray] = (-1, np.empty(0, np.int64))
        self.pending_release: str | None = None
        self.device = torch.device(device)
        self.layers = config.model.layers
        self.client_seed = client_seed = int(
            np.random.SeedSequence([config.seed, partition.client]).generate_state(1)[0]
        )
        # Initialisation draws from torch's global generator (PyG layers offer no other):
        # seed it per client, and hold a lock so that clients built in parallel threads of one
        # process cannot interleave their draws.
        with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
            torch.manual_seed(client_seed)
            self.network = ClientNetwork(
                in_features=partition.features.shape[1],
                num_classes=config.num_classes or partition.num_classes,
                config=config.model,
            ).to(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(client_seed)
        self.optimizer = torch.optim.Adam(
            self.network.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.workset = Workset(config.cache_rounds)
        self.labels = partition.labels.to(self.device)
        self.holds_labels = config.label_holder in (None, partition.client)
        if self.gradient_layer is not None and self.layers not in config.agg_layers:
            raise ValueError(
                f"a single label holder needs aggregation at the top layer L={self.layers} "
                f"(GLASU B.2), got aggregation layers {config.agg_layers}"
            )
        self.held = torch.from_numpy(
            partition.held if partition.held is not None else np.ones(partition.num_nodes, bool)
        )
        # The occurrence cap (a DP assumption) holds at every layer up to the first aggregation
        # layer; the layers above it are never released and sample freely.
        graph = SamplingGraph.from_edge_index(partition.edge_index, num_nodes=partition.num_nodes)
        self._samplers = {
            (fanout, capped): NeighbourSampler(
                graph,
                fanout=fanout,
                occurrence_cap=config.occurrence_cap if capped else None,
            )
            for fanout in {config.fanout, config.eval_fanout}
            for capped in (False, True)
        }

    # -- state ----------------------------------------------------------------------------------

    #: What :meth:`state_dict` says this client is; a state of another arrangement is refused.
    arrangement = "glasu"

    def state_dict(self) -> dict[str, Any]:
        """Everything of this client that changes from pass to pass (the PyTorch habit): the
        model, the optimiser, the dropout generator and the workset. A client built with the
        same settings and given it by :meth:`load_state_dict` computes the next passes as this
        one would, bit for bit."""
        return {
            "arrangement": self.arrangement,
            "network": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "workset": self.workset.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back a :meth:`state_dict`; ``ValueError`` if it is of another arrangement."""
        if state.get("arrangement") != self.arrangement:
            raise ValueError(
                f"the saved state is of a {state.get('arrangement')} client, this one is "
                f"{self.arrangement} (differential privacy on in one run, off in the other?)"
            )
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.workset.load_state_dict(state["workset"], device=self.device)

    # -- one pass -------------------------------------------------------------------------------

    def run_pass(
        self, *, pass_index: int, kind: str, output_nodes: np.ndarray
    ) -> Generator[Request, Response, PassOutcome]:
        output_nodes = check_node_set(
            output_nodes, num_nodes=self.partition.num_nodes, what=f"pass {pass_index}'s output"
        )
        if not output_nodes.size:  # the service never plans an empty pass
            raise ProtocolViolation(f"pass {pass_index} has no output nodes")
        self.current_pass = (pass_index, output_nodes)
        if kind == "eval":
            return (yield from self._evaluate(output_nodes))
        sampled = yield from self._sample(pass_index, output_nodes, self.config.fanout)
        blocks = [Block.from_sampled(layer, self.device) for layer in sampled]
        input_nodes = torch.from_numpy(sampled[0].sources).to(self.device)
        h0_rows = [
            torch.from_numpy(np.searchsorted(sampled[0].sources, layer.targets)).to(self.device)
            for layer in sampled
        ]
        batch = CachedBatch(
            blocks,
            input_nodes,
            h0_rows,
            labels=self.labels[torch.from_numpy(output_nodes).to(self.device)],
            presence=self._presence(sampled),
        )
        return (yield from self._train(batch))

    def _presence(self, sampled: Sequence[SampledLayer]) -> dict[int, torch.Tensor]:
        """Per aggregation layer, a column with 1 where this client holds the node (count-aware
        sessions only)."""
        if not self.config.count_aware:
            return {}
        return {
            depth: self.held[torch.from_numpy(sampled[depth - 1].targets)]
            .to(self.device, torch.float32)
            .unsqueeze(1)
            for depth in self.config.agg_layers
        }

    def _sampler(self, fanout: int, depth: int) -> NeighbourSampler:
        """The sampler of graph layer ``depth``: capped up to the first aggregation layer."""
        return self._samplers[(fanout, depth <= self.config.agg_layers[0])]

    def _feature_rows(self, nodes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The features of ``nodes`` (aligned ids) on the device, read from the partition's
        (memory-mapped) rows."""
        if isinstance(nodes, torch.Tensor):
            nodes = nodes.cpu().numpy()
        return self.partition.feature_rows(nodes).to(self.device)

    def _sample(
        self, pass_index: int, output_nodes: np.ndarray, fanout: int
    ) -> Generator[Request, Response, list[SampledLayer]]:
        """Top-down: sample each layer's sources from its targets; at an aggregation layer below
        the top, replace the client's own set by the union agreed with the others."""
        sampled: list[SampledLayer] = []
        targets = output_nodes
        for depth in range(self.layers, 0, -1):
            rng = sampling_rng(
                seed=self.config.seed,
                client=self.partition.client,
                pass_index=pass_index,
                layer=depth,
            )
            layer = self._sampler(fanout, depth).sample_layer(targets, rng=rng)
            if depth - 1 in self.config.agg_layers:
                union = yield NodesRequest(layer=depth - 1, nodes=layer.sources)
                union = check_union(
                    union, own=layer.sources, num_nodes=self.partition.num_nodes, layer=depth - 1
                )
                layer = layer.with_sources(union)
            sampled.append(layer)
            targets = layer.sources
        sampled.reverse()
        return sampled

    def _forward(
        self, batch: CachedBatch, *, grad: bool
    ) -> Generator[Request, Response, torch.Tensor]:
        """All L layers. At an aggregation layer whose "all but me" part is already in
        ``batch.others`` (a local step), combine locally; otherwise this is the joint inference:
        upload the share, download the sum and extract the others' part into ``batch.others``.

        Grad mode is set per synchronous stretch, never held across a ``yield``: other clients'
        code runs while this generator is suspended."""
        others = batch.others
        with torch.set_grad_enabled(grad):
            h0 = self.network.project(
                self._feature_rows(batch.input_nodes), generator=self.generator
            )
        h = h0
        for depth, block in enumerate(batch.blocks, start=1):
            with torch.set_grad_enabled(grad):
                initial = (
                    h0[batch.h0_rows[depth - 1]] if self.network.uses_initial_residual else None
                )
                h = self.network.propagate(depth, h, block, initial, generator=self.generator)
            if depth not in self.config.agg_layers:
                continue
            if depth not in others:
                others[depth] = yield from self._joint_aggregate(
                    depth, h, presence=batch.presence.get(depth)
                )
            with torch.set_grad_enabled(grad):
                stale = others[depth]
                h = combine(stale.others, h, count=stale.count, presence=stale.presence)
        return h

    @property
    def gradient_layer(self) -> int | None:
        """The wire layer L + 1 of GLASU B.2's broadcast gradient when one client holds the
        labels, or None."""
        return None if self.config.label_holder is None else self.layers + 1

    def _train(self, fresh: CachedBatch) -> Generator[Request, Response, PassOutcome]:
        """One round: the joint inference is local step 0; steps 1..Q-1 reuse stale statistics
        from the workset (models/workset.py): with W = 1 the others' parts of this very batch.

        With a single label holder (GLASU B.2), after the joint inference the holder sends the
        gradient of its loss with respect to the top layer's aggregate, through the service,
        and every other client steps along it by the chain rule, in every local step of the
        round (the gradient is as stale as the others' parts)."""
        self.network.train()
        h = yield from self._forward(fresh, grad=True)
        fresh.own_output = h.detach()
        loss = self._loss(fresh, h, weights=None) if self.holds_labels else None
        if self.gradient_layer is not None:
            fresh.gradient = yield from self._broadcast_gradient(h, loss)
            if loss is None:
                loss = self._loss(fresh, h, weights=None)
        losses = [self._apply(fresh, loss)]
        self.workset.add(fresh)
        for _ in range(1, self.config.stale):
            batch = self.workset.next_batch()
            # every aggregation layer is in batch.others: no request is made
            h = yield from self._forward(batch, grad=True)
            weights = None
            if self.config.instance_weighting:
                assert batch.own_output is not None
                weights = instance_weights(
                    h.detach(), batch.own_output, threshold=self.config.weight_threshold
                )
            losses.append(self._apply(batch, self._loss(batch, h, weights=weights)))
        loss = float(np.mean(losses)) if self.holds_labels else float("nan")
        return PassOutcome(kind="train", loss=loss)

    def _loss(
        self, batch: CachedBatch, h: torch.Tensor, *, weights: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The loss of one local step from the top-layer representation ``h``: this client's
        own, or, without labels, the chain-rule surrogate of the holder's (its gradient with
        respect to ``h`` is the broadcast one); None without either (nothing to learn)."""
        if self.holds_labels:
            logits = self.network.classify(h, generator=self.generator)
            return weighted_cross_entropy(logits, batch.labels, weights)
        if batch.gradient is None:
            return None
        if weights is None:
            return (batch.gradient * h).sum()
        per_instance = (batch.gradient * h).sum(dim=1) * h.shape[0]
        return (weights * per_instance).sum() / weights.sum().clamp_min(1e-12)

    def _apply(self, batch: CachedBatch, loss: torch.Tensor | None) -> float:
        """One optimiser step along ``loss`` (none without a loss)."""
        if loss is None:
            return float("nan")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._after_step(batch)
        return loss.item()

    def _broadcast_gradient(
        self, h: torch.Tensor, loss: torch.Tensor | None
    ) -> Generator[Request, Response, torch.Tensor]:
        """GLASU B.2's broadcast, as a sum through the service at wire layer L + 1: the label
        holder sends its loss's gradient with respect to the top-layer aggregate (per instance:
        times the batch size, so that it sits well above the share grid), every other client a
        zero matrix (so the service cannot tell who holds the labels); everyone gets the sum."""
        rows, cols = h.shape
        if loss is not None:
            (gradient,) = torch.autograd.grad(loss, h, retain_graph=True)
            share = (gradient.detach() * rows).cpu().numpy().astype(np.float32)
        else:
            share = np.zeros((rows, cols), dtype=np.float32)
        share = self._within_bound(share)
        total = np.empty_like(share)

        def on_sum(start: int, stop: int, _: np.ndarray, part: np.ndarray, __: int) -> None:
            total[start:stop] = part

        yield from self._exchange_parts(
            self.layers + 1, rows=rows, cols=cols,
            share_of=lambda _, start, stop: share[start:stop], on_sum=on_sum,
        )  # fmt: skip
        return torch.from_numpy(total / rows).to(self.device, torch.float32)

    def _after_step(self, batch: CachedBatch) -> None:
        """Called after every local step with the batch it used (the private client's reference
        model trains on the same batches)."""
