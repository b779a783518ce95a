"""What ``glasu train`` asks of the service and of each worker: the session request and the
workers' command lines (their model options and their privacy policy)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.client_config import ClientConfig
from models.config import PRECOMPUTED_BACKBONES, TrainConfig
from models.data.planetoid import GraphDataset
from models.data.shared_split import split_nodes
from models.layout import FederationLayout, client_config, eval_nodes
from models.private_sign import sign_privacy, sign_release_config
from secure.privacy import RELEASE_LAYER
from secure.schedule import pass_schedule
from secure.wire.alignment import AlignmentStatus
from secure.wire.common import MAX_LABEL
from secure.wire.node_lists import encode_nodes


def session_request(
    config: TrainConfig, layout: FederationLayout, dataset: GraphDataset
) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body for ``config``."""
    return session_body(
        config,
        clients=len(layout.partitions),
        client_settings=layout.client_config,
        num_nodes=dataset.num_nodes,
        train_nodes=dataset.train_nodes,
        eval_nodes=eval_nodes(dataset),
    )


def aligned_session_request(config: TrainConfig, alignment: Mapping[str, Any]) -> dict[str, Any]:
    """The body for a deployed federation aligned by ``glasu align`` (``alignment``: the JSON of
    ``GET /v1/alignments/{id}``): its N shared nodes, with the split every party's
    ``glasu align`` drew over them from the alignment's seed."""
    status = AlignmentStatus.model_validate(alignment)
    if status.state != "done" or status.aligned_nodes is None:
        raise ValueError(
            f"alignment {status.alignment_id} is not done yet (every party must run "
            "`glasu align` first)"
        )
    n = status.aligned_nodes
    train, val, test = split_nodes(np.arange(n), seed=status.seed)
    config = dataclasses.replace(config, nodes=status.nodes)
    return session_body(
        config,
        clients=status.parties,
        client_settings=client_config(config),
        num_nodes=n,
        train_nodes=train,
        eval_nodes=np.union1d(val, test),
    )


def session_body(
    config: TrainConfig,
    *,
    clients: int,
    client_settings: ClientConfig,
    num_nodes: int,
    train_nodes: np.ndarray,
    eval_nodes: np.ndarray,
) -> dict[str, Any]:
    width = config.release_width if config.private else config.hidden
    agg_layers = [{"layer": layer, "width": width} for layer in client_settings.agg_layers]
    kind = "training"
    if plans_sign_release(config):
        # the private sign design: one pass, its share every released hop side by side
        config, kind = sign_release_config(config), "release"
        agg_layers = [{"layer": RELEASE_LAYER, "width": config.release_width * config.hops}]
    return {
        "kind": kind,
        "clients": clients,
        "layers": config.layers,
        "agg_layers": agg_layers,
        "stale": client_settings.stale,
        "rounds": config.rounds,
        "eval_every": config.eval_every,
        "batch_size": config.batch_size,
        "fanout": config.fanout,
        "num_nodes": num_nodes,
        "train_nodes": encode_nodes(train_nodes),
        "eval_nodes": encode_nodes(eval_nodes),
        "seed": config.seed,
        "encryption": "ckks" if config.encrypted else "none",
        "secure_aggregation": config.secure_aggregation if config.encrypted else "none",
        "privacy": config.privacy_request(),
        "nodes": config.nodes,
        "label_holder": config.label_holder if config.releases_anything else None,
        "stragglers": config.stragglers,
        "straggler_wait_seconds": config.straggler_wait_seconds,
        "backbone": config.backbone,
        "label": f"glasu train {config.dataset} {config.mode}"[:MAX_LABEL],
    }


def plans_sign_release(config: TrainConfig) -> bool:
    """Whether ``config`` runs the private sign design (``models.private_sign``), which the
    service plans as one release pass (a session of kind "release")."""
    return config.private and config.backbone in PRECOMPUTED_BACKBONES


def worker_arguments(
    config: TrainConfig,
    *,
    server: str,
    session_id: str,
    client: int,
    token_file: Path,
    data: Path,
    result: Path,
    secret_context: Path | None,
    threads: int,
    passes_total: int,
    max_lifetime_epsilon: float | None = None,
) -> list[str]:
    """``glasu worker`` arguments for one client of ``config``. Its privacy policy is the run's
    own: the user owns every client's data here, so each worker allows what the run asks for,
    and over its ledger's lifetime ``max_lifetime_epsilon`` (default: the run's budget, where
    the ledger is the run's own)."""
    args = [
        "worker",
        "--server", server,
        "--session", session_id,
        "--client", str(client),
        "--token-file", str(token_file),
        "--data", str(data),
        "--device", config.device,
        "--backbone", config.backbone,
        "--hops", str(config.hops),
        "--feature-scale", config.feature_scale,
        "--hidden", str(config.hidden),
        "--dropout", str(config.dropout),
        "--lr", str(config.lr),
        "--weight-decay", str(config.weight_decay),
        "--eval-fanout", str(config.eval_fanout),
        "--cache-rounds", str(config.cache_rounds),
        "--instance-weighting" if config.instance_weighting else "--no-instance-weighting",
        "--weight-threshold", repr(config.weight_threshold),
        "--seed", str(config.seed),
        "--threads", str(threads),
        "--result", str(result),
        "--quiet",
    ]  # fmt: skip
    if secret_context is not None:
        args += ["--secret-context", str(secret_context)]
    if config.noise_seed is not None:
        args += ["--noise-seed", str(config.noise_seed)]
    if plans_sign_release(config):
        config = sign_release_config(config)
    privacy = config.session_privacy(clients=config.clients, passes_total=passes_total)
    if privacy is None:
        return [*args, "--no-require-dp"]
    # the worker states its spend at the run's delta with the run's accountant: the same numbers
    budget = privacy.epsilon if privacy.epsilon is not None else privacy.epsilon_planned
    budget = repr(budget * (1 + 1e-9))  # recomputed in another process: allow the last bit
    lifetime = budget if max_lifetime_epsilon is None else repr(max_lifetime_epsilon)
    args += [
        "--max-session-epsilon", budget,
        "--max-lifetime-epsilon", lifetime,
        "--policy-delta", repr(config.delta),
        "--policy-accountant", config.accountant,
    ]  # fmt: skip
    if privacy.shared_noise or (privacy.split_noise and not config.masked):
        # split noise without masks asks the owners' trust as shared noise does (its policy)
        args.append("--allow-shared-noise")
    return args


def masking_arguments(root: Path, clients: int) -> list[list[str]]:
    """A fresh X25519 masking key pair per client in ``root``/client-<m>/ (``glasu keygen
    --masking-key``'s files) and each worker's arguments: its own key, the others' public keys
    pinned (what organisations exchange out of band)."""
    from clients.cli.keyfiles import write_masking_key_pair

    keys = [write_masking_key_pair(root / f"client-{m}") for m in range(clients)]
    return [
        [
            "--masking-key",
            str(private),
            "--masking-peer-keys",
            ",".join(f"{j}={public}" for j, (_, public) in enumerate(keys) if j != m),
        ]
        for m, (private, _) in enumerate(keys)
    ]


def session_view(
    config: TrainConfig, layout: FederationLayout, dataset: GraphDataset
) -> dict[str, Any]:
    """The session's configuration as ``GET /v1/sessions/{id}`` shows it (no node lists), for a
    run that has no service (``--transport inprocess``): what a kept model's manifest records
    and a scoring session is built from. The noise multiplier is the one the run calibrates."""
    body = session_request(config, layout, dataset)
    view = {k: v for k, v in body.items() if k not in ("train_nodes", "eval_nodes")}
    clients = len(layout.partitions)
    if plans_sign_release(config):  # the private sign design: its one release (kind "release")
        planned = sign_privacy(config, clients=clients)
    else:
        passes = len(pass_schedule(rounds=config.rounds, eval_every=config.eval_every))
        planned = config.session_privacy(clients=clients, passes_total=passes)
    if view["privacy"] is not None and planned is not None:
        view["privacy"] = {**view["privacy"], "noise_multiplier": planned.noise_multiplier}
    return {**view, "encoding": config.encoding}


def scoring_request(
    training: dict[str, Any],
    *,
    model_session: str,
    nodes: np.ndarray,
    share_predictions: str = "none",
) -> dict[str, Any]:
    """The ``POST /v1/sessions`` body of a scoring session with the models of ``model_session``
    (``training``: that session's configuration, as ``GET /v1/sessions/{id}`` shows it and the
    models' manifests keep it): the same model, aggregation layers, seed and release noise (z as
    trained, no epsilon target: the scoring spends what its passes spend), over ``nodes``;
    ``share_predictions``: what the answering party's partners receive. Every worker says it
    is ready before the pass (``ready_gate``)."""
    privacy = training.get("privacy")
    if privacy is not None:
        privacy = {**privacy, "epsilon": None}
    return {
        "kind": "scoring",
        "model_session": model_session,
        # models of a release session (the private sign design) score by post-processing
        "model_kind": training.get("kind", "training"),
        "clients": training["clients"],
        "layers": training["layers"],
        "agg_layers": training["agg_layers"],
        "stale": 1,
        "rounds": 1,
        "batch_size": training["batch_size"],
        "fanout": training["fanout"],
        "num_nodes": training["num_nodes"],
        "eval_nodes": encode_nodes(nodes),
        "seed": training["seed"],
        "encryption": training["encryption"],
        "privacy": privacy,
        "nodes": training.get("nodes", "intersection"),
        "label_holder": training.get("label_holder"),
        "share_predictions": share_predictions,
        "ready_gate": True,
        "label": f"scoring with the models of {model_session}"[:MAX_LABEL],
    }
