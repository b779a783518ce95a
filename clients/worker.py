"""One organisation's worker: the GLASU client of models/federated.py, driven over HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from clients.ledger import LocalLedger
from clients.policy import PrivacyPolicy, ReleaseGate, admit_session
from clients.transport import ServiceClient
from models.backbone import ModelConfig
from models.federated import ClientConfig, GlasuClient, PassOutcome
from models.partition import ClientPartition
from models.private import make_client
from models.report import recent_training_loss
from secure.aggregation import EmbeddingCodec
from secure.protocol import EmbeddingRequest, NodesRequest

log = logging.getLogger(__name__)


PRIVATE_DEFAULT_HIDDEN = 128


@dataclass(frozen=True)
class LocalModelOptions:
    """What each organisation chooses for its own part of the model. Only the widths at the
    aggregation layers (the session's) must agree across clients."""

    backbone: str = "gcnii"
    hidden: int | None = None  # default: the aggregation width (plain GLASU) or 128 (private)
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    eval_fanout: int = 10
    seed: int | None = None  # initialisation and dropout; default: the session's seed
    noise_seed: int | None = None  # reproducible DP noise (experiments only)
    cache_rounds: int = 1  # W of the CELU-VFL workset (models/workset.py)
    instance_weighting: bool = False
    weight_threshold: float = 0.5


@dataclass
class WorkerResult:
    passes: int = 0
    finished_reason: str = "finished"
    training_bytes: int = 0  # node sets, shares and sums of training passes, both directions
    history: list[dict[str, Any]] = field(default_factory=list)


def client_config_from_session(
    session_config: dict[str, Any], options: LocalModelOptions
) -> ClientConfig:
    privacy = session_config.get("privacy")
    widths = {a["width"] for a in session_config["agg_layers"]}
    if privacy is not None:
        hidden = options.hidden or PRIVATE_DEFAULT_HIDDEN
    elif len(widths) != 1:
        raise ValueError(f"this worker needs one width at every aggregation layer, got {widths}")
    else:
        hidden = widths.pop()
        if options.hidden not in (None, hidden):
            raise ValueError(
                f"--hidden {options.hidden} differs from the session's aggregation width {hidden}"
            )
    model = ModelConfig(
        backbone=options.backbone,  # type: ignore[arg-type]
        layers=session_config["layers"],
        hidden=hidden,
        dropout=options.dropout,
        # the private arrangement's release is the session's only aggregation layer
        receiver_width=session_config["agg_layers"][0]["width"] if privacy else 0,
    )
    return ClientConfig(
        model=model,
        agg_layers=tuple(a["layer"] for a in session_config["agg_layers"]),
        stale=session_config["stale"],
        cache_rounds=options.cache_rounds,
        instance_weighting=options.instance_weighting,
        weight_threshold=options.weight_threshold,
        fanout=session_config["fanout"],
        eval_fanout=options.eval_fanout,
        occurrence_cap=privacy["occurrence_cap"] if privacy else None,
        lr=options.lr,
        weight_decay=options.weight_decay,
        seed=session_config["seed"] if options.seed is None else options.seed,
    )


def run_worker(
    service: ServiceClient,
    partition: ClientPartition,
    *,
    options: LocalModelOptions,
    codec: EmbeddingCodec,
    policy: PrivacyPolicy,
    ledger: LocalLedger | None,
    device: torch.device | str = "cpu",
    on_pass: Callable[[dict[str, Any], PassOutcome], None] | None = None,
) -> WorkerResult:
    """Follow the session's passes until it says "done". Before anything is sent, the session
    must satisfy this organisation's privacy ``policy`` (:class:`PolicyRefusal` otherwise); with
    DP on, every release is written to ``ledger`` before it leaves (:class:`BudgetSpent` when the
    next one would exceed the policy)."""
    session = service.session()
    config = session["config"]
    if partition.client != service.client_index:
        raise ValueError(
            f"the partition is client {partition.client}'s, but this worker is "
            f"client {service.client_index}"
        )
    if partition.clients != config["clients"] or partition.num_nodes != config["num_nodes"]:
        raise ValueError(
            f"the partition (M={partition.clients}, {partition.num_nodes} nodes) does not match "
            f"the session (M={config['clients']}, {config['num_nodes']} nodes)"
        )
    if codec.encoding != config["encoding"]:
        raise ValueError(
            f"the session expects {config['encoding']} shares, this worker's codec "
            f"makes {codec.encoding}: give the secret context (or --no-he) to match"
        )
    privacy = admit_session(policy, session, encrypted=codec.encoding == "ckks", ledger=ledger)
    gate = None
    if privacy is not None:
        if ledger is None:
            raise ValueError("a private session needs the worker's local privacy ledger")
        gate = ReleaseGate(policy, privacy, ledger, session["session_id"])
    client = make_client(
        partition,
        client_config_from_session(config, options),
        codec=codec,
        device=device,
        privacy=privacy,
        seed=config["seed"],
        noise_seed=options.noise_seed,
    )
    result = WorkerResult()
    training_losses: list[float] = []
    pass_index = 0
    while True:
        info = service.pass_info(pass_index)
        if info["kind"] == "done":
            result.finished_reason = info.get("reason", "finished")
            break
        exchanged_before = service.traffic.up + service.traffic.down
        if gate is not None:  # every pass of the private arrangement is one release
            gate.admit(pass_index)
        outcome = drive_pass(client, service, info)
        if outcome.kind == "train":
            result.training_bytes += service.traffic.up + service.traffic.down - exchanged_before
        if privacy is None:
            # Under DP a loss or an accuracy computed on clean features would be a release the
            # ledger does not count: the worker keeps them to itself (result file, stdout).
            service.report_metrics(
                pass_index,
                {
                    "loss": outcome.loss,
                    "val_accuracy": outcome.val_accuracy,
                    "test_accuracy": outcome.test_accuracy,
                },
            )
        if outcome.kind == "train":
            training_losses.append(outcome.loss)
        else:
            result.history.append(
                {
                    "pass": pass_index,
                    "round": info["round"],
                    "loss": recent_training_loss(training_losses),
                    "val_accuracy": outcome.val_accuracy,
                    "test_accuracy": outcome.test_accuracy,
                    # the party-alone reference (private runs): stays in this local file
                    "reference_val_accuracy": outcome.reference_val_accuracy,
                    "reference_test_accuracy": outcome.reference_test_accuracy,
                    "bytes_up": service.traffic.up,
                    "bytes_down": service.traffic.down,
                    "training_bytes": result.training_bytes,
                }
            )
        if on_pass:
            on_pass(info, outcome)
        result.passes += 1
        pass_index += 1
    return result


def drive_pass(client: GlasuClient, service: ServiceClient, info: dict[str, Any]) -> PassOutcome:
    """Answer the client's requests of one pass with calls to the service."""
    pass_index = info["pass"]
    steps = client.run_pass(
        pass_index=pass_index,
        kind=info["kind"],
        output_nodes=np.asarray(info["output_nodes"], dtype=np.int64),
    )
    answer: Any = None
    while True:
        try:
            request = steps.send(answer) if answer is not None else next(steps)
        except StopIteration as finished:
            return finished.value
        if isinstance(request, NodesRequest):
            answer = service.exchange_nodes(pass_index, request.layer, request.nodes)
        elif isinstance(request, EmbeddingRequest):
            answer = service.exchange_embedding(
                pass_index,
                request.layer,
                request.payload,
                rows=request.rows,
                cols=request.cols,
                encoding=client.codec.encoding,
            )
        else:
            raise TypeError(f"unexpected request {request!r}")
