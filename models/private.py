"""The private arrangement of the split GNN: differential privacy that holds end to end.

Each pass, a client releases exactly one matrix, at graph layer 1: a *fixed* map of its
features, ``clip_C(Â_1 · normalize(X_m) P_m)`` with ``P_m`` a Gaussian random projection drawn
from a public seed before any data is seen, clipped per row to norm C and noised. Everything else
it computes (its trainable layers, which read its clean features and the others' noisy release)
never leaves the client. So:

- the release's sensitivity to one node's features is data-independent (the map has no trained
  weights that could carry a node's influence into every row): Delta = 2C sqrt(c + 1) with the
  occurrence cap c enforced by the sampler at layer 1 (docs/privacy.md); with the session's
  ``release: "degree-normalised"`` each node's projected row is clipped first and the mean
  divides by max(degree, d_min) (:func:`degree_normalised_aggregate`): 2C sqrt(c + 1) / d_min;
- everything a worker sends after its first release is either another release of the same kind
  (accounted by the ledger) or a node-id set (features do not enter it).

GLASU's trainable aggregation layers would send functions of weights trained on clean features;
their sensitivity is the whole matrix, which no useful noise level covers (notes/calibration.md).

Here: the arrangement (:class:`PrivateArrangement`: the released map, the receiver, the
party-alone reference) and :func:`make_client`, the one factory of a run's clients, which gives
a private client this arrangement and the clipping and noising release policy
(``models.release.DpRelease``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from models.arrangement import Arrangement, batch_rows
from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.layers import Block
from models.layerwise import EVAL_CHUNK_NODES, Stack, propagate_all
from models.node_arrays import chunk_rows, node_array
from models.outcome import PassOutcome
from models.release import DpRelease, PassContext, ReleaseSettings
from models.sampler import SampledLayer
from models.workset import CachedBatch
from secure.aggregation import EmbeddingCodec
from secure.discrete_gaussian import DiscreteGaussianNoise
from secure.noise import GaussianNoise, NoiseSource, require_private_noise
from secure.privacy import RELEASE_LAYER, SessionPrivacy
from secure.protocol import Request, Response
from secure.release_noise import ReleaseMechanism


class PrivateArrangement(Arrangement):
    """The private arrangement of ``client``: its only aggregation is the noisy layer-1 release
    of ``settings``, and a party-alone reference trains beside its network."""

    name = "private"

    def __init__(self, client: GlasuClient, *, settings: ReleaseSettings) -> None:
        super().__init__(client)
        config, partition = client.config, client.partition
        if config.agg_layers != (RELEASE_LAYER,):
            raise ValueError(
                f"the private arrangement releases at layer {RELEASE_LAYER} only, "
                f"got aggregation layers {config.agg_layers}"
            )
        if config.occurrence_cap is None:
            raise ValueError(
                "the private arrangement needs an occurrence cap (the sensitivity bound assumes it)"
            )
        if config.model.receiver_width != settings.width:
            raise ValueError("model.receiver_width must equal the release width")
        self.width = settings.width
        self.clip = settings.clip
        self.degree_floor = settings.mechanism.degree_floor  # None: the clip-after release
        projection = release_projection(
            partition.num_features, settings.width, seed=settings.projection_seed
        )
        self.projection = projection.to(client.device)
        receiver = client.network.receiver
        assert receiver is not None
        # Start as standalone training: the others' release enters only as far as it helps.
        torch.nn.init.zeros_(receiver.weight)
        torch.nn.init.zeros_(receiver.bias)
        # Bring the received block to unit scale: per coordinate, signal about C / sqrt(width)
        # and noise std from the M - 1 other shares (both public).
        m = partition.clients
        others_noise = settings.noise_std * max(m - 1, 0) ** 0.5 / m
        signal = settings.clip / settings.width**0.5 * (m - 1) / m
        self.receiver_scale = 1.0 / max((signal**2 + others_noise**2) ** 0.5, 1e-12)
        # The party-alone reference: the same network, initialisation and dropout stream, trained
        # on the same batches, without the others' release. It never leaves this client; only
        # its accuracy is reported beside the federated one, so a user sees whether federating
        # paid (docs/privacy.md, "Did private federation pay?").
        self.reference = copy.deepcopy(client.network)
        self.reference_generator = torch.Generator(device=client.device)
        self.reference_generator.manual_seed(client.client_seed)
        self.reference_optimizer = torch.optim.Adam(
            self.reference.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )

    def state_dict(self) -> dict[str, Any]:
        """The party-alone reference (model, optimiser, dropout generator)."""
        return {
            "reference": {
                "network": self.reference.state_dict(),
                "optimizer": self.reference_optimizer.state_dict(),
                "generator": self.reference_generator.get_state(),
            }
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        reference = state["reference"]
        self.reference.load_state_dict(reference["network"])
        self.reference_optimizer.load_state_dict(reference["optimizer"])
        self.reference_generator.set_state(reference["generator"])

    # gradient_layer: None (the base's). The private arrangement sends nothing label-derived:
    # with a single label holder the other clients only release; the holder trains on theirs.

    def release_map(self, block: Block, input_nodes: torch.Tensor) -> torch.Tensor:
        """The fixed, weight-free function of the features that is released (before the final
        clip): the mean over each target's drawn neighbourhood of the projected rows, or
        degree-normalised (:func:`degree_normalised_aggregate`)."""
        # normalised as they are read: no normalised copy of the features
        projected = normalised_projection(self.client.feature_rows(input_nodes), self.projection)
        if self.degree_floor is None:
            return torch.sparse.mm(block.adjacency, projected)
        return degree_normalised_aggregate(
            block, projected, clip=self.clip, degree_floor=self.degree_floor
        )

    def forward(
        self, context: PassContext, batch: CachedBatch, *, grad: bool
    ) -> Generator[Request, Response, torch.Tensor]:
        """The release of this batch (the joint inference), unless it is in ``batch.others``;
        then every layer locally, the others' scaled release entering at the release layer."""
        client = self.client
        others = batch.others
        if RELEASE_LAYER not in others:
            with torch.no_grad():
                released = self.release_map(batch.blocks[0], batch.input_nodes)
            others[RELEASE_LAYER] = yield from client.joint.aggregate(
                context, RELEASE_LAYER, released, rows=batch_rows(batch, RELEASE_LAYER),
                presence=batch.presence.get(RELEASE_LAYER),
            )  # fmt: skip
        with torch.set_grad_enabled(grad):
            return self.local_forward(
                client.network,
                client.generator,
                batch.blocks,
                batch.input_nodes,
                batch.h0_rows,
                received=others[RELEASE_LAYER].others * self.receiver_scale,
            )

    def local_forward(
        self,
        network: ClientNetwork,
        generator: torch.Generator,
        blocks: Sequence[Block],
        input_nodes: torch.Tensor,
        h0_rows: Sequence[torch.Tensor],
        *,
        received: torch.Tensor | None,
    ) -> torch.Tensor:
        """All L layers of ``network`` on this client's own features, the scaled release of the
        others (if any) entering at the release layer."""
        h0 = network.project(self.client.feature_rows(input_nodes), generator=generator)
        h = h0
        for depth, block in enumerate(blocks, start=1):
            initial = h0[h0_rows[depth - 1]] if network.uses_initial_residual else None
            h = network.propagate(depth, h, block, initial, generator=generator)
            if depth == RELEASE_LAYER and received is not None:
                assert network.receiver is not None
                h = h + network.receiver(received)
        return h

    def after_step(self, batch: CachedBatch) -> None:
        """The reference takes the same local step on the same batch, unweighted."""
        if not self.client.holds_labels:
            return
        self.reference.train()
        h = self.local_forward(
            self.reference, self.reference_generator, batch.blocks, batch.input_nodes,
            batch.h0_rows, received=None,
        )  # fmt: skip
        logits = self.reference.classify(h, generator=self.reference_generator)
        loss = F.cross_entropy(logits, batch.labels)
        self.reference_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.reference_optimizer.step()

    def infer_all(self, context: PassContext) -> Generator[Request, Response, list[Stack]]:
        """The release of all nodes (ONE capped sample of layer 1 over all of them, so one
        evaluation pass is one release), then the layers above it locally, for the network and
        (a client with labels) its party-alone reference on the same samples."""
        client = self.client
        evaluation, device = client.evaluation, client.device
        num_nodes = client.partition.num_nodes
        stacks = [evaluation.all_nodes(client.network, client.generator)]
        if client.holds_labels:
            stacks.append(evaluation.all_nodes(self.reference, self.reference_generator))
        released = node_array(num_nodes, self.width, device=device)

        def release_chunk(block: Block, layer: SampledLayer) -> None:
            sources = torch.from_numpy(layer.sources).to(device)
            released[torch.from_numpy(layer.targets).to(device)] = self.release_map(block, sources)

        chunks = evaluation.layer_chunks(RELEASE_LAYER)
        propagate_all(RELEASE_LAYER, stacks, chunks, device=device, on_chunk=release_chunk)
        extracted = yield from client.joint.aggregate(
            context, RELEASE_LAYER, released,
            rows=evaluation.all_rows(), presence=evaluation.all_presence(),
        )  # fmt: skip
        receiver = client.network.receiver
        assert receiver is not None
        with torch.no_grad():
            for span in chunk_rows(num_nodes, chunk=EVAL_CHUNK_NODES):
                stacks[0].h[span] += receiver(extracted.others[span] * self.receiver_scale)
        for depth in range(RELEASE_LAYER + 1, client.layers + 1):
            propagate_all(depth, stacks, evaluation.layer_chunks(depth), device=device)
        return stacks

    def outcome(self, tops: Sequence[Stack], output_nodes: np.ndarray) -> PassOutcome:
        """The federated scores and the party-alone reference's."""
        scores = self.client.evaluation.score(tops[1], output_nodes)
        return dataclasses.replace(
            super().outcome(tops, output_nodes),
            reference_val_accuracy=scores.val_accuracy,
            reference_test_accuracy=scores.test_accuracy,
            reference_test_metrics=scores.test_metrics,
        )


def release_projection(num_features: int, width: int, *, seed: int) -> torch.Tensor:
    """P_m: the (features x width) Gaussian random projection of a party's release, drawn from
    the public ``seed`` (:func:`release_projection_seed`) before any data is seen."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_features, width, generator=generator) / width**0.5


def normalised_projection(rows: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """normalize(rows) P: each feature row scaled to unit L2 norm (a zero row stays zero), then
    projected."""
    return (rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ projection


def degree_normalised_aggregate(
    block: Block, rows: torch.Tensor, *, clip: float, degree_floor: int
) -> torch.Tensor:
    """The degree-normalised release of ``rows`` (one per source of ``block``): every row
    clipped to L2 norm ``clip`` on its own, then each target's clipped rows (itself and its
    drawn neighbours: the block's edges, self-loops included) summed and divided by
    ``max(degree, degree_floor)``. Its sensitivity is ``secure.dp.degree_normalised_sensitivity``
    (docs/privacy.md 3.7). In float64 so that the clip holds to the last bit; the result has the
    dtype of ``rows``."""
    own = rows.double()
    norms = own.norm(dim=1, keepdim=True)
    own = own * (clip / norms.clamp_min(1e-300)).clamp(max=1.0)
    # a row the rescaling left a few ulps above the bound: pull it below (as clip_rows does)
    own = own * torch.where(own.norm(dim=1, keepdim=True) > clip, 1.0 - 2.0**-48, 1.0)
    sources, targets = block.edge_index
    degree = torch.bincount(targets, minlength=block.num_targets).clamp_min(degree_floor)
    weights = torch.sparse_coo_tensor(
        torch.stack([targets, sources]),
        1.0 / degree[targets].double(),
        (block.num_targets, own.shape[0]),
        check_invariants=False,
    )
    return torch.sparse.mm(weights, own).to(rows.dtype)


#: Set to 1 in tests only: allows a fixed noise seed in a private run (the report then says the
#: noise was not private). Anywhere else a fixed seed in a run that reports epsilon is refused.
REPRODUCIBLE_NOISE_ENV = "GLASU_TEST_REPRODUCIBLE_NOISE"


def noise_source(*, noise_seed: int | None, client: int, split: bool = False) -> GaussianNoise:
    """Cryptographic noise (a fresh ChaCha20 key per draw), or, for tests, noise from a fixed
    seed: refused (:class:`secure.noise.NotPrivateNoiseError`) unless ``REPRODUCIBLE_NOISE_ENV``
    is set, since its noise can be reproduced and removed. ``split``: a party's share of split
    noise, exact discrete Gaussians on the share grid (docs/privacy.md section 11)."""
    kind = DiscreteGaussianNoise if split else GaussianNoise
    if noise_seed is None:
        return kind()
    noise = kind(seed=noise_seed * 1000 + client)
    require_private_noise(noise, allow_reproducible=os.environ.get(REPRODUCIBLE_NOISE_ENV) == "1")
    return noise


def release_projection_seed(*, seed: int, client: int) -> int:
    """Public and data-independent: fixed by the session seed and the client index."""
    return int(np.random.SeedSequence([seed, client, 0x5EED]).generate_state(1)[0])


def make_client(
    partition: ClientPartition,
    config: ClientConfig,
    *,
    codec: EmbeddingCodec,
    device: torch.device | str,
    privacy: SessionPrivacy | None,
    seed: int,
    noise_seed: int | None = None,
    noise: NoiseSource | None = None,
) -> GlasuClient:
    """The client a run needs: plain GLASU, or the private arrangement with its release (whose
    width is the model's receiver width). ``noise``: the source of the release's noise
    (default: :func:`noise_source`)."""
    if privacy is None:
        return GlasuClient(partition, config, codec=codec, device=device)
    width = config.model.receiver_width
    mechanism = ReleaseMechanism.of(privacy, width=width, encoding=codec.encoding)
    settings = ReleaseSettings(
        width=width,
        clip=privacy.clip,
        noise_std=mechanism.noise_std,
        noise=noise
        or noise_source(noise_seed=noise_seed, client=partition.client, split=privacy.split_noise),
        projection_seed=release_projection_seed(seed=seed, client=partition.client),
        mechanism=mechanism,
    )
    if mechanism.split_noise:
        codec = codec.for_split_noise(clip=privacy.clip, noise_std=mechanism.noise_std)
    return GlasuClient(
        partition, config, codec=codec, device=device, release=DpRelease(settings),
        arrangement=functools.partial(PrivateArrangement, settings=settings),
    )  # fmt: skip
