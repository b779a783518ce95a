"""The in-process reference trainer: every client of a run in this process (centralized,
standalone, simulated and GLASU modes), answered by function calls instead of HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from models.config import PRECOMPUTED_BACKBONES, TrainConfig
from models.data.partition import ClientPartition
from models.data.planetoid import GraphDataset, load_dataset
from models.device import resolve_device
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.keeper import KeepModels, ModelKeeper, mean_over_holders, privacy_spent
from models.layout import FederationLayout, layout_federation, session_schedule
from models.outcome import PassOutcome
from models.private import make_client
from models.private_sign import (
    design_note,
    receiver_outcome,
    receiving,
    senders,
    sign_blocks,
    sign_privacy,
    sign_receivers,
)
from models.private_sign_model import keep_sign_models
from models.run_summary import (
    HistoryEntry,
    RunSummary,
    build_run_summary,
    mean_or_none,
    recent_training_loss,
)
from secure.accounting import ReleaseRefused
from secure.aggregation import EmbeddingCodec, PlainCodec, PlainSumAggregator, SumAggregator
from secure.privacy import SessionPrivacy
from secure.schedule import SessionSchedule


@dataclass(frozen=True)
class Security:
    """The codec and the aggregator a run uses, and its privacy plan. ``party_codec``: each
    party's own codec, where codecs differ by party (masked shares: each its own masks)."""

    codec_factory: Callable[[], EmbeddingCodec]
    aggregator: SumAggregator
    privacy: SessionPrivacy | None = None
    party_codec: Callable[[int], EmbeddingCodec] | None = None

    def codec(self, party: int) -> EmbeddingCodec:
        return self.codec_factory() if self.party_codec is None else self.party_codec(party)

    def make_client(
        self,
        part: ClientPartition,
        layout: FederationLayout,
        config: TrainConfig,
        device: torch.device,
    ) -> GlasuClient:
        return make_client(
            part,
            layout.client_config,
            codec=self.codec(part.client),
            device=device,
            privacy=self.privacy,
            seed=config.seed,
            noise_seed=config.noise_seed,
        )


def prepare_security(config: TrainConfig, *, passes_total: int, clients: int) -> Security:
    privacy = config.session_privacy(clients=clients, passes_total=passes_total)
    if not config.encrypted:
        return Security(codec_factory=PlainCodec, aggregator=PlainSumAggregator(), privacy=privacy)
    if config.masked:
        return masked_security(clients, privacy=privacy)
    from secure.ckks import CkksCodec, CkksSumAggregator
    from secure.ckks_context import new_context, public_context_bytes

    context = new_context()
    return Security(
        codec_factory=lambda: CkksCodec(context),
        aggregator=CkksSumAggregator.from_bytes(public_context_bytes(context)),
        privacy=privacy,
    )


def masked_security(clients: int, *, privacy: SessionPrivacy | None) -> Security:
    """Masked shares under BFV for ``clients`` parties of this process: a fresh shared BFV key,
    a fresh X25519 key pair per party (each pinning the others' public keys) and a fresh
    session id for the mask slots, as the local alignment makes fresh signing keys."""
    import uuid

    from secure.masking.bfv import new_bfv_context
    from secure.masking.codec import BfvSumAggregator, MaskedBfvCodec
    from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys

    context, session_id = new_bfv_context(), uuid.uuid4().hex
    pairs = [MaskingKeyPair.generate() for _ in range(clients)]

    def party_codec(party: int) -> EmbeddingCodec:
        peers = {m: pair.public_bytes() for m, pair in enumerate(pairs) if m != party}
        return MaskedBfvCodec.from_keys(
            context, pairs[party], PinnedPeerKeys(peers),
            party=party, parties=clients, session_id=session_id,
        )  # fmt: skip

    def no_shared_codec() -> EmbeddingCodec:
        raise TypeError("masked shares need each party's own codec: Security.codec(party)")

    return Security(
        codec_factory=no_shared_codec,
        aggregator=BfvSumAggregator(),
        privacy=privacy,
        party_codec=party_codec,
    )


def train_inprocess(
    config: TrainConfig,
    *,
    dataset: GraphDataset | None = None,
    security: Security | None = None,
    progress: bool = True,
    layout: FederationLayout | None = None,
    keep: KeepModels | None = None,
) -> RunSummary:
    """Run ``config`` with every client in this process and return the run summary (``layout``:
    the clients, if not the partition of ``dataset``; e.g. the organisations' own data).
    ``keep``: keep each client's model of the best evaluation (models/keeper.py)."""
    started = time.perf_counter()
    dataset = dataset or load_dataset(
        config.dataset, data_dir=config.data_dir, split=config.split, seed=config.seed
    )
    device = resolve_device(config.device)
    layout = layout or layout_federation(config, dataset)
    schedule = session_schedule(config, dataset)
    if config.private and config.backbone in PRECOMPUTED_BACKBONES:
        if security is not None:
            raise ValueError(
                "the private sign design sums its releases in process: run it without a "
                "security argument"
            )
        return train_private_sign(
            config, dataset, layout, schedule, device=device, progress=progress,
            started=started, keep=keep,
        )  # fmt: skip
    security = security or prepare_security(
        config, passes_total=schedule.passes_total, clients=len(layout.partitions)
    )
    group_histories = []
    releases = 0
    stopped: str | None = None
    for group in layout.groups:
        clients = [
            security.make_client(layout.partitions[m], layout, config, device) for m in group
        ]
        label = f"{config.mode} client {group[0]}" if len(layout.groups) > 1 else config.mode
        if keep is not None and len(layout.groups) > 1:
            raise ValueError("models are kept of a federation, not of clients trained apart")
        private = security.privacy is not None
        keepers = [ModelKeeper(c, private=private) for c in clients] if keep is not None else []
        history, releases, stopped = _run_schedule(
            clients, security, schedule, config, label, progress, keepers
        )
        group_histories.append(history)
    privacy = security.privacy
    report = privacy.report(releases=releases) if privacy else None
    if keep is not None and stopped is None:
        spent = None
        if privacy is not None and report is not None:
            spent = privacy_spent(
                privacy, epsilon=report["epsilon"], delta=report["delta"],
                accountant=report["accountant"], releases=releases,
                source="the in-process run's ledger",
            )  # fmt: skip
        for keeper, folder in zip(keepers, keep.folders, strict=True):
            kept, chosen_by = keeper.choose(lambda: mean_over_holders(keepers))
            keeper.save(
                folder, kept=kept, chosen_by=chosen_by, session_config=keep.session_config,
                session_id=keep.session_id, alignment_digest=None, privacy=privacy, spent=spent,
            )  # fmt: skip
    return build_run_summary(
        config,
        transport="inprocess",
        history=_mean_history(group_histories),
        agg_layers=layout.client_config.agg_layers,
        stale=layout.client_config.stale,
        split_note=dataset.split_note,
        devices=[str(device)],
        wall_seconds=time.perf_counter() - started,
        privacy=report,
        stopped_early=stopped,
    )


def train_private_sign(
    config: TrainConfig,
    dataset: GraphDataset,
    layout: FederationLayout,
    schedule: SessionSchedule,
    *,
    device: torch.device,
    progress: bool,
    started: float,
    keep: KeepModels | None = None,
) -> RunSummary:
    """The private sign design (models/private_sign.py): each party's one release, recorded in
    the ledger before anything is released, then every receiver's local training and
    evaluations on it, each beside its party-alone reference. ``keep``: keep every party's
    model (models/private_sign_model.py)."""
    parts = layout.partitions
    privacy = sign_privacy(config, clients=len(parts))
    privacy.budget().record_release()  # refused (ReleaseRefused) if epsilon cannot cover one
    releasing = senders(parts, config.label_holder)
    blocks = sign_blocks(config, parts, privacy)
    receivers = sign_receivers(
        config, parts, layout.client_config, privacy, device=device, blocks=blocks
    )
    keepers = [ModelKeeper(r.client, private=True) for r in receivers] if keep else []
    aggregator = PlainSumAggregator()

    def run_pass(pass_index: int, kind: str, output_nodes: np.ndarray) -> list[PassOutcome]:
        return [
            receiver_outcome(r, pass_index=pass_index, kind=kind, output_nodes=output_nodes)
            for r in receivers
        ]

    security = Security(codec_factory=PlainCodec, aggregator=aggregator)
    clients = [r.client for r in receivers]
    history, _, _ = _run_schedule(
        clients, security, schedule, config, "private sign", progress, keepers, run_pass
    )
    ledger = [{"pass": 0, "clients": releasing}]
    report = privacy.report(releases=1, ledger=ledger)
    if keep is not None:
        holders = receiving(parts, config.label_holder)
        keep_sign_models(
            keep, config, parts, layout.client_config, privacy, blocks=blocks,
            keepers=dict(zip(holders, keepers, strict=True)),
            spent={
                m: privacy_spent(
                    privacy, epsilon=report["epsilon"] if m in blocks else 0.0,
                    delta=report["delta"], accountant=report["accountant"],
                    releases=int(m in blocks), source="the in-process run's ledger",
                )
                for m in range(len(parts))
            },
        )  # fmt: skip
    for entry in history:
        entry.epsilon = report["epsilon"]
    summary = build_run_summary(
        config,
        transport="inprocess",
        history=history,
        agg_layers=(),
        stale=1,
        split_note=dataset.split_note,
        devices=[str(device)],
        wall_seconds=time.perf_counter() - started,
        privacy=report,
    )
    summary.notes.append(design_note(privacy, releasing=releasing, hops=config.hops))
    return summary


def _run_schedule(
    clients: Sequence[GlasuClient],
    security: Security,
    schedule: SessionSchedule,
    config: TrainConfig,
    label: str,
    progress: bool,
    keepers: Sequence[ModelKeeper] = (),
    run_pass: Callable[[int, str, np.ndarray], list[PassOutcome]] | None = None,
) -> tuple[list[HistoryEntry], int, str | None]:
    """Every pass of the schedule; with DP on, a pass that the session's budget cannot cover is
    refused (the release decision the service makes, ``secure.accounting.decide_release``) and
    the run stops there. ``run_pass``: each client's outcome of one pass (default: the clients'
    pass in lock-step)."""
    history: list[HistoryEntry] = []
    losses: list[float] = []
    budget = security.privacy.budget() if security.privacy is not None else None
    if run_pass is None:

        def run_pass(pass_index: int, kind: str, output_nodes: np.ndarray) -> list[PassOutcome]:
            return run_pass_inprocess(
                clients, security.aggregator,
                pass_index=pass_index, kind=kind, output_nodes=output_nodes,
            )  # fmt: skip

    bar = tqdm(total=config.rounds, desc=label, unit="round", disable=not progress, leave=False)
    stopped = None
    for spec in schedule.passes:
        if budget is not None:
            try:
                budget.record_release()
            except ReleaseRefused:
                stopped = "budget-exhausted"
                break
        output_nodes = schedule.output_nodes(spec.index)
        outcomes = run_pass(spec.index, spec.kind, output_nodes)
        if keepers:
            info = {"pass": spec.index, "round": spec.round, "output_nodes": output_nodes}
            for keeper, outcome in zip(keepers, outcomes, strict=True):
                keeper.observe(info, outcome)
        # with a single label holder, every metric is the holder's alone (GLASU B.2)
        outcomes = [o for o, c in zip(outcomes, clients, strict=True) if c.holds_labels]
        if spec.kind == "train":
            losses.append(float(np.mean([o.loss for o in outcomes])))
            bar.update(1)
            continue
        entry = summarize_eval(spec.round, outcomes, losses)
        if budget is not None:
            entry.epsilon = budget.epsilon
        history.append(entry)
        bar.set_postfix(loss=f"{entry.loss:.3f}", val=f"{entry.val_accuracy:.3f}")
    bar.close()
    return history, (budget.releases if budget else 0), stopped


def summarize_eval(
    round_: int, outcomes: Sequence[PassOutcome], losses: Sequence[float]
) -> HistoryEntry:
    """One history row: clients' accuracies averaged, training loss over the recent rounds."""
    return HistoryEntry(
        round=round_,
        loss=recent_training_loss(losses),
        val_accuracy=float(np.mean([o.val_accuracy for o in outcomes])),
        test_accuracy=float(np.mean([o.test_accuracy for o in outcomes])),
        reference_val_accuracy=mean_or_none([o.reference_val_accuracy for o in outcomes]),
        reference_test_accuracy=mean_or_none([o.reference_test_accuracy for o in outcomes]),
        test_metrics=[o.test_metrics for o in outcomes],
        reference_test_metrics=[o.reference_test_metrics for o in outcomes],
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
