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

One class, about 480 lines: the steps of a pass (sampling, the joint aggregation, the
local steps, GLASU B.2's gradient broadcast, evaluation) share the client's model, generators
and workset. Its settings (``models/client_config.py``), its stale statistics
(``models/workset.py``) and the scoring of an evaluation (``models/outcome.py``) live apart.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.layers import Block
from models.layerwise import EVAL_CHUNK_NODES, Stack, project_all, propagate_all
from models.outcome import EvaluationScores, PassOutcome, score_evaluation
from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph, sampling_rng
from models.workset import (
    CachedBatch,
    Extracted,
    Workset,
    combine,
    instance_weights,
    weighted_cross_entropy,
)
from secure.aggregation import EmbeddingCodec, PlainCodec
from secure.protocol import (
    MIN_CONTRIBUTORS,
    Aggregate,
    EmbeddingRequest,
    NodesRequest,
    Request,
    Response,
    check_node_set,
    check_union,
    part_count,
    part_span,
)

_GLOBAL_RNG_LOCK = threading.Lock()


class GlasuClient:
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

    def _joint_aggregate(
        self, depth: int, own: torch.Tensor, *, presence: torch.Tensor | None = None
    ) -> Generator[Request, Response, Extracted]:
        """Send this client's share of layer ``depth``, part by part; return H_{-m} =
        Extract(H, share) = H - share / M, where ``share`` is what was actually sent (noise
        included).

        With ``presence`` (a count-aware session), rows of nodes this client lacks are sent as
        zeros, a last column carries the presence itself, and the sum's last column is the
        number of holders of each row, the divisor of the count-aware mean (Feras)."""
        clean = own.detach().cpu().numpy().astype(np.float32, copy=False)
        column = None if presence is None else presence.cpu().numpy().astype(np.float32)
        rows, width = clean.shape
        self._begin_release(depth, clean)
        release = self.pending_release
        others = np.empty((rows, width), dtype=np.float32)
        count = np.empty((rows, 1), dtype=np.float32)

        def share_of(part: int, start: int, stop: int) -> np.ndarray:
            share = self._within_bound(self._release_part(depth, part, clean[start:stop]))
            if column is None:
                return share
            return np.concatenate([share * column[start:stop], column[start:stop]], axis=1)

        def on_sum(
            start: int, stop: int, share: np.ndarray, total: np.ndarray, shares: int
        ) -> None:
            if column is None:
                others[start:stop] = total / shares - share / shares
                count[start:stop] = shares
                return
            # the holder counts are small integers: round away the encryption's error; every
            # node was sampled or is held by a party that holds it, so count >= 1
            held = np.clip(np.rint(total[:, -1:]), 1, shares)
            others[start:stop] = (total[:, :-1] - share[:, :-1]) / held
            count[start:stop] = held

        yield from self._exchange_parts(
            depth, rows=rows, cols=width + (column is not None), share_of=share_of,
            on_sum=on_sum, release=release,
        )  # fmt: skip
        self.pending_release = None
        if column is None and (count == count[0, 0]).all():
            return Extracted(torch.from_numpy(others).to(self.device), int(count[0, 0]))
        return Extracted(
            torch.from_numpy(others).to(self.device),
            torch.from_numpy(count).to(self.device),
            presence,
        )

    def _begin_release(self, depth: int, clean: np.ndarray) -> None:
        """Called with the whole clean share of layer ``depth`` before its first part is sent:
        a private client sets :attr:`pending_release` (the digest all its parts carry)."""

    def _release_part(self, depth: int, part: int, clean: np.ndarray) -> np.ndarray:
        """Part ``part`` of the share of layer ``depth`` as it is sent (the DP release hook)."""
        return clean

    def _within_bound(self, share: np.ndarray) -> np.ndarray:
        """``share`` clipped to what keeps the encrypted sum decodable (post-processing)."""
        bound = self.codec.value_bound(shares=self.partition.clients)
        share = share.astype(np.float32, copy=False)
        return np.clip(share, -bound, bound) if math.isfinite(bound) else share

    def _exchange_parts(
        self,
        layer: int,
        *,
        rows: int,
        cols: int,
        share_of: Callable[[int, int, int], np.ndarray],
        on_sum: Callable[[int, int, np.ndarray, np.ndarray, int], None],
        release: str | None = None,
    ) -> Generator[Request, Response, None]:
        """Send a share of ``rows`` x ``cols`` in its parts (``secure.protocol.part_span``), one
        after the other: ``share_of(part, start, stop)`` makes a part as it is sent, and
        ``on_sum(start, stop, sent, total, count)`` takes its sum, so no more than one part's
        encoding is held at a time."""
        parts = part_count(rows, cols)
        for part in range(parts):
            start, stop = part_span(part, rows=rows, cols=cols)
            share = share_of(part, start, stop)
            total, shares = yield from self._exchange(
                layer, share, release=release, part=part, parts=parts
            )
            on_sum(start, stop, share, total, shares)

    def _exchange(
        self,
        layer: int,
        share: np.ndarray,
        *,
        release: str | None = None,
        part: int = 0,
        parts: int = 1,
    ) -> Generator[Request, Response, tuple[np.ndarray, int]]:
        """Upload ``share`` (part ``part`` of ``parts`` of wire layer ``layer``); return the
        decoded sum and how many shares it holds: every client's, or (a pass that went on
        without a straggler) ``MIN_CONTRIBUTORS`` at least."""
        rows, cols = share.shape
        answer = yield EmbeddingRequest(
            layer=layer, payload=self.codec.encode(share), rows=rows, cols=cols, release=release,
            part=part, parts=parts,
        )  # fmt: skip
        if not isinstance(answer, Aggregate):
            raise TypeError(f"expected an Aggregate for layer {layer}, got {type(answer).__name__}")
        clients = self.partition.clients
        if not min(MIN_CONTRIBUTORS, clients) <= answer.count <= clients:
            raise ValueError(
                f"layer {layer}: the sum holds {answer.count} shares, expected at most "
                f"{clients} and at least {min(MIN_CONTRIBUTORS, clients)}"
            )
        return self.codec.decode_sum(answer.payload, rows=rows, cols=cols), answer.count

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

    def _evaluate(self, output_nodes: np.ndarray) -> Generator[Request, Response, PassOutcome]:
        """Joint inference of every aligned node, layer by layer (:meth:`_infer_all`), scored at
        the output nodes; this client's own head predicts (a client without labels only takes
        part)."""
        tops = yield from self._infer_all()
        if not self.holds_labels:
            return PassOutcome(kind="eval", loss=float("nan"))
        return self._outcome(tops, output_nodes)

    def _outcome(self, tops: Sequence[Stack], output_nodes: np.ndarray) -> PassOutcome:
        """The outcome of an evaluation pass from the top layers :meth:`_infer_all` computed."""
        scores = self._score(tops[0], output_nodes)
        return PassOutcome(
            kind="eval",
            loss=scores.loss,
            val_accuracy=scores.val_accuracy,
            test_accuracy=scores.test_accuracy,
            probabilities=scores.probabilities,
            test_metrics=scores.test_metrics,
        )

    def _score(self, top: Stack, output_nodes: np.ndarray) -> EvaluationScores:
        """``top``'s network's predictions at the output nodes, scored."""
        nodes = torch.from_numpy(output_nodes).to(self.device)
        with torch.no_grad():
            logits = top.network.classify(top.h[nodes], generator=top.generator)
        return score_evaluation(logits, self.labels[nodes], output_nodes, self.partition)

    def _all_nodes(self, network: ClientNetwork, generator: torch.Generator) -> Stack:
        """The input projection of every node by ``network`` (put in inference mode)."""
        network.eval()
        return project_all(
            network, generator, self._feature_rows,
            num_nodes=self.partition.num_nodes, device=self.device,
        )  # fmt: skip

    def _layer_chunks(self, depth: int) -> Iterator[SampledLayer]:
        """Graph layer ``depth`` of an inference pass sampled over all nodes, chunk by chunk:
        the same sample in every inference pass of this model (``sampling_rng``)."""
        rng = sampling_rng(
            seed=self.config.seed, client=self.partition.client, pass_index=None, layer=depth
        )
        sampler = self._sampler(self.config.eval_fanout, depth)
        return sampler.sample_all(chunk=EVAL_CHUNK_NODES, rng=rng)

    def _all_presence(self) -> torch.Tensor | None:
        """The presence column of every node (count-aware sessions only)."""
        if not self.config.count_aware:
            return None
        return self.held.to(self.device, torch.float32).unsqueeze(1)

    def _infer_all(self) -> Generator[Request, Response, list[Stack]]:
        """Every layer of every aligned node, the aggregation layers' shares over all nodes
        in order (rows 0..N-1, sent in parts): the top layer of this client's network."""
        stack = self._all_nodes(self.network, self.generator)
        presence = self._all_presence()
        for depth in range(1, self.layers + 1):
            propagate_all(depth, [stack], self._layer_chunks(depth), device=self.device)
            if depth not in self.config.agg_layers:
                continue
            extracted = yield from self._joint_aggregate(depth, stack.h, presence=presence)
            with torch.no_grad():
                stack.h = combine(
                    extracted.others, stack.h, count=extracted.count, presence=presence
                )
        return [stack]
