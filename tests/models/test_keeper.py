"""The model a run keeps (models/keeper.py): the best evaluation round's, the same round at
every client without DP; scored in this process with the kept models, the evaluation nodes get
exactly the predictions of that evaluation pass (tests/e2e/test_scoring.py: the same over
HTTP)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from clients.local.session import session_view
from clients.session_fit import LocalModelOptions, client_config_from_session, options_of_model
from models.artefact import load_model, read_evaluation
from models.config import TrainConfig
from models.federated import GlasuClient
from models.inprocess import score_inprocess
from models.keeper import KeepModels
from models.layout import layout_federation
from models.trainer import train_inprocess
from secure.aggregation import PlainSumAggregator

CONFIG = TrainConfig(
    clients=2, rounds=6, eval_every=2, hidden=16, encryption="none", dp=False, seed=0,
    device="cpu",
)  # fmt: skip


def test_kept_models_score_the_evaluation_nodes_as_the_best_evaluation_pass(
    cora, tmp_path: Path
) -> None:
    torch.set_num_threads(1)
    layout = layout_federation(CONFIG, cora)
    folders = [tmp_path / f"client-{m}" for m in range(CONFIG.clients)]
    keep = KeepModels(
        folders=folders, session_config=session_view(CONFIG, layout, cora), session_id="s"
    )
    report = train_inprocess(CONFIG, dataset=cora, layout=layout, progress=False, keep=keep)
    models = [load_model(folder) for folder in folders]
    assert {m.manifest["best"]["round"] for m in models} == {report.best_round}
    clients = []
    for saved, part in zip(models, layout.partitions, strict=True):
        options = options_of_model(saved, LocalModelOptions())
        settings = client_config_from_session(saved.manifest["session_config"], options)
        client = GlasuClient(part, settings)
        client.network.load_state_dict(saved.weights)
        clients.append(client)
    nodes, _ = read_evaluation(folders[0])
    scored, outcomes = score_inprocess(clients, PlainSumAggregator(), nodes=nodes)
    assert scored.tolist() == nodes.tolist()
    for folder, outcome in zip(folders, outcomes, strict=True):
        _, expected = read_evaluation(folder)
        np.testing.assert_allclose(outcome.probabilities, expected, rtol=0, atol=1e-6)
        assert np.array_equal(outcome.probabilities.argmax(1), expected.argmax(1))
