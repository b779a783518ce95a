"""The private ``sign`` design (docs/privacy.md 3.8): each party releases ONE degree-normalised
aggregate of its features for the whole session, propagates the noisy release over its own graph
(post-processing), and every receiver trains the sign head locally on its own propagated
features beside the sum of the others' released blocks.

Privacy unit: one node's feature row at one party, replace-one; edges are not protected.

1. Party m: ``H0 = clip_C(normalize(X_m) P_m)`` per row (``P_m`` the public-seed projection of
   ``models.private``), ``H1`` its degree-normalised aggregate over ONE capped draw of every
   aligned node (``models.private.degree_normalised_aggregate``: at most ``c + 1`` rows hold a
   node, each divided by ``max(degree, d_min)``), plus Gaussian noise of std ``z * 2C sqrt(c + 1)
   / d_min`` (``secure.dp.degree_normalised_sensitivity``). This is the party's only release.
2. The party propagates the noisy ``H1`` K - 1 more hops over its own graph (Â = D^-1/2 (A + I)
   D^-1/2, ``models.data.propagation``) and hands on ``[H1, Â H1, ..., Â^(K-1) H1]``: features
   do not enter again, so the hops cost no budget, and the party's dense graph averages the
   noise away before anyone else sees it (which a receiver could not do with its own graph).
3. A receiver (every party with labels) gets the sum over the other parties of their blocks (the
   service only ever returns sums; here a plain sum) and trains the sign head on its own hops
   ``[X, ÂX, ..., Â^K X]`` with the received block beside them (hop k of the block beside its own
   hop k; hop 0 of the block is zero, the partners' raw features are never released), each
   column standardised; its party-alone head trains beside it as the run's reference. Training
   and every evaluation read the same release: post-processing.

Split or shared noise does not apply: each party propagates its noisy ``H1`` before the sum, so
the sum does not carry one Gaussian of the summed variance (docs/privacy.md 3.8); both are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from models.client_config import ClientConfig
from models.config import TrainConfig
from models.data.partition import ClientPartition
from models.data.propagation import (
    PROPAGATION_CHUNK_NODES,
    HopFeatures,
    propagate_hops,
    scale_statistics,
)
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.joint import JointAggregation
from models.layers import Block
from models.layerwise import EVAL_CHUNK_NODES
from models.node_arrays import chunk_rows, node_array
from models.outcome import PassOutcome
from models.private import (
    degree_normalised_aggregate,
    noise_source,
    normalised_projection,
    release_projection,
    release_projection_seed,
)
from models.sampler import NeighbourSampler, SamplingGraph, sampling_rng
from secure.aggregation import PlainSumAggregator
from secure.dp import degree_normalised_sensitivity
from secure.noise import NoiseSource
from secure.privacy import RELEASE_LAYER, SessionPrivacy
from secure.protocol import Request, Response

CPU = torch.device("cpu")


@dataclass(frozen=True)
class SignRelease:
    """What fixes one party's release: the projection's width and seed, the row clip C, the
    occurrence cap c and the degree floor d_min of the draw, and the noise std (z * Delta)."""

    width: int
    projection_seed: int
    clip: float
    occurrence_cap: int
    degree_floor: int
    noise_std: float

    @property
    def sensitivity(self) -> float:
        return degree_normalised_sensitivity(
            clip=self.clip, occurrence_cap=self.occurrence_cap, degree_floor=self.degree_floor
        )


def receiving(partitions: Sequence[ClientPartition], label_holder: int | None) -> list[int]:
    """The receivers: every party with labels (all, or the label holder)."""
    return [p.client for p in partitions if label_holder in (None, p.client)]


def senders(partitions: Sequence[ClientPartition], label_holder: int | None) -> list[int]:
    """The parties that release: each whose block another party's head reads (with one label
    holder, every party but the holder). The ledger counts one release for each."""
    holders = set(receiving(partitions, label_holder))
    return [p.client for p in partitions if holders - {p.client}]


#: A private sign session's one pass (over the service: a session of kind "release")
RELEASE_PASS = 0


def sign_release_config(config: TrainConfig) -> TrainConfig:
    """``config`` with the design's release: degree-normalised, at its cap and floor (what
    ``privacy_request`` then asks of the service)."""
    if config.shared_noise or config.splits_noise:
        raise ValueError(
            "the private sign design adds each party's whole noise to its own release: shared "
            "or split noise does not apply (each party propagates its noisy release before the "
            "sum, docs/privacy.md 3.8); leave --shared-noise and --split-noise off"
        )
    return dataclasses.replace(
        config,
        release="degree-normalised",
        occurrence_cap=config.sign_occurrence_cap,
        degree_floor=config.sign_degree_floor,
    )


def sign_privacy(config: TrainConfig, *, clients: int) -> SessionPrivacy:
    """The session's privacy plan: ONE degree-normalised release per party at the design's cap
    and floor, z calibrated by the project's accountant for ``config``'s epsilon and delta."""
    planned = sign_release_config(config).session_privacy(clients=clients, passes_total=1)
    assert planned is not None
    return planned


def design_note(privacy: SessionPrivacy, *, releasing: Sequence[int], hops: int) -> str:
    """The run summary's note on the design's one release (in process and over the service)."""
    return (
        f"privacy: the private sign design: one degree-normalised release per party "
        f"(parties {list(releasing)}; cap {privacy.occurrence_cap}, floor "
        f"{privacy.degree_floor}, sensitivity {privacy.sensitivity:.4g}, z "
        f"{privacy.noise_multiplier:.4g}), propagated {hops - 1} more hops by its sender; "
        "training and every evaluation are post-processing of it (docs/privacy.md 3.8)"
    )


def release_settings(privacy: SessionPrivacy, *, width: int, seed: int, party: int) -> SignRelease:
    return SignRelease(
        width=width,
        projection_seed=release_projection_seed(seed=seed, client=party),
        clip=privacy.clip,
        occurrence_cap=privacy.occurrence_cap,
        degree_floor=privacy.degree_floor,
        noise_std=privacy.client_noise_std,
    )


def clean_release(partition: ClientPartition, release: SignRelease, *, seed: int) -> torch.Tensor:
    """(N, width) H1 before the noise: every aligned node a target of ONE capped draw of the
    party's graph (fanout d_min - 1, so that a full neighbourhood sums d_min rows; seeded, no
    feature enters the draw), its rows degree-normalised."""
    graph = SamplingGraph.from_edge_index(partition.edge_index, num_nodes=partition.num_nodes)
    sampler = NeighbourSampler(
        graph, fanout=release.degree_floor - 1, occurrence_cap=release.occurrence_cap
    )
    projection = release_projection(
        partition.num_features, release.width, seed=release.projection_seed
    )
    rng = sampling_rng(seed=seed, client=partition.client, pass_index=None, layer=RELEASE_LAYER)
    released = node_array(partition.num_nodes, release.width, device=CPU)
    for layer in sampler.sample_all(chunk=EVAL_CHUNK_NODES, rng=rng):
        block = Block.from_sampled(layer, CPU)
        rows = normalised_projection(partition.feature_rows(layer.sources), projection)
        released[torch.from_numpy(layer.targets)] = degree_normalised_aggregate(
            block, rows, clip=release.clip, degree_floor=release.degree_floor
        )
    return released


def released_block(
    partition: ClientPartition,
    release: SignRelease,
    *,
    hops: int,
    noise: NoiseSource,
    seed: int,
    clean: torch.Tensor | None = None,
) -> HopFeatures:
    """Party ``partition``'s one release, noised, and its K - 1 further hops over the party's own
    graph (post-processing): ``[H1, Â H1, ..., Â^(K-1) H1]``. ``clean``: the release before
    the noise (:func:`clean_release`) where the caller computed it already (noised in place)."""
    if hops < 1:
        raise ValueError(f"the private sign design propagates 1 hop at least, got {hops}")
    released = clean_release(partition, release, seed=seed) if clean is None else clean
    released += torch.from_numpy(noise.sample(tuple(released.shape), std=release.noise_std))
    if partition.held is not None:  # over the union: nothing for a node it lacks (post-processing)
        released[torch.from_numpy(~partition.held)] = 0.0
    noisy = dataclasses.replace(partition, features=released, rows_of_nodes=None)
    return propagate_hops(noisy, hops=hops - 1)


def received_hops(
    blocks: Sequence[HopFeatures], *, num_nodes: int, width: int, hops: int
) -> HopFeatures:
    """The sum of the other parties' blocks (``hops`` hops each), hop by hop, after a zero hop 0
    (what the service's sum gives a receiver); zeros where no other party released."""
    summed = []
    for hop in range(hops + 1):
        total = node_array(num_nodes, width, device=CPU)
        for span in chunk_rows(num_nodes, chunk=PROPAGATION_CHUNK_NODES):
            total[span] = 0.0
            if hop > 0:
                for block in blocks:
                    total[span] += block.hops[hop - 1][span]
        summed.append(total)
    return HopFeatures(tuple(summed))


def block_rows(block: HopFeatures, span: slice) -> np.ndarray:
    """Rows ``span`` of a released block as its sender uploads them: its hops side by side
    (``[H1, Â H1, ..., Â^(K-1) H1]``, float32)."""
    return torch.cat([hop[span] for hop in block.hops], dim=1).numpy()


def hops_of_sum(summed: torch.Tensor, *, width: int, hops: int) -> HopFeatures:
    """The others' blocks as :func:`received_hops` gives them, from their sum over the service
    (``summed``: N x hops * width, in :func:`block_rows`'s order): a zero hop 0, then the
    sum's hops."""
    if summed.shape[1] != width * hops:
        raise ValueError(f"a sum of {summed.shape[1]} columns is not {hops} hops of {width}")
    zero = node_array(len(summed), width, device=CPU)
    zero.zero_()
    return HopFeatures((zero, *summed.split(width, dim=1)))


def beside(own: HopFeatures, received: HopFeatures) -> HopFeatures:
    """Hop k of the receiver's own features beside hop k of the received block."""
    out = []
    for mine, theirs in zip(own.hops, received.hops, strict=True):
        rows, width = len(mine), mine.shape[1]
        both = node_array(rows, width + theirs.shape[1], device=CPU)
        for span in chunk_rows(rows, chunk=PROPAGATION_CHUNK_NODES):
            both[span, :width] = mine[span]
            both[span, width:] = theirs[span]
        out.append(both)
    return HopFeatures(tuple(out))


def interleaved(own: torch.Tensor, received: torch.Tensor, *, hops: int) -> torch.Tensor:
    """Per-column statistics of :func:`beside`'s rows from those of its two parts."""
    pairs = zip(own.chunk(hops), received.chunk(hops), strict=True)
    return torch.cat([torch.cat(pair) for pair in pairs])


@dataclass
class SignReceiver:
    """A party with labels: its head on its own hops beside the received block, and the
    party-alone reference on its own hops (the same network and training, no block)."""

    client: GlasuClient
    reference: GlasuClient


def receiver_config(config: ClientConfig) -> ClientConfig:
    """A receiver trains alone (its one aggregation layer its own, as standalone training), on
    the precomputed hops: no release, no sampling cap, no gradient to broadcast."""
    return dataclasses.replace(
        config,
        agg_layers=(config.model.layers,),
        stale=1,
        occurrence_cap=None,
        label_holder=None,
        count_aware=False,
    )


def make_receiver(
    partition: ClientPartition,
    config: ClientConfig,
    received: HopFeatures,
    *,
    device: torch.device,
) -> SignReceiver:
    """``partition``'s head and reference; the received block's columns are standardised over
    the party's held nodes, its own columns scaled as the party's sign model scales them."""
    alone = dataclasses.replace(partition, clients=1)
    reference = GlasuClient(alone, config, device=device)
    assert reference.hop_features is not None and reference.feature_scale is not None
    own = reference.hop_features
    client = GlasuClient(alone, config, device=device, hop_features=beside(own, received))
    assert client.network.scale is not None
    hops = len(own.hops)
    own_shift, own_factor = scale_statistics(own, partition.held, scale=reference.feature_scale)
    block_shift, block_factor = scale_statistics(received, partition.held, scale="column")
    client.network.scale.set_statistics(
        interleaved(own_shift, block_shift, hops=hops).to(device),
        interleaved(own_factor, block_factor, hops=hops).to(device),
    )
    return SignReceiver(client=client, reference=reference)


def sign_blocks(
    config: TrainConfig,
    partitions: Sequence[ClientPartition],
    privacy: SessionPrivacy,
    *,
    noise: Sequence[NoiseSource] | None = None,
) -> dict[int, HopFeatures]:
    """Every party that some receiver needs releases once (:func:`released_block`): its block
    by party. ``noise``: each party's noise source (default: ``models.private.noise_source``)."""
    blocks = {}
    for m in senders(partitions, config.label_holder):
        part = partitions[m]
        release = release_settings(privacy, width=config.release_width, seed=config.seed, party=m)
        source = noise[m] if noise is not None else noise_source(
            noise_seed=config.noise_seed, client=m
        )  # fmt: skip
        blocks[m] = released_block(part, release, hops=config.hops, noise=source, seed=config.seed)
    return blocks


def sign_receivers(
    config: TrainConfig,
    partitions: Sequence[ClientPartition],
    client_config: ClientConfig,
    privacy: SessionPrivacy,
    *,
    device: torch.device,
    noise: Sequence[NoiseSource] | None = None,
    blocks: Mapping[int, HopFeatures] | None = None,
) -> list[SignReceiver]:
    """Each party with labels gets the sum of the others' blocks (``blocks``, default:
    :func:`sign_blocks`) and its :class:`SignReceiver`."""
    local = receiver_config(client_config)
    if blocks is None:
        blocks = sign_blocks(config, partitions, privacy, noise=noise)
    receivers = []
    for r in receiving(partitions, config.label_holder):
        part = partitions[r]
        received = received_hops(
            [b for m, b in blocks.items() if m != r],
            num_nodes=part.num_nodes,
            width=config.release_width,
            hops=config.hops,
        )
        receivers.append(make_receiver(part, local, received, device=device))
    return receivers


def receiver_outcome(
    receiver: SignReceiver, *, pass_index: int, kind: str, output_nodes: np.ndarray
) -> PassOutcome:
    """One local pass of a receiver's head (a training step or an evaluation), its party-alone
    reference's beside it: no exchange, each alone (a plain sum of one share)."""
    own, alone = (
        run_pass_inprocess(
            [client], PlainSumAggregator(),
            pass_index=pass_index, kind=kind, output_nodes=output_nodes,
        )[0]
        for client in (receiver.client, receiver.reference)
    )  # fmt: skip
    return dataclasses.replace(
        own,
        reference_val_accuracy=alone.val_accuracy,
        reference_test_accuracy=alone.test_accuracy,
        reference_test_metrics=alone.test_metrics,
    )


def exchange_release(
    joint: JointAggregation,
    block: HopFeatures | None,
    *,
    rows: int,
    width: int,
    hops: int,
    release: str | None,
) -> Generator[Request, Response, HopFeatures]:
    """A worker's share of its private sign session's one pass, in parts (sans-IO, as every
    share travels: ``JointAggregation.exchange_parts``): its released ``block`` over every
    aligned node (``release``: its digest, which the owner's gate records), or zeros where it
    releases nothing (a label holder with the only labels: no release, no gate). Returns the
    others' blocks (:func:`hops_of_sum`): the sum less what it sent."""
    others = yield from exchange_rows(
        joint,
        None if block is None else lambda start, stop: block_rows(block, slice(start, stop)),
        nodes=np.arange(rows, dtype=np.int64),
        cols=width * hops,
        release=release,
        disclosure=block is None,
    )
    return hops_of_sum(others, width=width, hops=hops)


def exchange_rows(
    joint: JointAggregation,
    rows_of: Callable[[int, int], np.ndarray] | None,
    *,
    nodes: np.ndarray,
    cols: int,
    release: str | None,
    disclosure: bool,
) -> Generator[Request, Response, torch.Tensor]:
    """The block rows of ``nodes`` through the service's sum, in parts: ``rows_of(start,
    stop)`` makes rows ``start:stop`` of this worker's share (None: zeros); returns the sum
    less what it sent (len(nodes) x cols)."""
    rows = len(nodes)
    others = node_array(rows, cols, device=CPU)

    def share_of(part: int, start: int, stop: int) -> np.ndarray:
        if rows_of is None:
            return np.zeros((stop - start, cols), dtype=np.float32)
        return joint.within_bound(rows_of(start, stop))

    def on_sum(start: int, stop: int, sent: np.ndarray, total: np.ndarray, shares: int) -> None:
        others[start:stop] = torch.from_numpy(total - sent)

    yield from joint.exchange_parts(
        RELEASE_LAYER, pass_index=RELEASE_PASS, rows=rows, cols=cols, share_of=share_of,
        on_sum=on_sum, release=release, nodes=nodes, disclosure=disclosure,
    )  # fmt: skip
    return others
