"""Keeping a private sign model (docs/privacy.md 3.8, docs/data.md "Using the model"): the
same folder, manifest, claim and refusal rules as every model (``models/artefact.py``,
``models/keeper.py``), plus what scoring it needs.

- A receiver (a party with labels) keeps its sign head: the network's weights, with the scale
  statistics of its own hops and of the received block (as ``make_receiver`` set them), of
  the round of its own best validation accuracy.
- A sender keeps its ONE noisy release ``H1`` (``release.npz``, :class:`KeptRelease`), its
  rows keyed by the party's own ids (or the aligned node indices of a benchmark dataset); its
  digest is in the manifest. A sender without labels keeps no network.

The manifest says the design (``"design": "private-sign"``), the release's settings and that
scoring spends nothing: a scoring session post-processes each sender's kept release
(``models.private_sign_kept.kept_block``) and releases nothing new.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.artefact import PRIVATE_SIGN, ModelError, SavedModel, is_private_sign, save_model
from models.client_config import ClientConfig
from models.config import TrainConfig
from models.data.derived import hop_features as derived_hop_features
from models.data.partition import ClientPartition
from models.data.propagation import HopFeatures
from models.federated import GlasuClient
from models.inprocess import run_pass_inprocess
from models.keeper import KeepModels, ModelKeeper, model_manifest
from models.node_arrays import node_array
from models.outcome import PassOutcome
from models.private_sign import (
    SignRelease,
    beside,
    hops_of_sum,
    receiver_config,
    release_settings,
)
from models.private_sign_kept import RELEASE_FILE, KeptRelease, kept_block
from secure.aggregation import PlainSumAggregator
from secure.privacy import SessionPrivacy

#: What the manifest says of scoring a private sign model
SCORING_SPENDS_NOTHING = (
    "post-processing of each sender's kept release over the current graph: no new release, "
    "epsilon 0 (docs/privacy.md 3.8)"
)


def design_fields(
    release: SignRelease, *, hops: int, kept: KeptRelease | None
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest's entries of the design and the folder's release file (a sender's)."""
    files: dict[str, bytes] = {}
    sign = {
        "width": release.width,
        "projection_seed": release.projection_seed,
        "clip": release.clip,
        "occurrence_cap": release.occurrence_cap,
        "degree_floor": release.degree_floor,
        "noise_std": release.noise_std,
        "hops": hops,
        "scoring": SCORING_SPENDS_NOTHING,
        "file": None,
    }
    if kept is not None:
        data = kept.to_bytes()
        files[RELEASE_FILE] = data
        sign |= {
            "file": RELEASE_FILE,
            "sha256": hashlib.sha256(data).hexdigest(),
            "rows": int(kept.h1.shape[0]),
            "rows_keyed_by": kept.keyed_by,
        }
    return {"design": PRIVATE_SIGN, "sign_release": sign}, files


def save_sign_model(
    directory: Path,
    *,
    partition: ClientPartition,
    config: ClientConfig,
    keeper: ModelKeeper | None,
    release: SignRelease,
    kept: KeptRelease | None,
    last_round: int,
    session_config: Mapping[str, Any],
    session_id: str,
    alignment_digest: str | None,
    privacy: SessionPrivacy,
    spent: dict[str, Any] | None,
) -> Path:
    """Write party ``partition.client``'s private sign model: its head of its own best round
    (``keeper``, a receiver's) and its kept release (``kept``, a sender's); ``config``: the
    session's client settings (the manifest's, which a scoring session is checked against)."""
    extra, files = design_fields(release, hops=config.model.hops, kept=kept)
    where = {
        "session_config": session_config, "session_id": session_id,
        "alignment_digest": alignment_digest, "privacy": privacy, "spent": spent,
    }  # fmt: skip
    if keeper is not None:
        snapshot, chosen_by = keeper.choose(dict)  # private: its own best, never asked
        return keeper.save(
            directory, kept=snapshot, chosen_by=chosen_by, extra=extra, files=files,
            config=config, partition=partition, **where,
        )  # fmt: skip
    manifest = model_manifest(
        partition, config, holds_head=False, feature_scale=None, num_classes=1,
        private=False, classes=[0], **where,
    )  # fmt: skip
    manifest["best"] = {
        "pass": 0,
        "round": last_round,
        "chosen_by": "the last round (this party holds no head: its part is its release)",
    }
    manifest["metrics"] = {}
    return save_model(directory, manifest={**manifest, **extra}, weights={}, files=files)


def kept_release(model: SavedModel) -> KeptRelease | None:
    """A private sign sender's kept release, checked against the manifest's digest
    (:class:`ModelError` for a file that is missing, damaged or not the one kept); None for a
    party that released nothing."""
    if not is_private_sign(model.manifest):
        raise ModelError(f"{model.path} is not a model of the private sign design")
    sign = model.manifest["sign_release"]
    if sign.get("file") is None:
        return None
    path = model.path / RELEASE_FILE
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(
            f"the private sign model {model.path} has no kept release ({exc})"
        ) from exc
    if hashlib.sha256(data).hexdigest() != sign.get("sha256"):
        raise ModelError(f"{path} is not the release the model kept (its digest differs)")
    try:
        return KeptRelease.read(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot read the kept release {path} ({exc})") from exc


def keep_sign_models(
    keep: KeepModels,
    config: TrainConfig,
    partitions: Sequence[ClientPartition],
    client_config: ClientConfig,
    privacy: SessionPrivacy,
    *,
    blocks: Mapping[int, HopFeatures],
    keepers: Mapping[int, ModelKeeper],
    spent: Mapping[int, dict[str, Any]],
) -> None:
    """Every party's model of an in-process private sign run (``blocks``: the senders'
    released blocks, ``keepers``: the receivers' heads, ``spent``: what the run spent of each
    party's data, by party)."""
    for part, folder in zip(partitions, keep.folders, strict=True):
        m = part.client
        own_ids = None if keep.own_ids is None else keep.own_ids[m]
        save_sign_model(
            folder, partition=part, config=client_config, keeper=keepers.get(m),
            release=release_settings(
                privacy, width=config.release_width, seed=config.seed, party=m
            ),
            kept=None if m not in blocks else KeptRelease.of(blocks[m].hops[0], own_ids),
            last_round=config.rounds, session_config=keep.session_config,
            session_id=keep.session_id, alignment_digest=None, privacy=privacy, spent=spent[m],
        )  # fmt: skip


def scored_block_rows(
    kept: KeptRelease,
    own_ids: np.ndarray,
    partition: ClientPartition,
    *,
    hops: int,
    nodes: np.ndarray,
) -> np.ndarray:
    """A sender's block rows of ``nodes`` over its current table, from its kept release alone
    (``own_ids``: each current aligned node's key, as :meth:`KeptRelease.of` takes them): the
    rows of new customers filled from their covered neighbours, never from their features."""
    rows, covered = kept.in_current_order(own_ids)
    return block_rows(kept_block(rows, covered, partition, hops=hops), nodes)


def block_rows(block: HopFeatures, nodes: np.ndarray) -> np.ndarray:
    """The rows of ``nodes`` of a sender's block, its hops side by side."""
    picked = torch.from_numpy(np.asarray(nodes, dtype=np.int64))
    return torch.cat([hop[picked] for hop in block.hops], dim=1).numpy()


def kept_head_outcome(
    model: SavedModel,
    partition: ClientPartition,
    config: ClientConfig,
    received: torch.Tensor,
    *,
    nodes: np.ndarray,
    device: torch.device | str = "cpu",
) -> PassOutcome:
    """A receiver's kept head on its own hops of ``nodes`` (scaled with the kept statistics)
    beside the others' block rows of them (``received``, len(nodes) x hops * width)."""
    hops = config.model.hops
    width = received.shape[1] // hops
    full = node_array(partition.num_nodes, received.shape[1], device=torch.device("cpu"))
    full.zero_()
    full[torch.from_numpy(np.asarray(nodes, dtype=np.int64))] = received
    alone = dataclasses.replace(partition, clients=1)
    own = derived_hop_features(alone, hops=hops)
    local = receiver_config(config)
    blocks = hops_of_sum(full, width=width, hops=hops)
    client = GlasuClient(alone, local, device=device, hop_features=beside(own, blocks))
    client.network.load_state_dict(model.weights)
    (outcome,) = run_pass_inprocess(
        [client], PlainSumAggregator(), pass_index=0, kind="eval", output_nodes=nodes
    )
    return outcome
