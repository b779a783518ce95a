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
from models.private import RELEASE_LAYER, release_sensitivity
from models.report import HistoryEntry, RunReport, select_best
from models.security import (
    PrivacyConfig,
    choose_noise_multiplier,
    ledger_noise_multiplier,
    make_glasu_client,
    privacy_report,
)
from secure.accounting import PrivacyLedger
from secure.aggregation import EmbeddingCodec, PlainCodec, PlainSumAggregator, SumAggregator
from secure.schedule import PassSpec, draw_output_batch, pass_schedule

Mode = Literal["glasu", "centralized", "standalone", "simulated"]
_PRIVACY = PrivacyConfig()


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
    # Encryption and differential privacy: on unless switched off (defaults: PrivacyConfig).
    he: bool = True
    dp: bool = True
    epsilon: float | None = _PRIVACY.epsilon
    delta: float = _PRIVACY.delta
    noise_multiplier: float | None = _PRIVACY.noise_multiplier
    clip: float = _PRIVACY.clip
    accountant: Literal["rdp", "prv"] = _PRIVACY.accountant
    release_width: int = _PRIVACY.release_width
    occurrence_cap: int = _PRIVACY.occurrence_cap
    shared_noise: bool = _PRIVACY.shared_noise
    noise_seed: int | None = _PRIVACY.noise_seed

    @property
    def releases_anything(self) -> bool:
        """Centralized and standalone training send nothing to anyone."""
        return self.mode in ("glasu", "simulated")

    @property
    def encrypted(self) -> bool:
        return self.he and self.releases_anything

    def privacy_config(self) -> PrivacyConfig | None:
        if not (self.dp and self.releases_anything):
            return None
        return PrivacyConfig(
            epsilon=self.epsilon,
            delta=self.delta,
            noise_multiplier=self.noise_multiplier,
            clip=self.clip,
            accountant=self.accountant,
            release_width=self.release_width,
            occurrence_cap=self.occurrence_cap,
            shared_noise=self.shared_noise and self.he,
            noise_seed=self.noise_seed,
        )

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
    privacy = config.privacy_config()
    model = ModelConfig(
        backbone=config.backbone,
        layers=config.layers,
        hidden=config.hidden,
        dropout=config.dropout,
        receiver_width=privacy.release_width if privacy else 0,
    )
    base = dict(
        model=model,
        fanout=config.fanout,
        eval_fanout=config.eval_fanout,
        lr=config.lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        occurrence_cap=privacy.occurrence_cap if privacy else None,
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
    if privacy:  # the private arrangement: one noisy release at layer 1 (models/private.py)
        client_config = dataclasses.replace(client_config, agg_layers=(RELEASE_LAYER,))
    return FederationPlan(partitions=parts, client_config=client_config, groups=groups)


def eval_nodes(dataset: GraphDataset) -> np.ndarray:
    """One evaluation pass covers the validation and the test nodes together."""
    return np.union1d(dataset.val_nodes, dataset.test_nodes).astype(np.int64)


@dataclass
class Security:
    """The codec, the aggregator and the client factory a run uses, and its privacy plan."""

    codec_factory: Callable[[], EmbeddingCodec]
    aggregator: SumAggregator
    privacy: PrivacyConfig | None = None
    noise_multiplier: float = 0.0  # the session's z: noise std of the sum / Delta
    ledger_noise_multiplier: float = 0.0  # the z the ledger accounts
    noise_multiplier_source: str = ""
    sensitivity: float = 0.0

    def make_client(
        self, part: ClientPartition, plan: FederationPlan, config: TrainConfig, device: torch.device
    ) -> GlasuClient:
        return make_glasu_client(
            part,
            plan.client_config,
            codec=self.codec_factory(),
            device=device,
            privacy=self.privacy,
            noise_multiplier=self.noise_multiplier,
            seed=config.seed,
        )

    def report(self, *, releases: int, planned: int) -> dict[str, Any] | None:
        if self.privacy is None:
            return None
        return privacy_report(
            self.privacy,
            noise_multiplier=self.noise_multiplier,
            ledger_z=self.ledger_noise_multiplier,
            source=self.noise_multiplier_source,
            sensitivity=self.sensitivity,
            releases=releases,
            planned_releases=planned,
        )


def prepare_security(config: TrainConfig, *, releases: int, clients: int) -> Security:
    if config.encrypted:
        from secure.he import CkksCodec, CkksSumAggregator, new_context, public_context_bytes

        context = new_context()
        security = Security(
            codec_factory=lambda: CkksCodec(context),
            aggregator=CkksSumAggregator.from_bytes(public_context_bytes(context)),
        )
    else:
        security = Security(codec_factory=PlainCodec, aggregator=PlainSumAggregator())
    privacy = config.privacy_config()
    if privacy is not None:
        z, source = choose_noise_multiplier(privacy, releases=releases, clients=clients)
        security = dataclasses.replace(
            security,
            privacy=privacy,
            noise_multiplier=z,
            ledger_noise_multiplier=ledger_noise_multiplier(
                privacy, noise_multiplier=z, clients=clients
            ),
            noise_multiplier_source=source,
            sensitivity=release_sensitivity(
                clip=privacy.clip, occurrence_cap=privacy.occurrence_cap
            ),
        )
    return security


def train_inprocess(
    config: TrainConfig,
    *,
    dataset: GraphDataset | None = None,
    security: Security | None = None,
    progress: bool = True,
) -> RunReport:
    """Run ``config`` with every client in this process and return the report."""
    started = time.perf_counter()
    dataset = dataset or load_dataset(
        config.dataset, data_dir=config.data_dir, split=config.split, seed=config.seed
    )
    device = resolve_device(config.device)
    plan = plan_federation(config, dataset)
    schedule = pass_schedule(rounds=config.rounds, eval_every=config.eval_every)
    security = security or prepare_security(
        config, releases=len(schedule), clients=len(plan.partitions)
    )
    group_histories = []
    releases = 0
    stopped: str | None = None
    for group in plan.groups:
        clients = [security.make_client(plan.partitions[m], plan, config, device) for m in group]
        label = f"{config.mode} client {group[0]}" if len(plan.groups) > 1 else config.mode
        history, releases, stopped = _run_schedule(
            clients, security, schedule, dataset, config, label, progress
        )
        group_histories.append(history)
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
        privacy=security.report(releases=releases, planned=len(schedule)),
        config={
            **config.to_dict(),
            "transport": "inprocess",
            "encryption": security.aggregator.encoding == "ckks",
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
        stopped_early=stopped,
    )


def _run_schedule(
    clients: Sequence[GlasuClient],
    security: Security,
    schedule: Sequence[PassSpec],
    dataset: GraphDataset,
    config: TrainConfig,
    label: str,
    progress: bool,
) -> tuple[list[HistoryEntry], int, str | None]:
    """Every pass of the schedule; with DP on, a pass that the budget cannot cover is refused
    (as the service would) and the run stops there."""
    history: list[HistoryEntry] = []
    losses: list[float] = []
    evaluation_nodes = eval_nodes(dataset)
    ledger = None
    if security.privacy is not None:
        ledger = PrivacyLedger(
            noise_multiplier=security.ledger_noise_multiplier,
            delta=security.privacy.delta,
            accountant=security.privacy.accountant,
            epsilon_target=security.privacy.epsilon,
        )
    bar = tqdm(total=config.rounds, desc=label, unit="round", disable=not progress, leave=False)
    stopped = None
    for spec in schedule:
        if ledger is not None:
            if ledger.would_exceed():
                stopped = "budget-exhausted"
                break
            ledger.record_release()
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
            clients, security.aggregator, pass_index=spec.index, kind=spec.kind, output_nodes=nodes
        )
        if spec.kind == "train":
            losses.append(float(np.mean([o.loss for o in outcomes])))
            bar.update(1)
            continue
        entry = summarize_eval(spec.round, outcomes, losses)
        if ledger is not None:
            entry.epsilon = ledger.epsilon
        history.append(entry)
        bar.set_postfix(loss=f"{entry.loss:.3f}", val=f"{entry.val_accuracy:.3f}")
    bar.close()
    return history, (ledger.releases if ledger else 0), stopped


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
