"""Which trained model a worker keeps, and its manifest (``models/artefact.py``).

The kept model is the one of the best evaluation pass, not the last round's:

- with differential privacy, each party's prediction depends only on its own network and the
  others' noisy releases (fixed maps of their features), so a party with a head keeps its own
  best round by its own validation accuracy (which never leaves it); a party without a head
  (label holder mode) only releases and keeps its last round;
- without differential privacy every party's network enters every prediction, so all parties
  must keep the same round: the one whose mean validation accuracy, as the label holders
  reported it to the service, is highest (earliest on ties). A worker waits, within its peer
  wait, until every holder has reported every evaluation pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clients.ledger import LocalLedger
from clients.policy import PrivacyPolicy
from models.artefact import save_model
from models.federated import GlasuClient, PassOutcome
from models.metrics import classification_metrics
from models.private import PrivateGlasuClient
from secure.privacy import SessionPrivacy

REPORT_POLL_SECONDS = 0.5


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

    def choose(
        self, session_metrics: Callable[[], list[dict[str, Any]]], holders: int, wait: float
    ) -> tuple[Snapshot, str]:
        """The kept snapshot and how it was chosen."""
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
        reported = _reported_accuracies(session_metrics, set(self.snapshots), holders, wait)
        best = max(sorted(reported), key=lambda p: reported[p])
        return self.snapshots[best], "the mean validation accuracy the label holders reported"

    def save(
        self,
        directory: Path,
        *,
        kept: Snapshot,
        chosen_by: str,
        session: Mapping[str, Any],
        session_id: str,
        alignment_digest: str | None,
        privacy: SessionPrivacy | None,
        policy: PrivacyPolicy,
        ledger: LocalLedger | None,
    ) -> Path:
        client = self.client
        partition = client.partition
        config = client.config
        model = config.model
        names = partition.feature_names or tuple(
            f"{partition.dataset} feature {c}" for c in partition.feature_columns.tolist()
        )
        manifest: dict[str, Any] = {
            "session_id": session_id,
            "session_config": dict(session["config"]),  # without node lists: public settings
            "alignment_digest": alignment_digest,
            "party": {
                "index": partition.client,
                "parties": partition.clients,
                "label_holder": config.label_holder,
                "holds_head": client.holds_labels,
            },
            "model": {
                "backbone": model.backbone,
                "layers": model.layers,
                "hidden": model.hidden,
                "dropout": model.dropout,
                "alpha": model.alpha,
                "theta": model.theta,
                "gat_heads": model.gat_heads,
                "receiver_width": model.receiver_width,
                "agg_layers": list(config.agg_layers),
                "widths": [a["width"] for a in session["config"]["agg_layers"]],
                "fanout": config.fanout,
                "eval_fanout": config.eval_fanout,
                "occurrence_cap": config.occurrence_cap,
                "nodes": session["config"].get("nodes", "intersection"),
                "seed": config.seed,
                "session_seed": session["config"]["seed"],
                "in_features": int(partition.features.shape[1]),
                "num_classes": int(client.network.classifier.out_features),
                "private": isinstance(client, PrivateGlasuClient),
            },
            "features": {
                "names": list(names),
                "dtype": "float32",
                "prepared": dict(partition.feature_summary or {}),
            },
            "classes": list(range(int(client.network.classifier.out_features))),
            "best": {"pass": kept.pass_index, "round": kept.round, "chosen_by": chosen_by},
            "release": None
            if privacy is None
            else {
                "noise_multiplier": privacy.noise_multiplier,
                "delta": privacy.delta,
                "accountant": privacy.accountant,
                "clip": privacy.clip,
                "occurrence_cap": privacy.occurrence_cap,
                "shared_noise": privacy.shared_noise,
            },
            "metrics": self._metrics(kept),
            "privacy": _privacy_spent(privacy, policy, ledger, session_id),
        }
        evaluation = None
        if kept.probabilities is not None:
            evaluation = (kept.nodes, kept.probabilities)
        return save_model(directory, manifest=manifest, weights=kept.weights, evaluation=evaluation)

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


def _reported_accuracies(
    session_metrics: Callable[[], list[dict[str, Any]]],
    passes: set[int],
    holders: int,
    wait: float,
) -> dict[int, float]:
    deadline = time.monotonic() + wait
    while True:
        reported = {
            int(m["pass"]): float(m["val_accuracy"])
            for m in session_metrics()
            if int(m["pass"]) in passes
            and m.get("val_accuracy") is not None
            and int(m.get("reports") or 0) >= holders
        }
        if set(reported) == passes:
            return reported
        if time.monotonic() >= deadline:
            missing = sorted(passes - set(reported))
            raise RuntimeError(
                f"the label holders never reported evaluation passes {missing}: the round to "
                "keep cannot be chosen in common"
            )
        time.sleep(REPORT_POLL_SECONDS)


def _privacy_spent(
    privacy: SessionPrivacy | None,
    policy: PrivacyPolicy,
    ledger: LocalLedger | None,
    session_id: str,
) -> dict[str, Any] | None:
    if privacy is None or ledger is None:
        return None
    against = (
        "one curious peer that does not collude with the service (shared noise)"
        if privacy.shared_noise
        else "the service, each peer and all peers colluding (unshared noise)"
    )
    return {
        "epsilon": ledger.epsilon(
            delta=policy.delta, accountant=policy.accountant, session_id=session_id
        ),
        "delta": policy.delta,
        "accountant": policy.accountant,
        "releases": ledger.releases(session_id=session_id),
        "against": against,
        "source": "this party's own privacy ledger",
    }
