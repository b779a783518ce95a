import dataclasses

import numpy as np
import pytest
import torch

from models.client_config import uniform_agg_layers
from models.config import TrainConfig
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.layout import layout_federation
from models.release import PassContext
from models.trainer import train_inprocess
from models.workset import combine
from secure.aggregation import PlainSumAggregator
from secure.protocol import ShareRequest, SharesSum

PLAIN = dict(encryption="none", dp=False)  # the GLASU core without encryption or privacy
SHORT = dict(rounds=6, eval_every=3, hidden=32, batch_size=16, **PLAIN)


def test_uniform_aggregation_layers() -> None:
    assert uniform_agg_layers(layers=4, count=1) == (4,)
    assert uniform_agg_layers(layers=4, count=2) == (2, 4)
    assert uniform_agg_layers(layers=4, count=4) == (1, 2, 3, 4)
    with pytest.raises(ValueError):
        uniform_agg_layers(layers=4, count=5)


def test_combine_value_and_gradient() -> None:
    own = torch.tensor([[3.0, 6.0]], requires_grad=True)
    others = torch.tensor([[1.0, 1.0]])
    out = combine(others, own, count=3)
    assert torch.allclose(out, others + own.detach() / 3)
    out.sum().backward()
    assert torch.allclose(own.grad, torch.ones_like(own))  # not 1/M: see notes/calibration.md


def test_extract_identity(cora) -> None:
    """H_{-m} = H - H_m^+ / M: adding back the own share gives the mean of all shares."""
    plan = layout_federation(TrainConfig(**SHORT), cora)
    clients = [GlasuClient(p, plan.client_config) for p in plan.partitions]
    aggregator = PlainSumAggregator()
    passes = [
        c.run_pass(pass_index=0, kind="train", output_nodes=cora.train_nodes[:8]) for c in clients
    ]
    requests = [next(g) for g in passes]
    while not isinstance(requests[0], ShareRequest):  # answer the node-set exchanges
        union = np.unique(np.concatenate([r.nodes for r in requests]))
        requests = [g.send(union) for g in passes]
    shares = [np.frombuffer(r.payload, dtype="<f4").reshape(r.rows, r.cols) for r in requests]
    total = aggregator.add(
        [r.payload for r in requests], rows=requests[0].rows, cols=requests[0].cols
    )
    context = PassContext(pass_index=0, kind="train", output_nodes=cora.train_nodes[:8])
    others = [
        clients[m].joint.aggregate(
            context,
            requests[m].layer,
            torch.from_numpy(shares[m].copy()),
            rows=np.arange(requests[m].rows),
        )
        for m in range(3)
    ]
    for m, gen in enumerate(others):
        next(gen)
        with pytest.raises(StopIteration) as done:
            gen.send(SharesSum(payload=total, count=3))
        h_minus_m = done.value.value.others.numpy()
        assert np.allclose(h_minus_m + shares[m] / 3, sum(shares) / 3, atol=1e-6)
        assert np.allclose(h_minus_m, sum(s for n, s in enumerate(shares) if n != m) / 3, atol=1e-6)


def test_clients_agree_on_rows_at_aggregation_layers(cora) -> None:
    plan = layout_federation(TrainConfig(**SHORT), cora)
    clients = [GlasuClient(p, plan.client_config) for p in plan.partitions]
    seen = []

    class Recording(PlainSumAggregator):
        def add(self, payloads, *, rows, cols):
            seen.append((rows, cols, len(payloads)))
            return super().add(payloads, rows=rows, cols=cols)

    run_pass_inprocess(
        clients, Recording(), pass_index=0, kind="train", output_nodes=cora.train_nodes[:16]
    )
    assert [s[2] for s in seen] == [3, 3]  # two aggregation layers, three shares each
    assert seen[-1][0] == 16  # the top layer aggregates the output batch


def test_simulated_equals_glasu_with_full_graph_k_l_q1(cora) -> None:
    simulated = train_inprocess(
        TrainConfig(mode="simulated", **SHORT), dataset=cora, progress=False
    )
    glasu = train_inprocess(
        TrainConfig(mode="glasu", agg_layers=4, stale=1, edge_fraction=1.0, **SHORT),
        dataset=cora,
        progress=False,
    )
    assert [h.val_accuracy for h in simulated.history] == [h.val_accuracy for h in glasu.history]
    assert simulated.test_accuracy == glasu.test_accuracy


def test_one_client_equals_centralized(cora) -> None:
    central = train_inprocess(
        TrainConfig(mode="centralized", **SHORT), dataset=cora, progress=False
    )
    single = train_inprocess(
        TrainConfig(mode="glasu", clients=1, agg_layers=1, stale=1, edge_fraction=1.0, **SHORT),
        dataset=cora,
        progress=False,
    )
    assert [h.test_accuracy for h in central.history] == [h.test_accuracy for h in single.history]


def test_standalone_reports_mean_over_clients(cora) -> None:
    report = train_inprocess(TrainConfig(mode="standalone", **SHORT), dataset=cora, progress=False)
    assert report.config["mode"] == "standalone"
    assert len(report.history) == 2


@pytest.mark.parametrize("backbone", ["gcnii", "gcn", "gat"])
def test_every_backbone_runs(cora, backbone: str) -> None:
    config = TrainConfig(backbone=backbone, **{**SHORT, "rounds": 2, "eval_every": 0})
    report = train_inprocess(config, dataset=cora, progress=False)
    assert 0.0 <= report.test_accuracy <= 1.0


def test_short_cora_run_beats_majority_class_widely(cora) -> None:
    torch.set_num_threads(1)
    config = TrainConfig(rounds=60, eval_every=20, **PLAIN)
    report = train_inprocess(config, dataset=cora, progress=False)
    majority = np.bincount(cora.labels.numpy()[cora.test_nodes]).max() / len(cora.test_nodes)
    assert majority < 0.35
    assert report.test_accuracy > majority + 0.35, report.history


def test_report_fields(cora, tmp_path) -> None:
    import json

    from models.run_summary import plot_history

    report = train_inprocess(TrainConfig(**SHORT), dataset=cora, progress=False)
    report.write(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    for key in (
        "test_accuracy",
        "val_accuracy",
        "rounds",
        "wall_seconds",
        "bytes_up",
        "bytes_down",
        "privacy",
        "config",
        "history",
    ):
        assert key in data
    assert data["bytes_up"] == 0 and data["privacy"] is None
    assert {"round", "loss", "val_accuracy"} <= set(data["history"][0])
    plot_history(report, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 5000
    assert dataclasses.asdict(TrainConfig()).keys() <= data["config"].keys()


def test_encryption_matches_plaintext(cora) -> None:
    plain = train_inprocess(TrainConfig(**SHORT), dataset=cora, progress=False)
    encrypted = train_inprocess(
        TrainConfig(**{**SHORT, "encryption": "ckks"}), dataset=cora, progress=False
    )
    assert encrypted.config["encryption"] == "ckks" and plain.config["encryption"] == "none"
    # shares travel on a fixed-point grid that rounds the CKKS error away: same run, bit for bit
    assert [h.test_accuracy for h in encrypted.history] == [h.test_accuracy for h in plain.history]
    assert [h.loss for h in encrypted.history] == [h.loss for h in plain.history]
