"""The private arrangement of the split GNN: differential privacy that holds end to end.

Each pass, a client releases exactly one matrix, at graph layer 1: a *fixed* map of its
features, ``clip_C(Â_1 · normalize(X_m) P_m)`` with ``P_m`` a Gaussian random projection drawn
from a public seed before any data is seen, clipped per row to norm C and noised. Everything else
it computes (its trainable layers, which read its clean features and the others' noisy release)
never leaves the client. So:

- the release's sensitivity to one node's features is data-independent (the map has no trained
  weights that could carry a node's influence into every row): Delta = 2C sqrt(c + 1) with the
  occurrence cap c enforced by the sampler at layer 1 (docs/privacy.md);
- everything a worker sends after its first release is either another release of the same kind
  (accounted by the ledger) or a node-id set (features do not enter it).

GLASU's trainable aggregation layers would send functions of weights trained on clean features;
their sensitivity is the whole matrix, which no useful noise level covers (notes/calibration.md).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from models.backbone import ClientNetwork
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.layers import Block
from models.layerwise import EVAL_CHUNK_NODES, Stack, propagate_all
from models.node_arrays import chunk_rows, node_array
from models.outcome import PassOutcome
from models.sampler import SampledLayer
from models.workset import CachedBatch
from secure.aggregation import EmbeddingCodec
from secure.dp import privatize
from secure.noise import GaussianNoise, NoiseSource, require_private_noise
from secure.privacy import RELEASE_LAYER, SessionPrivacy
from secure.protocol import Request, Response
from secure.release_noise import ReleaseMechanism, part_key, release_digest


@dataclass(frozen=True)
class ReleaseSettings:
    """The release everyone agreed on (session) and this client's noise."""

    width: int  # columns of the release
    clip: float  # C
    noise_std: float  # this client's standard deviation per coordinate
    noise: NoiseSource
    projection_seed: int  # public: the same for both runs of a neighbouring-dataset pair
    mechanism: ReleaseMechanism  # every parameter of the noise: part of each release's identity


class PrivateGlasuClient(GlasuClient):
    """A GLASU client whose only aggregation is the noisy layer-1 release."""

    def __init__(
        self,
        partition: ClientPartition,
        config: ClientConfig,
        *,
        release: ReleaseSettings,
        codec: EmbeddingCodec | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if config.agg_layers != (RELEASE_LAYER,):
            raise ValueError(
                f"the private arrangement releases at layer {RELEASE_LAYER} only, "
                f"got aggregation layers {config.agg_layers}"
            )
        if config.occurrence_cap is None:
            raise ValueError(
                "the private arrangement needs an occurrence cap (the sensitivity bound assumes it)"
            )
        if config.model.receiver_width != release.width:
            raise ValueError("model.receiver_width must equal the release width")
        self.release = release
        self._release_rows = np.empty(0, np.int64)  # node ids of the release's rows
        self._release_key = b""  # the digest of the release being sent
        super().__init__(partition, config, codec=codec, device=device)
        generator = torch.Generator().manual_seed(release.projection_seed)
        projection = (
            torch.randn(partition.features.shape[1], release.width, generator=generator)
            / release.width**0.5
        )
        self.projection = projection.to(self.device)
        receiver = self.network.receiver
        assert receiver is not None
        # Start as standalone training: the others' release enters only as far as it helps.
        torch.nn.init.zeros_(receiver.weight)
        torch.nn.init.zeros_(receiver.bias)
        # Bring the received block to unit scale: per coordinate, signal about C / sqrt(width)
        # and noise std from the M - 1 other shares (both public).
        m = partition.clients
        others_noise = release.noise_std * max(m - 1, 0) ** 0.5 / m
        signal = release.clip / release.width**0.5 * (m - 1) / m
        self.receiver_scale = 1.0 / max((signal**2 + others_noise**2) ** 0.5, 1e-12)
        # The party-alone reference: the same network, initialisation and dropout stream, trained
        # on the same batches, without the others' release. It never leaves this client; only
        # its accuracy is reported beside the federated one, so a user sees whether federating
        # paid (docs/privacy.md, "Did private federation pay?").
        self.reference = copy.deepcopy(self.network)
        self.reference_generator = torch.Generator(device=self.device)
        self.reference_generator.manual_seed(self.client_seed)
        self.reference_optimizer = torch.optim.Adam(
            self.reference.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )

    arrangement = "private"

    def state_dict(self) -> dict[str, Any]:
        """:meth:`GlasuClient.state_dict`, the party-alone reference (model, optimiser, dropout
        generator) and the release's noise (``secure.noise.NoiseSource.state_dict``: nothing for
        release-keyed noise, the generator of seeded test noise)."""
        return {
            **super().state_dict(),
            "reference": {
                "network": self.reference.state_dict(),
                "optimizer": self.reference_optimizer.state_dict(),
                "generator": self.reference_generator.get_state(),
            },
            "noise": self.release.noise.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back a :meth:`state_dict` (``secure.noise.NoiseStateError`` for another noise)."""
        super().load_state_dict(state)
        reference = state["reference"]
        self.reference.load_state_dict(reference["network"])
        self.reference_optimizer.load_state_dict(reference["optimizer"])
        self.reference_generator.set_state(reference["generator"])
        self.release.noise.load_state_dict(state["noise"])

    @property
    def gradient_layer(self) -> int | None:
        """None: the private arrangement sends nothing label-derived. With a single label holder
        the other clients only release; the holder trains on their releases."""
        return None

    def _begin_release(
        self, depth: int, clean: np.ndarray, *, part_rows: int, presence: np.ndarray | None
    ) -> None:
        """The digest of the whole clean release and of its mechanism (what the noise of a
        release-keyed source is derived from, and what the owner's gate records): every part of
        it carries it."""
        pass_index, output_nodes = self.current_pass
        self._release_key = release_digest(
            pass_index=pass_index,
            layer=depth,
            output_nodes=output_nodes,
            rows=self._release_rows,
            clean=clean,
            mechanism=self.release.mechanism,
            part_rows=part_rows,
            presence=presence,
        )
        self.pending_release = self._release_key.hex()

    def _release_part(self, depth: int, part: int, clean: np.ndarray) -> np.ndarray:
        """Clip and noise part ``part`` of the release, its noise keyed by the release's digest
        and the part (``secure.release_noise.part_key``): a function of the release, so a
        release computed again sends the identical parts."""
        return privatize(
            clean,
            clip=self.release.clip,
            noise_std=self.release.noise_std,
            noise=self.release.noise.for_release(part_key(self._release_key, part)),
        )

    def _fewest_shares(self) -> int:
        """With shared noise every client adds 1/M of the variance, so a sum of fewer than M
        shares carries less noise than accounted: only a sum of all M is taken."""
        if self.release.mechanism.shared_noise:
            return self.partition.clients
        return super()._fewest_shares()

    def release_map(self, block: Block, input_nodes: torch.Tensor) -> torch.Tensor:
        """The fixed, weight-free function of the features that is released (before clipping)."""
        # normalised as they are read: no normalised copy of the features
        rows = self._feature_rows(input_nodes)
        rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
        projected = rows @ self.projection
        return torch.sparse.mm(block.adjacency, projected)

    def _forward(
        self, batch: CachedBatch, *, grad: bool
    ) -> Generator[Request, Response, torch.Tensor]:
        others = batch.others
        if RELEASE_LAYER not in others:
            with torch.no_grad():
                released = self.release_map(batch.blocks[0], batch.input_nodes)
            rows = batch.input_nodes[batch.blocks[0].target_positions]
            self._release_rows = rows.cpu().numpy().astype(np.int64)
            others[RELEASE_LAYER] = yield from self._joint_aggregate(
                RELEASE_LAYER, released, presence=batch.presence.get(RELEASE_LAYER)
            )
        with torch.set_grad_enabled(grad):
            return self._local_forward(
                self.network,
                self.generator,
                batch.blocks,
                batch.input_nodes,
                batch.h0_rows,
                received=others[RELEASE_LAYER].others * self.receiver_scale,
            )

    def _local_forward(
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
        h0 = network.project(self._feature_rows(input_nodes), generator=generator)
        h = h0
        for depth, block in enumerate(blocks, start=1):
            initial = h0[h0_rows[depth - 1]] if network.uses_initial_residual else None
            h = network.propagate(depth, h, block, initial, generator=generator)
            if depth == RELEASE_LAYER and received is not None:
                assert network.receiver is not None
                h = h + network.receiver(received)
        return h

    def _after_step(self, batch: CachedBatch) -> None:
        """The reference takes the same local step on the same batch, unweighted."""
        if not self.holds_labels:
            return
        self.reference.train()
        h = self._local_forward(
            self.reference, self.reference_generator, batch.blocks, batch.input_nodes,
            batch.h0_rows, received=None,
        )  # fmt: skip
        logits = self.reference.classify(h, generator=self.reference_generator)
        loss = F.cross_entropy(logits, batch.labels)
        self.reference_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.reference_optimizer.step()

    def _infer_all(self) -> Generator[Request, Response, list[Stack]]:
        """Every layer of every aligned node: the release of all nodes (ONE capped sample of
        layer 1 over all of them, so one evaluation pass is one release), then the layers
        above it locally, for the network and (a client with labels) its party-alone
        reference on the same samples."""
        stacks = [self._all_nodes(self.network, self.generator)]
        if self.holds_labels:
            stacks.append(self._all_nodes(self.reference, self.reference_generator))
        released = node_array(self.partition.num_nodes, self.release.width, device=self.device)

        def release_chunk(block: Block, layer: SampledLayer) -> None:
            sources = torch.from_numpy(layer.sources).to(self.device)
            released[torch.from_numpy(layer.targets).to(self.device)] = self.release_map(
                block, sources
            )

        chunks = self._layer_chunks(RELEASE_LAYER)
        propagate_all(RELEASE_LAYER, stacks, chunks, device=self.device, on_chunk=release_chunk)
        self._release_rows = np.arange(self.partition.num_nodes, dtype=np.int64)
        extracted = yield from self._joint_aggregate(
            RELEASE_LAYER, released, presence=self._all_presence()
        )
        receiver = self.network.receiver
        assert receiver is not None
        with torch.no_grad():
            for span in chunk_rows(self.partition.num_nodes, chunk=EVAL_CHUNK_NODES):
                stacks[0].h[span] += receiver(extracted.others[span] * self.receiver_scale)
        for depth in range(RELEASE_LAYER + 1, self.layers + 1):
            propagate_all(depth, stacks, self._layer_chunks(depth), device=self.device)
        return stacks

    def _outcome(self, tops: Sequence[Stack], output_nodes: np.ndarray) -> PassOutcome:
        """The federated scores and the party-alone reference's."""
        scores = self._score(tops[1], output_nodes)
        return dataclasses.replace(
            super()._outcome(tops, output_nodes),
            reference_val_accuracy=scores.val_accuracy,
            reference_test_accuracy=scores.test_accuracy,
            reference_test_metrics=scores.test_metrics,
        )


#: Set to 1 in tests only: allows a fixed noise seed in a private run (the report then says the
#: noise was not private). Anywhere else a fixed seed in a run that reports epsilon is refused.
REPRODUCIBLE_NOISE_ENV = "GLASU_TEST_REPRODUCIBLE_NOISE"


def noise_source(*, noise_seed: int | None, client: int) -> GaussianNoise:
    """Cryptographic noise (a fresh ChaCha20 key per draw), or, for tests, noise from a fixed
    seed: refused (:class:`secure.noise.NotPrivateNoiseError`) unless ``REPRODUCIBLE_NOISE_ENV``
    is set, since its noise can be reproduced and removed."""
    if noise_seed is None:
        return GaussianNoise()
    noise = GaussianNoise(seed=noise_seed * 1000 + client)
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
    release = ReleaseSettings(
        width=config.model.receiver_width,
        clip=privacy.clip,
        noise_std=privacy.client_noise_std,
        noise=noise or noise_source(noise_seed=noise_seed, client=partition.client),
        projection_seed=release_projection_seed(seed=seed, client=partition.client),
        mechanism=ReleaseMechanism.of(
            privacy, width=config.model.receiver_width, encoding=codec.encoding
        ),
    )
    return PrivateGlasuClient(partition, config, release=release, codec=codec, device=device)
