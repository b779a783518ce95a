"""Which trained model a party keeps, and its manifest (``models/artefact.py``).

The kept model is the one of the best evaluation pass, not the last round's:

- with differential privacy, each party's prediction depends only on its own network and the
  others' noisy releases (fixed maps of their features), so a party with a head keeps its own
  best round by its own validation accuracy (which never leaves it); a party without a head
  (label holder mode) only releases and keeps its last round;
- without differential privacy every party's network enters every prediction, so all parties
  must keep the same round: the one whose mean validation accuracy over the label holders is
  highest (earliest on ties). A worker learns those means from what the holders reported to
  the service (``clients.worker``); the in-process trainer has them at hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.artefact import save_model
from models.client_config import ClientConfig
from models.data.partition import ClientPartition
from models.federated import GlasuClient
from models.metrics import classification_metrics
from models.outcome import PassOutcome
from models.private import PrivateArrangement
from secure.privacy import SessionPrivacy, release_fields
from secure.protocol import answering_party


def model_classes(client: GlasuClient) -> list[str] | list[int]:
    """The classes a model predicts, index by index: their names where the labels table named
    them (a party with a head), else their indices."""
    count = int(client.network.classifier.out_features)
    names = client.partition.class_names
    if client.holds_labels and names is not None and len(names) == count:
        return list(names)
    return list(range(count))


@dataclass(frozen=True)
class KeepModels:
    """Where a run keeps each client's model, and the session they were trained in."""

    folders: Sequence[Path]
    session_config: Mapping[str, Any]  # as GET /v1/sessions/{id} shows it (no node lists)
    session_id: str
    # each party's own id of each aligned node (None where it lacks it), where the parties
    # have ids of their own (their prepared folders): what a kept release's rows are keyed by
    own_ids: Sequence[np.ndarray] | None = None


def privacy_spent(
    privacy: SessionPrivacy,
    *,
    epsilon: float,
    delta: float,
    accountant: str,
    releases: int,
    source: str,
) -> dict[str, Any]:
    """The manifest's record of what a training spent of a party's data."""
    if privacy.split_noise:
        against = "any one peer, alone or with the service (split noise)"
    elif privacy.shared_noise:
        against = "one curious peer that does not collude with the service (shared noise)"
    else:
        against = "the service, each peer and all peers colluding (unshared noise)"
    return {
        "epsilon": epsilon,
        "delta": delta,
        "accountant": accountant,
        "releases": releases,
        "against": against,
        "source": source,
    }


def mean_over_holders(keepers: Sequence[ModelKeeper]) -> dict[int, float]:
    """Per evaluation pass, the mean validation accuracy of the clients with a head."""
    holders = [k for k in keepers if k.client.holds_labels]
    passes = set.intersection(*(set(k.snapshots) for k in holders))
    return {
        p: float(np.mean([k.snapshots[p].val_accuracy or 0.0 for k in holders])) for p in passes
    }


@dataclass
class Snapshot:
    pass_index: int
    round: int
    val_accuracy: float | None
    weights: dict[str, Any]
    nodes: np.ndarray
    probabilities: np.ndarray | None
    reference_test_accuracy: float | None


@dataclass
class ModelKeeper:
    """Snapshots the client's network at evaluation passes; :meth:`save` writes the kept one."""

    client: GlasuClient
    private: bool
    snapshots: dict[int, Snapshot] = field(default_factory=dict)

    def observe(self, info: Mapping[str, Any], outcome: PassOutcome) -> None:
        if outcome.kind != "eval":
            return
        snapshot = Snapshot(
            pass_index=int(info["pass"]),
            round=int(info["round"]),
            val_accuracy=outcome.val_accuracy,
            weights={
                k: v.detach().cpu().clone() for k, v in self.client.network.state_dict().items()
            },
            nodes=np.asarray(info["output_nodes"], dtype=np.int64),
            probabilities=outcome.probabilities,
            reference_test_accuracy=outcome.reference_test_accuracy,
        )
        if self.private:  # only the best so far (or the last, without a head) can be kept
            best = self._own_best([*self.snapshots.values(), snapshot])
            self.snapshots = {best.pass_index: best}
        else:
            self.snapshots[snapshot.pass_index] = snapshot

    def _own_best(self, snapshots: list[Snapshot]) -> Snapshot:
        if not self.client.holds_labels:
            return snapshots[-1]
        return max(
            reversed(snapshots), key=lambda s: -1.0 if s.val_accuracy is None else s.val_accuracy
        )

    def choose(self, mean_val_accuracy: Callable[[], dict[int, float]]) -> tuple[Snapshot, str]:
        """The kept snapshot and how it was chosen; ``mean_val_accuracy``: per evaluation pass,
        the label holders' mean validation accuracy (asked only without DP)."""
        if not self.snapshots:
            raise RuntimeError("no evaluation pass ran: there is no model to keep")
        if self.private:
            (kept,) = self.snapshots.values()
            how = (
                "this party's validation accuracy"
                if self.client.holds_labels
                else "the last round (this party holds no head: its part is its release)"
            )
            return kept, how
        reported = mean_val_accuracy()
        best = max(sorted(self.snapshots), key=lambda p: reported[p])
        return self.snapshots[best], "the label holders' mean validation accuracy"

    def save(
        self,
        directory: Path,
        *,
        kept: Snapshot,
        chosen_by: str,
        session_config: Mapping[str, Any],
        session_id: str,
        alignment_digest: str | None,
        privacy: SessionPrivacy | None,
        spent: dict[str, Any] | None,
        extra: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
        config: ClientConfig | None = None,
        partition: ClientPartition | None = None,
    ) -> Path:
        """Write the kept model; ``spent``: the privacy the training spent of this party's data
        (its owner's ledger), ``privacy``: the session's plan (its release settings);
        ``extra``: more manifest entries, ``files``: more files of the folder (by name),
        ``config`` and ``partition``: the settings and the party it records (default: the
        client's)."""
        client = self.client
        manifest = model_manifest(
            partition or client.partition,
            config or client.config,
            holds_head=client.holds_labels,
            feature_scale=client.feature_scale,
            num_classes=int(client.network.classifier.out_features),
            private=isinstance(client.arrangement, PrivateArrangement),
            classes=model_classes(client),
            session_config=session_config,
            session_id=session_id,
            alignment_digest=alignment_digest,
            privacy=privacy,
            spent=spent,
        )
        # the order the manifest has always had: the kept round before the release settings
        manifest = {k: v for k, v in manifest.items() if k not in ("release", "privacy")} | {
            "best": {"pass": kept.pass_index, "round": kept.round, "chosen_by": chosen_by},
            "release": manifest["release"],
            "metrics": self._metrics(kept),
            "privacy": manifest["privacy"],
        }
        evaluation = None
        if kept.probabilities is not None:
            evaluation = (kept.nodes, kept.probabilities)
        return save_model(
            directory, manifest={**manifest, **(extra or {})}, weights=kept.weights,
            evaluation=evaluation, files=files,
        )  # fmt: skip

    def _metrics(self, kept: Snapshot) -> dict[str, Any]:
        if kept.probabilities is None:
            return {}
        partition = self.client.partition
        labels = partition.labels.numpy()[kept.nodes]
        num_classes = kept.probabilities.shape[1]
        metrics: dict[str, Any] = {"reference_test_accuracy": kept.reference_test_accuracy}
        for split, nodes in (("val", partition.val_nodes), ("test", partition.test_nodes)):
            rows = np.isin(kept.nodes, nodes) & (labels >= 0)
            metrics[split] = classification_metrics(
                labels[rows], kept.probabilities[rows], num_classes=num_classes
            )
        return metrics


def model_manifest(
    partition: ClientPartition,
    config: ClientConfig,
    *,
    holds_head: bool,
    feature_scale: str | None,
    num_classes: int,
    private: bool,
    classes: list[str] | list[int],
    session_config: Mapping[str, Any],
    session_id: str,
    alignment_digest: str | None,
    privacy: SessionPrivacy | None,
    spent: dict[str, Any] | None,
) -> dict[str, Any]:
    """A kept model's manifest (``models/artefact.py``) but its kept round and metrics."""
    model = config.model
    names = partition.feature_names or tuple(
        f"{partition.dataset} feature {c}" for c in partition.feature_columns.tolist()
    )
    return {
        "session_id": session_id,
        "session_config": dict(session_config),  # without node lists: public settings
        "alignment_digest": alignment_digest,
        "party": {
            "index": partition.client,
            "parties": partition.clients,
            "label_holder": config.label_holder,
            "holds_head": holds_head,
            # one answer per customer: this party's prediction is the model's only where
            # it is the answering party; its partners get what each scoring session shares
            "answering_party": answering_party(config.label_holder),
            "partners_receive": "what each scoring session shares (share_predictions: "
            "none by default, or label-holder)",
        },
        "model": {
            "backbone": model.backbone,
            "hops": model.hops,
            "feature_scale": feature_scale,
            "layers": model.layers,
            "hidden": model.hidden,
            "dropout": model.dropout,
            "alpha": model.alpha,
            "theta": model.theta,
            "gat_heads": model.gat_heads,
            "receiver_width": model.receiver_width,
            "agg_layers": list(config.agg_layers),
            "widths": [a["width"] for a in session_config["agg_layers"]],
            "fanout": config.fanout,
            "eval_fanout": config.eval_fanout,
            "occurrence_cap": config.occurrence_cap,
            "nodes": session_config.get("nodes", "intersection"),
            "seed": config.seed,
            "session_seed": session_config["seed"],
            "in_features": int(partition.features.shape[1]),
            "num_classes": num_classes,
            "private": private,
        },
        "features": {
            "names": list(names),
            "dtype": "float32",
            "prepared": dict(partition.feature_summary or {}),
        },
        "classes": classes,
        "release": None
        if privacy is None
        else {
            "noise_multiplier": privacy.noise_multiplier,
            "delta": privacy.delta,
            "accountant": privacy.accountant,
            "clip": privacy.clip,
            "occurrence_cap": privacy.occurrence_cap,
            "shared_noise": privacy.shared_noise,
        }
        | ({"split_noise": True} if privacy.split_noise else {})
        | release_fields(privacy.release, privacy.degree_floor),
        "privacy": spent,
    }
