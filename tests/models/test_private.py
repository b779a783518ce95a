"""The private arrangement: what a worker sends under differential privacy."""

import dataclasses

import numpy as np
import pytest
import torch

import models.inprocess as inprocess
from models.config import TrainConfig
from models.data.partition import feature_blocks
from models.layout import layout_federation
from models.private import REPRODUCIBLE_NOISE_ENV, make_client
from models.trainer import prepare_security, train_inprocess
from secure.privacy import SessionPrivacy, release_sensitivity
from secure.protocol import NodesRequest, ProtocolViolation, ShareRequest, SharesSum

PRIVATE = dict(
    encryption="none",
    dp=True,
    noise_multiplier=1.0,
    epsilon=None,
    noise_seed=7,
    rounds=4,
    eval_every=2,
    hidden=32,
)


@pytest.fixture(autouse=True)
def reproducible_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests fix the noise seed: allowed in tests only, and the report says so."""
    monkeypatch.setenv(REPRODUCIBLE_NOISE_ENV, "1")


def record_sends(monkeypatch: pytest.MonkeyPatch, cora, config: TrainConfig) -> list[list]:
    """Everything each client sends during a whole run, in order."""
    sent: list[list] = [[] for _ in range(config.clients)]
    answer = inprocess._answer

    def recording(requests, aggregator):
        for m, request in enumerate(requests):
            if isinstance(request, NodesRequest):
                sent[m].append(("nodes", request.layer, request.nodes.copy()))
            else:
                assert isinstance(request, ShareRequest)
                matrix = np.frombuffer(request.payload, dtype="<f4").reshape(
                    request.rows, request.cols
                )
                sent[m].append(("share", request.layer, matrix.astype(np.float64)))
        return answer(requests, aggregator)

    monkeypatch.setattr(inprocess, "_answer", recording)
    train_inprocess(config, dataset=cora, progress=False)
    monkeypatch.setattr(inprocess, "_answer", answer)
    return sent


def with_node_changed(cora, *, node: int, client: int, seed: int):
    columns = torch.from_numpy(feature_blocks(cora.num_features, clients=3, seed=seed)[client])
    features = cora.features.clone()
    rng = np.random.default_rng(123)
    features[node, columns] = torch.from_numpy((rng.random(len(columns)) < 0.05).astype(np.float32))
    assert not torch.equal(features[node], cora.features[node])
    return dataclasses.replace(cora, features=features)


def test_one_node_moves_only_its_release_and_by_at_most_delta(monkeypatch, cora) -> None:
    config = TrainConfig(**PRIVATE)
    node = int(cora.train_nodes[0])
    before = record_sends(monkeypatch, cora, config)
    after = record_sends(monkeypatch, with_node_changed(cora, node=node, client=0, seed=0), config)
    delta = release_sensitivity(clip=config.clip, occurrence_cap=config.occurrence_cap)
    moved = []
    for m in range(3):
        assert len(before[m]) == len(after[m])
        for (kind, layer, a), (_, _, b) in zip(before[m], after[m], strict=True):
            if kind == "nodes" or m != 0:
                # node sets never depend on features; the other clients' releases neither
                assert np.array_equal(a, b), (m, kind, layer)
                continue
            distance = float(np.linalg.norm(a - b))
            assert distance <= delta + 1e-4, (distance, delta)
            moved.append(distance)
    assert max(moved) > 0, "the changed node never reached a release: the test proves nothing"
    # each pass sends exactly one share per client, at layer 1
    shares = [(kind, layer) for kind, layer, _ in before[0] if kind == "share"]
    assert set(shares) == {("share", 1)} and len(shares) == 4 + 2


def test_noise_in_the_aggregate_has_the_planned_std(monkeypatch, cora) -> None:
    """Two runs that differ only in the noise seed: their aggregates (the sums the service
    forms) differ by noise alone. Unshared noise: each of the M shares carries z * Delta, so the
    sum carries sqrt(M) z * Delta, and the difference of two runs sqrt(2) times that."""
    config = TrainConfig(**{**PRIVATE, "shared_noise": False, "rounds": 2, "eval_every": 0})
    runs = [
        record_sends(monkeypatch, cora, dataclasses.replace(config, noise_seed=seed))
        for seed in (1, 2)
    ]

    def sums(run: list[list]) -> list[np.ndarray]:
        per_pass = zip(
            *[[x for kind, _, x in run[m] if kind == "share"] for m in range(3)], strict=True
        )
        return [sum(shares) for shares in per_pass]

    differences = [a - b for a, b in zip(sums(runs[0]), sums(runs[1]), strict=True)]
    observed = float(np.std(np.concatenate([d.ravel() for d in differences])))
    delta = release_sensitivity(clip=config.clip, occurrence_cap=config.occurrence_cap)
    expected = config.noise_multiplier * delta * np.sqrt(3) * np.sqrt(2)
    assert abs(observed / expected - 1) < 0.1, (observed, expected)


def test_shared_noise_splits_the_variance() -> None:
    def privacy(*, shared: bool) -> SessionPrivacy:
        return SessionPrivacy.plan(
            epsilon=None,
            delta=1e-6,
            noise_multiplier=2.0,
            clip=1.0,
            occurrence_cap=1,
            shared_noise=shared,
            clients=4,
            passes_total=10,
            encrypted=True,
        )

    shared = privacy(shared=True)
    delta = shared.sensitivity
    assert delta == pytest.approx(2.0 * np.sqrt(2))  # 2 C sqrt(c + 1)
    assert shared.client_noise_std == pytest.approx(2.0 * delta / 2.0)  # 4 shares: (z Delta)^2
    # a peer removing its own share faces 3 of the 4 shares: z * sqrt(3/4)
    assert shared.ledger_noise_multiplier == pytest.approx(2.0 * np.sqrt(3 / 4))
    unshared = privacy(shared=False)
    assert unshared.client_noise_std == pytest.approx(2.0 * delta)
    assert unshared.ledger_noise_multiplier == 2.0


def test_a_fixed_noise_seed_is_refused_outside_tests_and_marked_not_private(
    monkeypatch: pytest.MonkeyPatch, cora
) -> None:
    from secure.noise import NotPrivateNoiseError

    config = TrainConfig(**{**PRIVATE, "rounds": 1, "eval_every": 0})
    report = train_inprocess(config, dataset=cora, progress=False)
    assert report.privacy is not None and "NOT PRIVATE" in report.privacy["noise"]
    monkeypatch.delenv(REPRODUCIBLE_NOISE_ENV)
    with pytest.raises(NotPrivateNoiseError, match="not private"):
        train_inprocess(config, dataset=cora, progress=False)
    cryptographic = train_inprocess(
        dataclasses.replace(config, noise_seed=None), dataset=cora, progress=False
    )
    assert cryptographic.privacy is not None
    assert cryptographic.privacy["noise"].startswith("cryptographic")


def test_the_party_alone_reference_trains_on_the_federated_batches(
    monkeypatch: pytest.MonkeyPatch, cora
) -> None:
    """Every forward of the reference model mirrors one of the federated model: same input
    nodes, same blocks, in the same order; and the report states both accuracies."""
    from models.private import PrivateArrangement

    seen: dict[str, list] = {"federated": [], "reference": []}
    forward = PrivateArrangement.local_forward

    def recording(self, network, generator, blocks, input_nodes, h0_rows, *, received):
        which = "reference" if network is self.reference else "federated"
        assert (received is None) == (which == "reference")
        seen[which].append((self.client.partition.client, input_nodes.tolist(), len(blocks)))
        return forward(self, network, generator, blocks, input_nodes, h0_rows, received=received)

    monkeypatch.setattr(PrivateArrangement, "local_forward", recording)
    config = TrainConfig(**{**PRIVATE, "rounds": 3, "eval_every": 3, "stale": 2})
    report = train_inprocess(config, dataset=cora, progress=False)
    assert seen["federated"] and seen["reference"] == seen["federated"]
    assert report.reference_test_accuracy is not None and report.gain is not None
    assert report.gain == pytest.approx(report.test_accuracy - report.reference_test_accuracy)
    assert all(h.reference_test_accuracy is not None for h in report.history)


@pytest.mark.parametrize("shared", [False, True])
def test_a_sum_of_fewer_shares_than_clients_is_refused_under_shared_noise(
    cora, shared: bool
) -> None:
    """With shared noise every client adds 1/M of the variance: a sum of 2 of 3 shares carries
    less noise than accounted, so the client refuses it (without shared noise a pass that went on
    without a straggler may hold 2)."""
    config = TrainConfig(**{**PRIVATE, "clients": 3})
    layout = layout_federation(config, cora)
    security = prepare_security(config, passes_total=4, clients=3)
    assert security.privacy is not None
    client = make_client(
        layout.partitions[0],
        layout.client_config,
        codec=security.codec_factory(),
        device="cpu",
        privacy=dataclasses.replace(security.privacy, shared_noise=shared),
        seed=config.seed,
        noise_seed=config.noise_seed,
    )
    steps = client.run_pass(pass_index=0, kind="eval", output_nodes=cora.test_nodes)
    request = next(steps)
    assert isinstance(request, ShareRequest)
    two_of_three = SharesSum(payload=request.payload, count=2)
    if shared:
        with pytest.raises(ProtocolViolation, match="holds 2 shares, expected at most 3 and at "
                           "least 3"):  # fmt: skip
            steps.send(two_of_three)
    else:
        with pytest.raises(StopIteration):  # the pass ends on this sum
            steps.send(two_of_three)
