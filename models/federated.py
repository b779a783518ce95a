"""The GLASU client, written without I/O.

:meth:`GlasuClient.run_pass` is a generator: it yields a :class:`NodesRequest` when it needs the
union of the clients' node sets at an aggregation layer of a training pass, and an
:class:`ShareRequest` when it uploads a part of its share of an aggregation layer (a share
travels in ``secure.protocol.part_count`` parts); it is resumed with the answer (the union, or the
summed part and how many shares it holds). An evaluation pass asks for no node set: it computes
every layer over all aligned nodes (``models/layerwise.py``); a scoring session's ``sampled``
pass (``ClientConfig.sampled_eval``: an online request) samples and exchanges its output nodes'
neighbourhoods as a training pass does, and infers only them. These are the wire messages of
``secure/protocol.py``. The in-process trainer answers all clients' requests with function
calls; the HTTP worker answers its one client's requests through the service. Both run exactly
this code.

One class, built by composition: the steps of a training pass (sampling, the local steps,
GLASU B.2's gradient broadcast) share the client's model, generators and workset; what its
aggregation layers compute and share is its arrangement (``models/arrangement.py``: GLASU, or the
private arrangement of ``models/private.py``), how a share is sent its joint aggregation
(``models/joint.py``) with the release policy it is given (``models/release.py``), the samplers
its pass sampling (``models/sampler.py``), and its evaluation passes a layer-wise
evaluation (``models/layerwise.py``). The pass being run goes down to all of them as a
``models.release.PassContext``. Its settings (``models/client_config.py``), its stale statistics
(``models/workset.py``) and the scoring of evaluations (``models/outcome.py``) live apart.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from models.answer import Answer, share_answer
from models.arrangement import Arrangement, GlasuArrangement
from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.config import ScaleName
from models.data.derived import hop_features as kept_hop_features
from models.data.derived import hop_scaling
from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures, chosen_scale, scale_statistics
from models.joint import JointAggregation
from models.layers import Block
from models.layerwise import LayerwiseEvaluation, Stack
from models.outcome import PassOutcome
from models.release import PassContext, ReleasePolicy
from models.sampler import PassSampling, SampledLayer
from models.workset import (
    CachedBatch,
    Workset,
    instance_weights,
    weighted_cross_entropy,
)
from secure.aggregation import EmbeddingCodec, PlainCodec
from secure.protocol import (
    ProtocolViolation,
    Request,
    Response,
    answering_party,
    check_node_set,
)

_GLOBAL_RNG_LOCK = threading.Lock()


class GlasuClient:
    """Client ``partition.client``'s model, sampler, optimiser and GLASU pass logic: its
    aggregation layers those of ``arrangement`` (built with this client; GLASU's by default),
    its shares released by ``release`` (as they are by default)."""

    def __init__(
        self,
        partition: ClientPartition,
        config: ClientConfig,
        *,
        codec: EmbeddingCodec | None = None,
        device: torch.device | str = "cpu",
        release: ReleasePolicy | None = None,
        arrangement: Callable[[GlasuClient], Arrangement] = GlasuArrangement,
        hop_features: HopFeatures | None = None,
    ) -> None:
        self.partition = partition
        self.config = config
        self.device = torch.device(device)
        # a precomputed backbone's input: its own features propagated over its own graph, once
        # per loaded partition, unless given (the private sign design's: its own hops beside the
        # received block)
        given_hops = hop_features is not None
        if hop_features is None and config.model.precomputed:
            hop_features = kept_hop_features(partition, hops=config.model.hops)
        self.hop_features = hop_features
        in_features = partition.num_features
        if hop_features is not None:
            in_features = hop_features.width // len(hop_features.hops)
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
                in_features=in_features,
                num_classes=config.num_classes or partition.num_classes,
                config=config.model,
            )
        # how its propagated columns are scaled (a precomputed backbone), with the party's own
        # statistics; a saved model's state replaces them when it scores
        self.feature_scale: ScaleName | None = None
        if self.hop_features is not None and self.network.scale is not None:
            if given_hops:
                self.feature_scale = chosen_scale(partition, config.model.feature_scale)
                statistics = scale_statistics(
                    self.hop_features, partition.held, scale=self.feature_scale
                )
            else:
                self.feature_scale, statistics = hop_scaling(
                    partition, hops=config.model.hops, feature_scale=config.model.feature_scale
                )
            self.network.scale.set_statistics(*statistics)
        self.network.to(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(client_seed)
        self.optimizer = torch.optim.Adam(
            self.network.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.workset = Workset(config.cache_rounds)
        self.labels = partition.labels.to(self.device)
        self.holds_labels = config.label_holder in (None, partition.client)
        self.held = torch.from_numpy(
            partition.held if partition.held is not None else np.ones(partition.num_nodes, bool)
        )
        self.sampling = PassSampling(partition, config)
        self.joint = JointAggregation(
            codec or PlainCodec(), release,
            clients=partition.clients, part_values=config.part_values, device=self.device,
        )  # fmt: skip
        self.evaluation = LayerwiseEvaluation(
            partition, config, self.sampling, self.feature_rows,
            labels=self.labels, held=self.held, device=self.device,
        )  # fmt: skip
        self.arrangement = arrangement(self)

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything of this client that changes from pass to pass (the PyTorch habit): the
        model, the optimiser, the dropout generator and the workset, with what its arrangement
        and its release policy keep (the private arrangement's party-alone reference, the
        state of the release's noise). A client built with the same settings and given it by
        :meth:`load_state_dict` computes the next passes as this one would, bit for bit."""
        return {
            "arrangement": self.arrangement.name,
            "network": self.network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "workset": self.workset.state_dict(),
            **self.arrangement.state_dict(),
            **self.joint.release.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back a :meth:`state_dict`; ``ValueError`` if it is of another arrangement,
        ``secure.noise.NoiseStateError`` if of another noise."""
        if state.get("arrangement") != self.arrangement.name:
            raise ValueError(
                f"the saved state is of a {state.get('arrangement')} client, this one is "
                f"{self.arrangement.name} (differential privacy on in one run, off in the other?)"
            )
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.workset.load_state_dict(state["workset"], device=self.device)
        self.arrangement.load_state_dict(state)
        self.joint.release.load_state_dict(state)

    # -- one pass -------------------------------------------------------------------------------

    def run_pass(
        self, *, pass_index: int, kind: str, output_nodes: np.ndarray
    ) -> Generator[Request, Response, PassOutcome]:
        output_nodes = check_node_set(
            output_nodes, num_nodes=self.partition.num_nodes, what=f"pass {pass_index}'s output"
        )
        if not output_nodes.size:  # the service never plans an empty pass
            raise ProtocolViolation(f"pass {pass_index} has no output nodes")
        context = PassContext(pass_index=pass_index, kind=kind, output_nodes=output_nodes)
        if kind == "eval" and not self.config.sampled_eval:
            return (yield from self._evaluate(context, self.arrangement.infer_all(context)))
        batch = yield from self._sampled_batch(pass_index, output_nodes)
        if kind == "eval":  # a sampled scoring pass: the output nodes' neighbourhoods only
            inference = self.arrangement.infer_batch(context, batch)
            return (yield from self._evaluate(context, inference))
        return (yield from self._train(context, batch))

    def _sampled_batch(
        self, pass_index: int, output_nodes: np.ndarray
    ) -> Generator[Request, Response, CachedBatch]:
        """The output nodes' sampled L-hop neighbourhoods (the session's fanout, capped), the
        node sets agreed through the service at the aggregation layers below the top."""
        sampled = yield from self.sampling.walk(pass_index, output_nodes, self.config.fanout)
        blocks = [Block.from_sampled(layer, self.device) for layer in sampled]
        input_nodes = torch.from_numpy(sampled[0].sources).to(self.device)
        h0_rows = [
            torch.from_numpy(np.searchsorted(sampled[0].sources, layer.targets)).to(self.device)
            for layer in sampled
        ]
        return CachedBatch(
            blocks,
            input_nodes,
            h0_rows,
            labels=self.labels[torch.from_numpy(output_nodes).to(self.device)],
            presence=self._presence(sampled),
        )

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

    def feature_rows(self, nodes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The features of ``nodes`` (aligned ids) on the device, read from the partition's
        (memory-mapped) rows; of a precomputed backbone, every hop of them."""
        if isinstance(nodes, torch.Tensor):
            nodes = nodes.cpu().numpy()
        if self.hop_features is not None:
            return self.hop_features.rows(nodes).to(self.device)
        return self.partition.feature_rows(nodes).to(self.device)

    def _evaluate(
        self, context: PassContext, inference: Generator[Request, Response, list[Stack]]
    ) -> Generator[Request, Response, PassOutcome]:
        """The joint ``inference`` (of every aligned node, or of a sampled batch), scored at the
        output nodes; this client's own head predicts (a client without labels only takes
        part)."""
        tops = yield from inference
        if self.holds_labels:
            outcome = self.arrangement.outcome(tops, context.output_nodes)
        else:
            outcome = PassOutcome(kind="eval", loss=float("nan"))
        answer = None
        if self.partition.client == answering_party(self.config.label_holder):
            assert outcome.probabilities is not None
            answer = Answer.of(outcome.probabilities)
        width = self.config.shared_answer_width
        if width is not None:  # a scoring session that shares it (models/answer.py)
            answer = yield from share_answer(
                self.joint, answer, layer=self.layers + 1, pass_index=context.pass_index,
                rows=len(context.output_nodes), width=width,
            )  # fmt: skip
        return dataclasses.replace(outcome, answer=answer)

    def _train(
        self, context: PassContext, fresh: CachedBatch
    ) -> Generator[Request, Response, PassOutcome]:
        """One round: the joint inference is local step 0; steps 1..Q-1 reuse stale statistics
        from the workset (models/workset.py): with W = 1 the others' parts of this very batch.

        With a single label holder (GLASU B.2), after the joint inference the holder sends the
        gradient of its loss with respect to the top layer's aggregate, through the service,
        and every other client steps along it by the chain rule, in every local step of the
        round (the gradient is as stale as the others' parts)."""
        self.network.train()
        arrangement = self.arrangement
        h = yield from arrangement.forward(context, fresh, grad=True)
        fresh.own_output = h.detach()
        loss = self._loss(fresh, h, weights=None) if self.holds_labels else None
        if arrangement.gradient_layer is not None:
            fresh.gradient = yield from self._broadcast_gradient(
                h, loss, pass_index=context.pass_index
            )
            if loss is None:
                loss = self._loss(fresh, h, weights=None)
        losses = [self._apply(fresh, loss)]
        self.workset.add(fresh)
        for _ in range(1, self.config.stale):
            batch = self.workset.next_batch()
            # every aggregation layer is in batch.others: no request is made
            h = yield from arrangement.forward(context, batch, grad=True)
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
        self.arrangement.after_step(batch)
        return loss.item()

    def _broadcast_gradient(
        self, h: torch.Tensor, loss: torch.Tensor | None, *, pass_index: int
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
        share = self.joint.within_bound(share)
        total = yield from self.joint.sum_of(self.layers + 1, share, pass_index=pass_index)
        return torch.from_numpy(total / rows).to(self.device, torch.float32)
