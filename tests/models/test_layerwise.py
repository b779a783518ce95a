"""Evaluation passes computed layer by layer over all aligned nodes (models/layerwise.py), a
scoring session's sampled pass over the asked nodes' neighbourhoods only, and shares that travel
in parts (secure.protocol.part_span)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest
import torch

import models.layerwise
import secure.protocol
from models import inprocess
from models.config import TrainConfig
from models.data.planetoid import GraphDataset
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layers import Block
from models.layout import eval_nodes, layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV, make_client
from models.sampler import NeighbourSampler, SampledLayer, SamplingGraph
from models.trainer import prepare_security
from models.workset import combine
from secure.noise import NoiseSource
from secure.protocol import NodesRequest, ProtocolViolation, ShareRequest
from secure.release_noise import ReleaseKeyedNoise, ReleaseSecret, part_key

PLAIN = dict(
    dataset="cora", mode="glasu", clients=2, layers=3, agg_layers=2, hidden=16,
    encryption="none", dp=False, rounds=2, batch_size=32, eval_every=1, seed=1,
)  # fmt: skip
PRIVATE = dict(
    dataset="cora", mode="glasu", clients=3, hidden=16, encryption="none", dp=True,
    noise_multiplier=1.0, epsilon=None, rounds=2, batch_size=32, eval_every=1, seed=1,
    release_width=64,
)  # fmt: skip
SECRET = ReleaseSecret(bytes(range(32)))


@pytest.fixture(autouse=True)
def reproducible_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")


class NoNoise(NoiseSource):
    """Zero noise: a release that is the clipped map itself (to compare releases exactly)."""

    def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
        return np.zeros(shape)


def federation(
    config: TrainConfig,
    dataset: GraphDataset,
    *,
    keyed: bool = False,
    noiseless: bool = False,
    part_values: int | None = None,
    sampled_eval: bool = False,
):
    layout = layout_federation(config, dataset)
    security = prepare_security(config, passes_total=8, clients=config.clients)
    client_config = dataclasses.replace(
        layout.client_config, part_values=part_values, sampled_eval=sampled_eval
    )
    clients = [
        make_client(
            part,
            client_config,
            codec=security.codec_factory(),
            device="cpu",
            privacy=security.privacy,
            seed=config.seed,
            noise_seed=config.noise_seed,
            noise=ReleaseKeyedNoise(SECRET, scope=f"s/{part.client}")
            if keyed
            else (NoNoise() if noiseless else None),
        )
        for part in layout.partitions
    ]
    return clients, security.aggregator


def record(monkeypatch: pytest.MonkeyPatch) -> list[list[Request]]:
    """Every round of requests the in-process driver answers, from now on."""
    asked: list[list[Request]] = []
    answer = inprocess._answer

    def recording(requests, aggregator):
        asked.append(list(requests))
        return answer(requests, aggregator)

    monkeypatch.setattr(inprocess, "_answer", recording)
    return asked


Request = ShareRequest | NodesRequest


def full_layer(client: GlasuClient) -> SampledLayer:
    """Every node's whole neighbourhood and itself, from the client's edges (no sampler)."""
    n = client.partition.num_nodes
    src, dst = client.partition.edge_index.numpy()
    keep = src != dst
    pairs = np.unique(np.stack([dst[keep], src[keep]], axis=1), axis=0)
    nodes = np.arange(n, dtype=np.int64)
    return SampledLayer(
        targets=nodes,
        sources=nodes,
        edge_target=np.concatenate([nodes, pairs[:, 0]]),
        edge_source=np.concatenate([nodes, pairs[:, 1]]),
    )


def full_graph_probabilities(clients: Sequence[GlasuClient], nodes: np.ndarray) -> np.ndarray:
    """Full-neighbourhood inference of the federation: every client's layers on its whole
    graph, the clients' mean at each aggregation layer; the first client's head."""
    blocks = [Block.from_sampled(full_layer(c), torch.device("cpu")) for c in clients]
    with torch.no_grad():
        h0 = [c.network.project(c.partition.features, generator=c.generator) for c in clients]
        h = list(h0)
        for depth in range(1, clients[0].layers + 1):
            h = [
                c.network.propagate(depth, x, block, start, generator=c.generator)
                for c, x, block, start in zip(clients, h, blocks, h0, strict=True)
            ]
            if depth in clients[0].config.agg_layers:
                mean = torch.stack(h).mean(dim=0)
                h = [mean for _ in clients]
        logits = clients[0].network.classify(h[0][nodes], generator=clients[0].generator)
    return torch.softmax(logits, dim=1).numpy()


@pytest.mark.parametrize("eval_fanout", [1000, 2])
def test_layerwise_evaluation_equals_full_neighbourhood_inference(cora, eval_fanout: int) -> None:
    """With an evaluation fanout at least the largest degree the sample is every neighbour:
    the pass over all nodes is full-graph inference (up to the shares' 2^-12 grid); with
    fanout 2 it is not (the test can fail)."""
    config = TrainConfig(**{**PLAIN, "eval_fanout": eval_fanout})
    clients, aggregator = federation(config, cora)
    nodes = eval_nodes(cora)
    for index, kind in enumerate(["train", "train", "eval"]):
        outcomes = run_pass_inprocess(
            clients, aggregator, pass_index=index, kind=kind,
            output_nodes=nodes if kind == "eval" else cora.train_nodes[index * 32 :][:32],
        )  # fmt: skip
    for client in clients:
        client.network.eval()
    expected = full_graph_probabilities(clients, nodes)
    got = outcomes[0].probabilities
    assert got is not None and got.shape == expected.shape
    difference = float(np.abs(got - expected).max())
    assert difference < 1e-4 if eval_fanout == 1000 else difference > 1e-3, difference


def test_an_evaluation_pass_exchanges_every_node_in_order_and_no_node_set(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainConfig(**PLAIN)
    clients, aggregator = federation(config, cora)
    asked = record(monkeypatch)
    run_pass_inprocess(clients, aggregator, pass_index=0, kind="eval", output_nodes=cora.test_nodes)
    assert all(isinstance(r, ShareRequest) for rnd in asked for r in rnd)
    assert [rnd[0].layer for rnd in asked] == [2, 3]
    assert all(r.rows == cora.num_nodes for rnd in asked for r in rnd)


def assert_parts_in_order(requests: Sequence[Request], *, num_nodes: int) -> None:
    """Each share's parts one after the other, each of the rows ``part_span`` gives it; the
    shares of evaluation layers hold every node."""
    share: list[ShareRequest] = []
    for request in requests:
        assert isinstance(request, ShareRequest) and request.part == len(share)
        share.append(request)
        if request.part < request.parts - 1:
            continue
        rows = sum(r.rows for r in share)
        assert request.parts == secure.protocol.part_count(rows, request.cols)
        for r in share:
            start, stop = secure.protocol.part_span(r.part, rows=rows, cols=r.cols)
            assert r.rows == stop - start
        assert rows == num_nodes or rows < num_nodes // 2  # evaluation: all; training: a batch
        share = []
    assert not share


def run_passes(clients, aggregator, cora) -> list:
    outcomes = []
    for index, kind in enumerate(["train", "eval", "train", "eval"]):
        nodes = eval_nodes(cora) if kind == "eval" else cora.train_nodes[index * 32 :][:32]
        outcomes.append(
            run_pass_inprocess(clients, aggregator, pass_index=index, kind=kind, output_nodes=nodes)
        )
    return outcomes


def assert_same_outcomes(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        for one, other in zip(x, y, strict=True):
            assert dataclasses.replace(one, loss=0.0) == dataclasses.replace(other, loss=0.0)
            assert one.loss == pytest.approx(other.loss, abs=1e-6, nan_ok=True)
            if one.probabilities is not None:
                np.testing.assert_allclose(one.probabilities, other.probabilities, atol=1e-6)


@pytest.mark.parametrize("settings", [PLAIN, PRIVATE])
def test_a_share_split_into_parts_equals_the_unsplit_share(
    settings: dict, cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training and evaluation passes with parts of a few hundred values give what one part
    gives: the same sums, outcomes and (noise off) the same release, one digest on its parts
    (another than the unsplit release's: the part layout is part of a release's identity, since
    each part's noise is keyed by its index)."""
    config = TrainConfig(**settings)
    asked = record(monkeypatch)
    unsplit = run_passes(*federation(config, cora, noiseless=True), cora)
    whole = [rnd for rnd in asked if isinstance(rnd[0], ShareRequest)]
    monkeypatch.setattr(secure.protocol, "PART_VALUES", 4000)
    asked = record(monkeypatch)
    split = run_passes(*federation(config, cora, noiseless=True), cora)
    parted = [rnd for rnd in asked if isinstance(rnd[0], ShareRequest)]
    assert_same_outcomes(unsplit, split)
    assert len(parted) > 4 * len(whole)  # several parts per share
    assert_parts_in_order([rnd[0] for rnd in parted], num_nodes=cora.num_nodes)
    if config.dp:
        by_release: dict[tuple[int, str], list[ShareRequest]] = {}
        for rnd in parted:
            for m, request in enumerate(rnd):
                assert request.release is not None
                by_release.setdefault((m, request.release), []).append(request)
        # one digest per client and pass, carried by all of that release's parts
        assert len(by_release) == 3 * 4
        for requests in by_release.values():
            assert [r.part for r in requests] == list(range(requests[0].parts))
        # the release itself does not depend on the parts (no noise here)
        for m in range(3):
            joined = [
                np.concatenate(
                    [np.frombuffer(r.payload, "<f4").reshape(r.rows, r.cols) for r in requests]
                )
                for (client, _), requests in by_release.items()
                if client == m
            ]
            alone = [np.frombuffer(rnd[m].payload, "<f4").reshape(-1, rnd[m].cols) for rnd in whole]
            for a, b in zip(joined, alone, strict=True):
                np.testing.assert_array_equal(a, b)
            digests = [d for c, d in by_release if c == m]
            assert not set(digests) & {rnd[m].release for rnd in whole}


def test_a_release_cut_into_other_parts_is_another_release(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's part_values (the service sizes them to its body limit) that cut a release
    otherwise than the default give it another digest: each part's noise is keyed by the part's
    index, so the same rows cut another way carry other noise and are another release, never
    "already recorded"."""
    config = TrainConfig(**PRIVATE)
    sent = []
    for part_values in (secure.protocol.PART_VALUES, 20000):  # what a session states
        asked = record(monkeypatch)
        clients, aggregator = federation(config, cora, keyed=True, part_values=part_values)
        run_pass_inprocess(
            clients, aggregator, pass_index=5, kind="eval", output_nodes=cora.test_nodes
        )
        sent.append([(r.release, r.parts) for rnd in asked for r in rnd])
    assert sent[0][0][1] == 1 and sent[1][0][1] > 1
    assert {release for release, _ in sent[0]}.isdisjoint(release for release, _ in sent[1])


def test_a_release_in_parts_is_sent_identically_when_computed_again(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Release-keyed noise of a release in parts: a worker that computes the pass again (after a
    crash) sends the identical parts with the identical digest; the parts' noise differs."""
    monkeypatch.setattr(secure.protocol, "PART_VALUES", 20000)
    config = TrainConfig(**PRIVATE)
    sent = []
    for _ in range(2):
        asked = record(monkeypatch)
        clients, aggregator = federation(config, cora, keyed=True)
        run_pass_inprocess(
            clients, aggregator, pass_index=5, kind="eval", output_nodes=cora.test_nodes
        )
        sent.append([(r.release, r.part, r.parts, r.payload) for rnd in asked for r in rnd])
    assert sent[0] == sent[1]
    assert sent[0][0][2] > 1 and len({s[0] for s in sent[0][: sent[0][0][2] * 3]}) == 3
    keyed = ReleaseKeyedNoise(SECRET, scope="s/0")
    digest = bytes.fromhex(sent[0][0][0])
    draws = [keyed.for_release(part_key(digest, p)).sample(8, std=1.0) for p in (0, 1, 0)]
    assert not np.array_equal(draws[0], draws[1]) and np.array_equal(draws[0], draws[2])
    assert part_key(digest, 0) == digest  # a release of one part is noised as before parts


def star(leaves: int) -> GraphDataset:
    hub = np.zeros(leaves, dtype=np.int64)
    spokes = np.arange(1, leaves + 1, dtype=np.int64)
    edges = np.stack([np.concatenate([hub, spokes]), np.concatenate([spokes, hub])])
    n = leaves + 1
    nodes = np.arange(n, dtype=np.int64)
    return GraphDataset(
        name="star", features=torch.rand(n, 6, generator=torch.Generator().manual_seed(0)),
        labels=torch.from_numpy(nodes % 2), edge_index=torch.from_numpy(edges),
        train_nodes=nodes[: n // 2], val_nodes=nodes[n // 2 : 3 * n // 4],
        test_nodes=nodes[3 * n // 4 :], split="star", split_note="",
    )  # fmt: skip


def drawn_counts(layers: Sequence[SampledLayer], num_nodes: int) -> np.ndarray:
    """How often each node was drawn as a neighbour (self-loops left out)."""
    counts = np.zeros(num_nodes, dtype=np.int64)
    for layer in layers:
        drawn = layer.sources[layer.edge_source[len(layer.targets) :]]  # self-loops come first
        np.add.at(counts, drawn, 1)
    return counts


def test_the_cap_holds_across_all_chunks_of_an_evaluation_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A star: every leaf wants the hub. The release layer of a private evaluation pass, cut
    into many chunks, draws the hub at most c times over the whole pass."""
    dataset = star(200)
    monkeypatch.setattr(models.layerwise, "EVAL_CHUNK_NODES", 7)
    seen: list[tuple[int | None, SampledLayer]] = []
    sample_all = NeighbourSampler.sample_all

    def recording(self, *, chunk, rng):
        for layer in sample_all(self, chunk=chunk, rng=rng):
            seen.append((self.occurrence_cap, layer))
            yield layer

    monkeypatch.setattr(NeighbourSampler, "sample_all", recording)
    config = TrainConfig(**{**PRIVATE, "occurrence_cap": 2, "clients": 2, "release_width": 8})
    clients, aggregator = federation(config, dataset)
    run_pass_inprocess(
        clients, aggregator, pass_index=0, kind="eval", output_nodes=dataset.test_nodes
    )
    capped = [layer for cap, layer in seen if cap == 2]
    assert len(capped) == 2 * -(-dataset.num_nodes // 7)  # two clients, every chunk
    for m in range(2):
        layers = capped[m * len(capped) // 2 : (m + 1) * len(capped) // 2]
        assert sum(len(layer.targets) for layer in layers) == dataset.num_nodes
        counts = drawn_counts(layers, dataset.num_nodes)
        assert counts.max() <= 2
        if np.isin(0, clients[m].partition.edge_index.numpy()):
            assert counts[0] == 2  # the hub is contested: taken exactly up to the cap


def test_all_targets_in_one_chunk_is_the_capped_draw_of_all_targets() -> None:
    dataset = star(50)
    graph = SamplingGraph.from_edge_index(dataset.edge_index, num_nodes=dataset.num_nodes)
    sampler = NeighbourSampler(graph, fanout=3, occurrence_cap=2)
    [chunked] = sampler.sample_all(chunk=10**6, rng=np.random.default_rng(4))
    whole = sampler.sample_layer(np.arange(dataset.num_nodes), rng=np.random.default_rng(4))
    assert all(
        np.array_equal(getattr(chunked, f), getattr(whole, f))
        for f in ("targets", "sources", "edge_target", "edge_source")
    )


def test_who_gets_a_contested_neighbour_does_not_depend_on_ids_across_chunks() -> None:
    """50 leaves in chunks of 7 compete for the hub (cap 2): low and high ids get it as often."""
    leaves = 50
    dataset = star(leaves)
    graph = SamplingGraph.from_edge_index(dataset.edge_index, num_nodes=dataset.num_nodes)
    sampler = NeighbourSampler(graph, fanout=1, occurrence_cap=2)
    wins = np.zeros(leaves + 1, dtype=np.int64)
    trials = 3000
    for trial in range(trials):
        layers = list(sampler.sample_all(chunk=7, rng=np.random.default_rng(trial)))
        for layer in layers:
            takers = layer.targets[layer.edge_target[len(layer.targets) :]]
            hub = layer.sources[layer.edge_source[len(layer.targets) :]] == 0
            wins[takers[hub]] += 1
    assert wins.sum() == 2 * trials
    expected = 2 * trials / leaves  # 120 per leaf
    low, high = wins[1:11].sum(), wins[-10:].sum()
    assert abs(low - 10 * expected) < 4 * np.sqrt(10 * expected), (low, high)
    assert abs(high - 10 * expected) < 4 * np.sqrt(10 * expected), (low, high)


def test_combine_of_the_mean_is_the_mean() -> None:
    """The reference above averages at aggregation layers: what Extract and combine give."""
    own, other = torch.rand(5, 3), torch.rand(5, 3)
    total = own + other
    mean = combine(total / 2 - own / 2, own, count=2)
    torch.testing.assert_close(mean, total / 2)


def test_a_sampled_scoring_pass_infers_only_the_asked_nodes_neighbourhoods(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scoring session's ``sampled`` pass (an online request): node sets exchanged below the
    top as in a training pass, shares of the union's rows and of the asked nodes' (not all
    N), and, with a fanout at least the largest degree, the asked nodes' full-neighbourhood
    predictions, as the pass over all nodes computes them."""
    config = TrainConfig(**{**PLAIN, "fanout": 1000})
    clients, aggregator = federation(config, cora, sampled_eval=True)
    nodes = cora.test_nodes[:50]
    asked = record(monkeypatch)
    steps = [c.run_pass(pass_index=0, kind="eval", output_nodes=nodes) for c in clients]
    outcomes = inprocess.answer_in_step(steps, aggregator)
    kinds = [(type(rnd[0]).__name__, rnd[0].layer) for rnd in asked]
    assert kinds == [("NodesRequest", 2), ("ShareRequest", 2), ("ShareRequest", 3)]
    union = np.unique(np.concatenate([r.nodes for r in asked[0]]))
    assert all(r.rows == len(union) < cora.num_nodes for r in asked[1])
    assert all(r.rows == len(nodes) for r in asked[2])
    for client in clients:
        client.network.eval()
    expected = full_graph_probabilities(clients, nodes)
    got = outcomes[0].probabilities
    assert got is not None and got.shape == expected.shape
    assert float(np.abs(got - expected).max()) < 1e-4


def test_a_private_sampled_scoring_pass_releases_the_agreed_rows_only(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DP the sampled pass's one release holds the rows of the layer-1 union the clients
    agreed on (a capped draw, as in a training pass), and the label holder still measures its
    party-alone reference on the same blocks."""
    config = TrainConfig(**PRIVATE)
    clients, aggregator = federation(config, cora, keyed=True, sampled_eval=True)
    nodes = cora.test_nodes[:20]
    asked = record(monkeypatch)
    steps = [c.run_pass(pass_index=0, kind="eval", output_nodes=nodes) for c in clients]
    outcomes = inprocess.answer_in_step(steps, aggregator)
    assert [type(rnd[0]).__name__ for rnd in asked] == ["NodesRequest", "ShareRequest"]
    assert asked[0][0].layer == asked[1][0].layer == 1
    union = np.unique(np.concatenate([r.nodes for r in asked[0]]))
    assert all(r.rows == len(union) < cora.num_nodes for r in asked[1])
    assert outcomes[0].probabilities is not None and len(outcomes[0].probabilities) == 20
    assert outcomes[0].reference_test_accuracy is not None


def test_a_sampled_pass_of_a_precomputed_backbone_reads_the_asked_rows_only(
    cora, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sign``: the features propagated once; a sampled pass shares the asked rows alone and
    predicts them as the pass over all nodes does."""
    config = TrainConfig(**{**PLAIN, "backbone": "sign", "layers": 1, "agg_layers": 1, "hops": 2})
    nodes = cora.test_nodes[:50]
    every = run_pass_inprocess(
        *federation(config, cora), pass_index=0, kind="eval", output_nodes=nodes
    )[0].probabilities
    clients, aggregator = federation(config, cora, sampled_eval=True)
    asked = record(monkeypatch)
    steps = [c.run_pass(pass_index=0, kind="eval", output_nodes=nodes) for c in clients]
    got = inprocess.answer_in_step(steps, aggregator)[0].probabilities
    assert [(type(r).__name__, r.rows) for rnd in asked for r in rnd] == [
        ("ShareRequest", len(nodes))
    ] * len(clients)
    assert got is not None and every is not None
    assert float(np.abs(got - every).max()) < 1e-5


def test_a_sampled_pass_checks_the_union_as_a_training_pass_does(cora) -> None:
    """A union that lacks a node this client sent is refused before anything is released; one
    with a node added (a lying service) is taken, and only makes the release one row longer."""
    config = TrainConfig(**PLAIN)
    nodes = cora.test_nodes[:5]
    client = federation(config, cora, sampled_eval=True)[0][0]
    steps = client.run_pass(pass_index=0, kind="eval", output_nodes=nodes)
    asked = next(steps)
    assert isinstance(asked, NodesRequest)
    with pytest.raises(ProtocolViolation, match="lacks nodes this client sent"):
        steps.send(asked.nodes[1:])
    client = federation(config, cora, sampled_eval=True)[0][0]
    steps = client.run_pass(pass_index=0, kind="eval", output_nodes=nodes)
    asked = next(steps)
    extra = np.setdiff1d(np.arange(cora.num_nodes), asked.nodes)[:1]
    share = steps.send(np.union1d(asked.nodes, extra))
    assert isinstance(share, ShareRequest) and share.rows == len(asked.nodes) + 1
