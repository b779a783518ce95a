"""The in-process reference trainer: centralized, standalone, simulated and GLASU modes."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from models.backbone import BackboneName, ModelConfig
from models.data import GraphDataset, SplitName, load_dataset
from models.federated import ClientConfig, GlasuClient, PassOutcome, uniform_agg_layers
from models.inprocess import run_pass_inprocess
from models.partition import ClientPartition, partition
from models.report import HistoryEntry, RunReport, select_best
from secure.aggregation import EmbeddingCodec, PlainCodec, PlainSumAggregator, SumAggregator
from secure.schedule import PassSpec, draw_output_batch, pass_schedule

Mode = Literal["glasu", "centralized", "standalone", "simulated"]


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run (the report's ``config``)."""

    dataset: str = "cora"
    data_dir: Path | None = None
    split: SplitName = "paper"
    mode: Mode = "glasu"
    clients: int = 3
    backbone: BackboneName = "gcnii"
    layers: int = 4
    agg_layers: int = 2  # K
    stale: int = 4  # Q
    rounds: int = 300
    batch_size: int = 16
    fanout: int = 3
    eval_fanout: int = 10
    eval_every: int = 10
    hidden: int = 128
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    edge_fraction: float = 0.8
    seed: int = 0
    device: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()
        }


@dataclass(frozen=True)
class FederationPlan:
    """What a mode means concretely: who holds what and how they meet."""

    partitions: list[ClientPartition]
    client_config: ClientConfig
    groups: list[list[int]]  # clients that train together; standalone has one group per client


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; choose auto, cpu or cuda")
    return torch.device(name)


def plan_federation(config: TrainConfig, dataset: GraphDataset) -> FederationPlan:
    model = ModelConfig(
        backbone=config.backbone, layers=config.layers, hidden=config.hidden, dropout=config.dropout
    )
    base = dict(
        model=model,
        fanout=config.fanout,
        eval_fanout=config.eval_fanout,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
    )
    last_only = (config.layers,)
    match config.mode:
        case "centralized":
            parts = partition(dataset, clients=1, edge_fraction=1.0, seed=config.seed)
            client_config = ClientConfig(agg_layers=last_only, stale=1, **base)
            groups = [[0]]
        case "standalone":
            parts = [
                dataclasses.replace(p, clients=1)
                for p in partition(
                    dataset,
                    clients=config.clients,
                    edge_fraction=config.edge_fraction,
                    seed=config.seed,
                )
            ]
            client_config = ClientConfig(agg_layers=last_only, stale=1, **base)
            groups = [[m] for m in range(config.clients)]
        case "simulated":
            parts = partition(dataset, clients=config.clients, edge_fraction=1.0, seed=config.seed)
            client_config = ClientConfig(
                agg_layers=tuple(range(1, config.layers + 1)), stale=1, **base
            )
            groups = [list(range(config.clients))]
        case "glasu":
            parts = partition(
                dataset,
                clients=config.clients,
                edge_fraction=config.edge_fraction,
                seed=config.seed,
            )
            client_config = ClientConfig(
                agg_layers=uniform_agg_layers(layers=config.layers, count=config.agg_layers),
                stale=config.stale,
                **base,
            )
            groups = [list(range(config.clients))]
        case _:
            raise ValueError(f"unknown mode {config.mode!r}")
    return FederationPlan(partitions=parts, client_config=client_config, groups=groups)


def eval_nodes(dataset: GraphDataset) -> np.ndarray:
    """One evaluation pass covers the validation and the test nodes together."""
    return np.union1d(dataset.val_nodes, dataset.test_nodes).astype(np.int64)


def train_inprocess(
    config: TrainConfig,
    *,
    dataset: GraphDataset | None = None,
    codec_factory: Callable[[], EmbeddingCodec] = PlainCodec,
    aggregator: SumAggregator | None = None,
    progress: bool = True,
) -> RunReport:
    """Run ``config`` with every client in this process and return the report."""
    started = time.perf_counter()
    dataset = dataset or load_dataset(
        config.dataset, data_dir=config.data_dir, split=config.split, seed=config.seed
    )
    device = resolve_device(config.device)
    plan = plan_federation(config, dataset)
    aggregator = aggregator or PlainSumAggregator()
    schedule = pass_schedule(rounds=config.rounds, eval_every=config.eval_every)
    group_histories = []
    for group in plan.groups:
        clients = [
            GlasuClient(
                plan.partitions[m], plan.client_config, codec=codec_factory(), device=device
            )
            for m in group
        ]
        label = f"{config.mode} client {group[0]}" if len(plan.groups) > 1 else config.mode
        group_histories.append(
            _run_schedule(clients, aggregator, schedule, dataset, config, label, progress)
        )
    history = _mean_history(group_histories)
    best = select_best(history)
    final = [h for h in history if h.val_accuracy is not None][-1]
    return RunReport(
        test_accuracy=float(best.test_accuracy or 0.0),
        val_accuracy=float(best.val_accuracy or 0.0),
        final_test_accuracy=float(final.test_accuracy or 0.0),
        final_val_accuracy=float(final.val_accuracy or 0.0),
        best_round=best.round,
        rounds=config.rounds,
        wall_seconds=time.perf_counter() - started,
        bytes_up=0,
        bytes_down=0,
        privacy=None,
        config={
            **config.to_dict(),
            "transport": "inprocess",
            "agg_layer_indices": list(plan.client_config.agg_layers),
            "stale_effective": plan.client_config.stale,
            "device_used": str(device),
            "split_note": dataset.split_note,
        },
        history=history,
        notes=[
            f"split: {dataset.split_note}",
            "accuracy: mean over clients of each client's own head on the joint inference",
            f"evaluation: one sampled joint inference over validation+test nodes, "
            f"fanout {config.eval_fanout}; test accuracy reported at the best validation",
        ],
    )


def _run_schedule(
    clients: Sequence[GlasuClient],
    aggregator: SumAggregator,
    schedule: Sequence[PassSpec],
    dataset: GraphDataset,
    config: TrainConfig,
    label: str,
    progress: bool,
) -> list[HistoryEntry]:
    history: list[HistoryEntry] = []
    losses: list[float] = []
    evaluation_nodes = eval_nodes(dataset)
    bar = tqdm(total=config.rounds, desc=label, unit="round", disable=not progress, leave=False)
    for spec in schedule:
        if spec.kind == "train":
            nodes = draw_output_batch(
                dataset.train_nodes,
                batch_size=config.batch_size,
                seed=config.seed,
                pass_index=spec.index,
            )
        else:
            nodes = evaluation_nodes
        outcomes = run_pass_inprocess(
            clients, aggregator, pass_index=spec.index, kind=spec.kind, output_nodes=nodes
        )
        if spec.kind == "train":
            losses.append(float(np.mean([o.loss for o in outcomes])))
            bar.update(1)
            continue
        entry = summarize_eval(spec.round, outcomes, losses)
        history.append(entry)
        bar.set_postfix(loss=f"{entry.loss:.3f}", val=f"{entry.val_accuracy:.3f}")
    bar.close()
    return history


def summarize_eval(
    round_: int, outcomes: Sequence[PassOutcome], losses: Sequence[float]
) -> HistoryEntry:
    """One history row: clients' accuracies averaged, training loss over the recent rounds."""
    recent = losses[-10:] if losses else [float("nan")]
    return HistoryEntry(
        round=round_,
        loss=float(np.mean(recent)),
        val_accuracy=float(np.mean([o.val_accuracy for o in outcomes])),
        test_accuracy=float(np.mean([o.test_accuracy for o in outcomes])),
    )


def _mean_history(histories: Sequence[list[HistoryEntry]]) -> list[HistoryEntry]:
    """Standalone reports the mean over its independent clients, round by round."""
    if len(histories) == 1:
        return histories[0]
    return [
        HistoryEntry(
            round=rows[0].round,
            loss=float(np.mean([r.loss for r in rows])),
            val_accuracy=float(np.mean([r.val_accuracy for r in rows])),
            test_accuracy=float(np.mean([r.test_accuracy for r in rows])),
        )
        for rows in zip(*histories, strict=True)
    ]
