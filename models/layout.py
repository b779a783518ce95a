"""What a training mode means concretely: which partitions, which client configuration, which
clients train together."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from models.backbone import ModelConfig
from models.client_config import ClientConfig, uniform_agg_layers
from models.config import PRECOMPUTED_BACKBONES, TrainConfig
from models.data.partition import ClientPartition, partition, without_labels
from models.data.planetoid import GraphDataset
from secure.privacy import RELEASE_LAYER
from secure.schedule import SessionSchedule


@dataclass(frozen=True)
class FederationLayout:
    """Who holds what and how they meet."""

    partitions: list[ClientPartition]
    client_config: ClientConfig
    groups: list[list[int]]  # clients that train together; standalone has one group per client


def client_config(config: TrainConfig) -> ClientConfig:
    """How every client of ``config`` computes: its model, sampling and optimiser, and which
    layers meet at the service how often (the private arrangement's single release under DP)."""
    model = ModelConfig(
        backbone=config.backbone,
        hops=config.hops,
        feature_scale=config.feature_scale,
        layers=config.layers,
        hidden=config.hidden,
        dropout=config.dropout,
        # the private sign design reads the others' release as propagated features instead
        receiver_width=config.release_width
        if config.private and config.backbone not in PRECOMPUTED_BACKBONES
        else 0,
    )
    base = dict(
        model=model,
        fanout=config.fanout,
        eval_fanout=config.eval_fanout,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        occurrence_cap=config.occurrence_cap if config.private else None,
        cache_rounds=config.cache_rounds,
        instance_weighting=config.instance_weighting,
        weight_threshold=config.weight_threshold,
        count_aware=config.nodes == "union",
        label_holder=config.label_holder if config.releases_anything else None,
    )
    match config.mode:
        case "centralized" | "standalone":
            configured = ClientConfig(agg_layers=(config.layers,), stale=1, **base)
        case "simulated":
            configured = ClientConfig(
                agg_layers=tuple(range(1, config.layers + 1)), stale=1, **base
            )
        case "glasu":
            configured = ClientConfig(
                agg_layers=uniform_agg_layers(layers=config.layers, count=config.agg_layers),
                stale=config.stale,
                **base,
            )
        case _:
            raise ValueError(f"unknown mode {config.mode!r}")
    if config.private:  # the private arrangement: one noisy release at layer 1 (models/private.py)
        configured = dataclasses.replace(configured, agg_layers=(RELEASE_LAYER,))
    return configured


def layout_federation(
    config: TrainConfig, dataset: GraphDataset, *, partitions: list[ClientPartition] | None = None
) -> FederationLayout:
    """``partitions``: the organisations' own (aligned) data, used instead of partitioning
    ``dataset`` in every mode but centralized, which trains on ``dataset`` (their pooled data)."""
    match config.mode:
        case "centralized":
            parts = partition(dataset, clients=1, edge_fraction=1.0, seed=config.seed)
            groups = [[0]]
        case "standalone":
            parts = [
                dataclasses.replace(p, clients=1)
                for p in partitions
                or partition(
                    dataset,
                    clients=config.clients,
                    edge_fraction=config.edge_fraction,
                    seed=config.seed,
                )
            ]
            groups = [[m] for m in range(len(parts))]
            if config.label_holder is not None:  # the label holder alone
                groups = [[config.label_holder]]
        case "simulated":
            parts = partitions or partition(
                dataset, clients=config.clients, edge_fraction=1.0, seed=config.seed
            )
            groups = [list(range(len(parts)))]
        case "glasu":
            parts = partitions or partition(
                dataset,
                clients=config.clients,
                edge_fraction=config.edge_fraction,
                seed=config.seed,
            )
            groups = [list(range(len(parts)))]
        case _:
            raise ValueError(f"unknown mode {config.mode!r}")
    if config.label_holder is not None and config.mode != "centralized":
        if not 0 <= config.label_holder < len(parts):
            raise ValueError(
                f"the label holder must be a client 0..{len(parts) - 1}, got {config.label_holder}"
            )
        if config.releases_anything:  # the passive parties keep no label and no split
            parts = [p if p.client == config.label_holder else without_labels(p) for p in parts]
    return FederationLayout(partitions=parts, client_config=client_config(config), groups=groups)


def eval_nodes(dataset: GraphDataset) -> np.ndarray:
    """One evaluation pass covers the validation and the test nodes together."""
    return np.union1d(dataset.val_nodes, dataset.test_nodes).astype(np.int64)


def session_schedule(config: TrainConfig, dataset: GraphDataset) -> SessionSchedule:
    """The passes of a run of ``config`` on ``dataset``, as the service would plan them."""
    return SessionSchedule.create(
        rounds=config.rounds,
        eval_every=config.eval_every,
        train_nodes=dataset.train_nodes,
        eval_nodes=eval_nodes(dataset),
        batch_size=config.batch_size,
        seed=config.seed,
    )
