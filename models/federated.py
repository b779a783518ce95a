"""The GLASU client, written without I/O.

:meth:`GlasuClient.run_pass` is a generator: it yields a :class:`NodesRequest` when it needs the
union of the clients' node sets at an aggregation layer, and an :class:`EmbeddingRequest` when it
uploads its share of an aggregation layer; it is resumed with the answer (the union, or the summed
payload and how many shares it holds). These are the wire messages of ``secure/protocol.py``. The
in-process trainer answers all clients' requests with function calls; the HTTP worker answers its
one client's requests through the service. Both run exactly this code.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from models.backbone import ClientNetwork, ModelConfig
from models.layers import Block
from models.partition import ClientPartition
from models.sampler import NeighbourSampler, SampledLayer, sampling_rng
from models.workset import CachedBatch, Workset, instance_weights, weighted_cross_entropy
from secure.aggregation import EmbeddingCodec, PlainCodec
from secure.protocol import (
    Aggregate,
    EmbeddingRequest,
    NodesRequest,
    Request,
    Response,
    check_node_set,
    check_union,
)


@dataclass(frozen=True)
class PassOutcome:
    kind: str
    loss: float
    val_accuracy: float | None = None
    test_accuracy: float | None = None
    # the party-alone reference of a private client (models/private.py), same batches
    reference_val_accuracy: float | None = None
    reference_test_accuracy: float | None = None


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
    lr: float = 0.01
    weight_decay: float = 5e-4
    seed: int = 0

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
        if not -1.0 <= self.weight_threshold <= 1.0:
            raise ValueError(f"the weight threshold is a cosine, got {self.weight_threshold}")


_GLOBAL_RNG_LOCK = threading.Lock()

# Transforms a client's share of an aggregation layer before it is encoded (the DP release hook):
# (layer, clean share) -> share to send.
ShareTransform = Callable[[int, np.ndarray], np.ndarray]


def uniform_agg_layers(*, layers: int, count: int) -> tuple[int, ...]:
    """K aggregation layers spread uniformly, always including the last: K=1 -> (L,),
    K=2 -> (L/2, L), K=L -> (1..L)."""
    if not 1 <= count <= layers:
        raise ValueError(f"agg-layers K must be between 1 and L={layers}, got {count}")
    return tuple(sorted({round(layers * (i + 1) / count) for i in range(count)}))


def combine(stale_others: torch.Tensor, own: torch.Tensor, *, count: int) -> torch.Tensor:
    """The aggregate as one client sees it in a local step: value ``stale_others + own / M``.

    The gradient reaches ``own`` as if its coefficient were 1, not 1/M: the true 1/M shrinks every
    client's gradient by M at each aggregation layer it crosses and collapses training
    (notes/calibration.md)."""
    return stale_others + own.detach() / count + (own - own.detach())


class GlasuClient:
    """Client ``partition.client``'s model, sampler, optimiser and GLASU pass logic."""

    def __init__(
        self,
        partition: ClientPartition,
        config: ClientConfig,
        *,
        codec: EmbeddingCodec | None = None,
        share_transform: ShareTransform | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.partition = partition
        self.config = config
        self.codec = codec or PlainCodec()
        self.share_transform = share_transform
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
                num_classes=partition.num_classes,
                config=config.model,
            ).to(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(client_seed)
        self.optimizer = torch.optim.Adam(
            self.network.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.workset = Workset(config.cache_rounds)
        self.features = partition.features.to(self.device)
        self.labels = partition.labels.to(self.device)
        # The occurrence cap (a DP assumption) holds at every layer up to the first aggregation
        # layer; the layers above it are never released and sample freely.
        self._samplers = {
            (fanout, capped): NeighbourSampler(
                partition.edge_index,
                num_nodes=partition.num_nodes,
                fanout=fanout,
                occurrence_cap=config.occurrence_cap if capped else None,
            )
            for fanout in {config.fanout, config.eval_fanout}
            for capped in (False, True)
        }

    # -- one pass -------------------------------------------------------------------------------

    def run_pass(
        self, *, pass_index: int, kind: str, output_nodes: np.ndarray
    ) -> Generator[Request, Response, PassOutcome]:
        fanout = self.config.fanout if kind == "train" else self.config.eval_fanout
        output_nodes = check_node_set(
            output_nodes, num_nodes=self.partition.num_nodes, what=f"pass {pass_index}'s output"
        )
        sampled = yield from self._sample(pass_index, output_nodes, fanout)
        blocks = [Block.from_sampled(layer, self.device) for layer in sampled]
        input_nodes = torch.from_numpy(sampled[0].sources).to(self.device)
        h0_rows = [
            torch.from_numpy(np.searchsorted(sampled[0].sources, layer.targets)).to(self.device)
            for layer in sampled
        ]
        labels = self.labels[torch.from_numpy(output_nodes).to(self.device)]
        if kind == "eval":
            return (yield from self._evaluate(blocks, input_nodes, h0_rows, output_nodes, labels))
        return (yield from self._train(blocks, input_nodes, h0_rows, labels))

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
            sampler = self._samplers[(fanout, depth <= self.config.agg_layers[0])]
            layer = sampler.sample_layer(targets, rng=rng)
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
        self,
        blocks: Sequence[Block],
        input_nodes: torch.Tensor,
        h0_rows: Sequence[torch.Tensor],
        others: dict[int, torch.Tensor],
        *,
        grad: bool,
    ) -> Generator[Request, Response, torch.Tensor]:
        """All L layers. At an aggregation layer whose "all but me" part is already in ``others``
        (a local step), combine locally; otherwise this is the joint inference: upload the share,
        download the sum and extract the others' part into ``others``.

        Grad mode is set per synchronous stretch, never held across a ``yield``: other clients'
        code runs while this generator is suspended."""
        with torch.set_grad_enabled(grad):
            h0 = self.network.project(self.features[input_nodes], generator=self.generator)
        h = h0
        for depth, block in enumerate(blocks, start=1):
            with torch.set_grad_enabled(grad):
                initial = h0[h0_rows[depth - 1]] if self.network.uses_initial_residual else None
                h = self.network.propagate(depth, h, block, initial, generator=self.generator)
            if depth not in self.config.agg_layers:
                continue
            if depth not in others:
                others[depth] = yield from self._joint_aggregate(depth, h)
            with torch.set_grad_enabled(grad):
                h = combine(others[depth], h, count=self.partition.clients)
        return h

    def _joint_aggregate(
        self, depth: int, own: torch.Tensor
    ) -> Generator[Request, Response, torch.Tensor]:
        """Send this client's share of layer ``depth``; return H_{-m} = Extract(H, share) =
        H - share / M, where ``share`` is what was actually sent (noise included)."""
        share = own.detach().cpu().numpy().astype(np.float32)
        if self.share_transform is not None:
            share = self.share_transform(depth, share).astype(np.float32)
        bound = self.codec.value_bound(shares=self.partition.clients)
        if math.isfinite(bound):  # keep the encrypted sum decodable (post-processing of share)
            share = np.clip(share, -bound, bound)
        rows, cols = share.shape
        answer = yield EmbeddingRequest(
            layer=depth, payload=self.codec.encode(share), rows=rows, cols=cols
        )
        if not isinstance(answer, Aggregate):
            raise TypeError(f"expected an Aggregate for layer {depth}, got {type(answer).__name__}")
        if answer.count != self.partition.clients:
            raise ValueError(
                f"layer {depth}: the sum holds {answer.count} shares, expected "
                f"{self.partition.clients}"
            )
        total = self.codec.decode_sum(answer.payload, rows=rows, cols=cols)
        mean = total / answer.count
        return torch.from_numpy(mean - share / answer.count).to(self.device)

    def _train(
        self,
        blocks: Sequence[Block],
        input_nodes: torch.Tensor,
        h0_rows: Sequence[torch.Tensor],
        labels: torch.Tensor,
    ) -> Generator[Request, Response, PassOutcome]:
        """One round: the joint inference is local step 0; steps 1..Q-1 reuse stale statistics
        from the workset (models/workset.py): with W = 1 the others' parts of this very batch."""
        self.network.train()
        fresh = CachedBatch(blocks, input_nodes, h0_rows, labels)
        h = yield from self._forward(blocks, input_nodes, h0_rows, fresh.others, grad=True)
        fresh.own_output = h.detach()
        losses = [self._step(fresh, h, weights=None)]
        self.workset.add(fresh)
        for _ in range(1, self.config.stale):
            batch = self.workset.next_batch()
            # every aggregation layer is in batch.others: no request is made
            h = yield from self._forward(
                batch.blocks, batch.input_nodes, batch.h0_rows, batch.others, grad=True
            )
            weights = None
            if self.config.instance_weighting:
                assert batch.own_output is not None
                weights = instance_weights(
                    h.detach(), batch.own_output, threshold=self.config.weight_threshold
                )
            losses.append(self._step(batch, h, weights=weights))
        return PassOutcome(kind="train", loss=float(np.mean(losses)))

    def _step(self, batch: CachedBatch, h: torch.Tensor, *, weights: torch.Tensor | None) -> float:
        """One optimiser step on ``batch`` from its top-layer representation ``h``."""
        logits = self.network.classify(h, generator=self.generator)
        loss = weighted_cross_entropy(logits, batch.labels, weights)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._after_step(batch)
        return loss.item()

    def _after_step(self, batch: CachedBatch) -> None:
        """Called after every local step with the batch it used (the private client's reference
        model trains on the same batches)."""

    def _evaluate(
        self,
        blocks: Sequence[Block],
        input_nodes: torch.Tensor,
        h0_rows: Sequence[torch.Tensor],
        output_nodes: np.ndarray,
        labels: torch.Tensor,
    ) -> Generator[Request, Response, PassOutcome]:
        """Joint inference on the evaluation nodes; this client's own head predicts."""
        self.network.eval()
        h = yield from self._forward(blocks, input_nodes, h0_rows, {}, grad=False)
        with torch.no_grad():
            logits = self.network.classify(h, generator=self.generator)
        loss, val_accuracy, test_accuracy = self.scores(logits, labels, output_nodes)
        return PassOutcome(
            kind="eval", loss=loss, val_accuracy=val_accuracy, test_accuracy=test_accuracy
        )

    def scores(
        self, logits: torch.Tensor, labels: torch.Tensor, output_nodes: np.ndarray
    ) -> tuple[float, float | None, float | None]:
        """Validation loss, validation and test accuracy of ``logits`` on an evaluation pass."""
        correct = (logits.argmax(dim=1) == labels).cpu().numpy()
        output_nodes = np.asarray(output_nodes, dtype=np.int64)
        val = np.isin(output_nodes, self.partition.val_nodes)
        test = np.isin(output_nodes, self.partition.test_nodes)
        loss = float("nan")
        if val.any():
            rows = torch.from_numpy(val).to(self.device)
            loss = float(F.cross_entropy(logits[rows], labels[rows]).item())
        return (
            loss,
            float(correct[val].mean()) if val.any() else None,
            float(correct[test].mean()) if test.any() else None,
        )
