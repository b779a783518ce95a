"""The private sign design (models/private_sign.py, docs/privacy.md 3.8), without HTTP: its one
release brute-forced on adversarial graphs (one node's features changed, the L2 change of H1
never above ``secure.dp.degree_normalised_sensitivity``, reached at a star's hub held at the
cap; dropping the floor or the cap breaks it), the later hops as post-processing of the noisy
release, the receivers' sum, and a run's ledger: one release per releasing party, whatever the
rounds and evaluations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import models.private_sign as private_sign
from models.config import TrainConfig
from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures, propagate_hops
from models.layout import client_config
from models.private import REPRODUCIBLE_NOISE_ENV
from models.private_sign import (
    SignRelease,
    beside,
    clean_release,
    received_hops,
    released_block,
    senders,
    sign_privacy,
    sign_receivers,
)
from models.sampler import SamplingGraph
from models.trainer import train_inprocess
from secure.noise import GaussianNoise
from tests.models.test_degree_release import GRAPHS, IN_FEATURES, replacements, star

CLIP = 0.25  # below the projected rows' norms (about 1), so each own row's clip binds
WIDTH = 16


def as_partition(graph: SamplingGraph, features: np.ndarray) -> ClientPartition:
    """One party holding ``graph`` (both directions of its edges) and ``features``."""
    n = graph.num_nodes
    targets = np.repeat(np.arange(n), np.diff(graph.indptr))
    edges = np.stack([targets, graph.neighbours[: len(targets)].astype(np.int64)])
    return ClientPartition(
        client=0, clients=2, dataset="toy", feature_columns=np.arange(features.shape[1]),
        features=torch.from_numpy(features).float(), edge_index=torch.from_numpy(edges),
        labels=torch.zeros(n, dtype=torch.long), train_nodes=np.arange(n),
        val_nodes=np.arange(n), test_nodes=np.arange(n),
    )  # fmt: skip


def release_of(*, cap: int, floor: int) -> SignRelease:
    return SignRelease(
        width=WIDTH, projection_seed=0, clip=CLIP, occurrence_cap=cap, degree_floor=floor,
        noise_std=0.0,
    )  # fmt: skip


ADVERSARIAL = {**GRAPHS, "big star": lambda: star(30)}


def worst_ratio(drawn: SignRelease, bounded: SignRelease) -> float:
    """The largest L2 change of H1 (computed with ``drawn``'s cap and floor) over ``bounded``'s
    Delta, over every graph, draw seed, changed node and change (the node's row negated, a
    random one, a one-hot one, the zero row)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for build in ADVERSARIAL.values():
        graph, n = build()
        features = rng.normal(size=(n, IN_FEATURES))
        for seed in range(2):
            base = clean_release(as_partition(graph, features), drawn, seed=seed).double()
            for v in range(n):
                for changed in replacements(features, v, rng):
                    other = features.copy()
                    other[v] = changed
                    after = clean_release(as_partition(graph, other), drawn, seed=seed).double()
                    moved = float(torch.linalg.vector_norm(after - base))
                    worst = max(worst, moved / bounded.sensitivity)
    return worst


@pytest.mark.parametrize(("cap", "floor"), [(7, 8), (1, 4), (3, 2)])
def test_one_node_never_moves_the_release_by_more_than_delta(cap: int, floor: int) -> None:
    release = release_of(cap=cap, floor=floor)
    worst = worst_ratio(release, release)
    assert worst <= 1 + 1e-6, worst  # float32 rows: the bound to float32 rounding
    if floor == cap + 1:
        # the star's hub is drawn by exactly `cap` leaves and sums d_min rows itself: negating
        # its features moves cap + 1 rows by 2C / d_min each
        assert worst >= 0.999, worst
    else:
        assert worst > 0.3, worst


def test_without_the_floor_the_bound_fails() -> None:
    """Dividing by the degree alone: a leaf that drew only the hub moves by C, not 2C / d_min."""
    assert worst_ratio(release_of(cap=7, floor=1), release_of(cap=7, floor=8)) > 1.5


def test_without_the_cap_the_bound_fails() -> None:
    """A cap the draw does not keep: the big star's hub enters every one of its 30 leaves' rows."""
    assert worst_ratio(release_of(cap=1000, floor=8), release_of(cap=7, floor=8)) > 1.5


def test_the_later_hops_propagate_the_noisy_release_only(monkeypatch) -> None:
    """The block is [H1 + noise, Â (H1 + noise), ...]: the features enter through H1 alone."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    graph, n = star(12)
    part = as_partition(graph, np.random.default_rng(1).normal(size=(n, IN_FEATURES)))
    release = dataclasses.replace(release_of(cap=7, floor=8), noise_std=0.3)
    block = released_block(part, release, hops=3, noise=GaussianNoise(seed=5), seed=0)
    noisy = clean_release(part, release, seed=0).double()
    noisy += torch.from_numpy(GaussianNoise(seed=5).sample(tuple(noisy.shape), std=0.3))
    expected = propagate_hops(dataclasses.replace(part, features=noisy.float()), hops=2)
    assert len(block.hops) == 3
    for got, want in zip(block.hops, expected.hops, strict=True):
        torch.testing.assert_close(got, want)
    # changing the features of a node and nothing else changes the block only through H1
    other = dataclasses.replace(part, features=part.features * 2.0)  # same directions: same H1
    again = released_block(other, release, hops=3, noise=GaussianNoise(seed=5), seed=0)
    for got, want in zip(again.hops, block.hops, strict=True):
        torch.testing.assert_close(got, want)


def test_a_receiver_gets_the_others_blocks_summed_after_a_zero_hop() -> None:
    a = HopFeatures((torch.ones(4, 2), torch.full((4, 2), 2.0)))
    b = HopFeatures((torch.full((4, 2), 10.0), torch.full((4, 2), 20.0)))
    received = received_hops([a, b], num_nodes=4, width=2, hops=2)
    assert [float(h[0, 0]) for h in received.hops] == [0.0, 11.0, 22.0]
    own = HopFeatures(tuple(torch.full((4, 3), float(k)) for k in range(3)))
    rows = beside(own, received).rows(np.array([1]))
    assert rows.tolist() == [[0.0] * 5 + [1.0] * 3 + [11.0] * 2 + [2.0] * 3 + [22.0] * 2]
    alone = received_hops([], num_nodes=4, width=2, hops=2)  # nobody else released
    assert [float(h.abs().sum()) for h in alone.hops] == [0.0, 0.0, 0.0]


def test_the_label_holder_releases_nothing_and_the_others_once() -> None:
    parts = [dataclasses.replace(_one_party(), client=m, clients=3) for m in range(3)]
    assert senders(parts, None) == [0, 1, 2]
    assert senders(parts, 0) == [1, 2]


def test_z_is_calibrated_for_one_release_and_split_or_shared_noise_is_refused() -> None:
    config = TrainConfig(backbone="sign", encryption="none", epsilon=2.0)
    privacy = sign_privacy(config, clients=3)
    assert privacy.epsilon_after(1) == pytest.approx(2.0, rel=1e-2)
    assert (privacy.occurrence_cap, privacy.degree_floor) == (7, 8)
    assert privacy.sensitivity == pytest.approx(2 * 1.0 * 8**0.5 / 8)
    for refused in (dict(shared_noise=True, encryption="ckks"), dict(split_noise=True)):
        with pytest.raises(ValueError, match="does not apply"):
            sign_privacy(dataclasses.replace(config, **refused), clients=3)


def _one_party() -> ClientPartition:
    graph, n = star(4)
    return as_partition(graph, np.ones((n, IN_FEATURES)))


@pytest.mark.slow
def test_a_run_releases_once_per_party_whatever_its_evaluations(monkeypatch, cora) -> None:
    """In process, end to end: rounds and evaluations read the one release; the ledger and the
    summary count one release per releasing party (the label holder: none of its own)."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    calls: list[int] = []

    def counted(partition, release, *, seed):
        calls.append(partition.client)
        return clean_release(partition, release, seed=seed)

    monkeypatch.setattr(private_sign, "clean_release", counted)
    for holder, releasing in ((None, [0, 1, 2]), (0, [1, 2])):
        calls.clear()
        config = TrainConfig(
            backbone="sign", layers=1, agg_layers=1, stale=1, hops=2, hidden=16,
            batch_size=140, rounds=4, eval_every=2, encryption="none", epsilon=4.0,
            noise_seed=3, device="cpu", label_holder=holder,
        )  # fmt: skip
        summary = train_inprocess(config, dataset=cora, progress=False)
        assert sorted(calls) == releasing
        privacy = summary.privacy
        assert privacy is not None and privacy["releases"] == 1
        assert [c["releases"] for c in privacy["by_client"]] == [
            int(m in releasing) for m in range(3)
        ]
        assert privacy["epsilon"] == pytest.approx(4.0, rel=1e-2)
        assert len(summary.history) == 2 and summary.reference_test_accuracy is not None
        assert "one degree-normalised release per party" in summary.notes[-1]


def test_a_receiver_starts_as_its_party_alone(monkeypatch) -> None:
    """Before any step the head on [own hops, block] computes what the party-alone head computes
    on its own hops: the block's weights start at zero, the rest as the reference's."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")
    graph, n = star(12)
    rng = np.random.default_rng(2)
    parts = [
        dataclasses.replace(
            as_partition(graph, rng.normal(size=(n, IN_FEATURES))), client=m,
            labels=torch.from_numpy(rng.integers(0, 3, n)),
        )
        for m in range(2)
    ]  # fmt: skip
    config = TrainConfig(
        backbone="sign", layers=1, agg_layers=1, hops=2, hidden=8, clients=2, encryption="none",
        epsilon=4.0, noise_seed=1, device="cpu",
    )  # fmt: skip
    privacy = sign_privacy(config, clients=2)
    receivers = sign_receivers(
        config, parts, client_config(config), privacy, device=torch.device("cpu")
    )
    nodes = np.arange(n)
    for receiver in receivers:
        outputs = []
        for client in (receiver.client, receiver.reference):
            client.network.eval()
            h = client.network.project(client.feature_rows(nodes), generator=client.generator)
            outputs.append(client.network.classify(h, generator=client.generator))
        torch.testing.assert_close(outputs[0], outputs[1])
        block = receiver.client.network.input.per_hop[:, IN_FEATURES:]
        assert block.abs().sum() == 0 and receiver.client.feature_rows(nodes).abs().sum() > 0
