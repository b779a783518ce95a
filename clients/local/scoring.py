"""``glasu score --party DIR ... --model-dir DIR``: joint scoring on this machine, as
``glasu train`` trains: the parties' current tables aligned privately (new customers included;
through the alignment each party keeps, so that only the ids added since the last one are
blinded: ``clients/alignment_keeping.py``), the service and one ``glasu worker`` per party over
loopback HTTP, a scoring session whose passes are the same split forward passes as an evaluation
pass, with the same protections (each pass's layer-1 releases encrypted, noised and counted).
The answering party (the label holder, else the first) gets the model's answer in its own ids;
its partners get the same answer in theirs where the scoring shares it, else nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from clients.local.federation import follow, local_federation
from clients.local.parties import (
    AlignmentKeeping,
    federation_of_parties,
    model_folders,
    party_names,
    predictions_files,
)
from clients.local.session import scoring_request
from clients.owner_ledger import PartyLedgers, party_ledgers
from clients.policy import PrivacyPolicy
from clients.predictions import IdsByNode, own_ids_by_node
from models.artefact import ModelError, read_manifest
from models.config import DEFAULT_HOPS, TrainConfig
from models.data.aligned import AlignedFederation
from models.data.party import NOT_SHARED, read_party
from models.metrics import classification_metrics
from secure.dp import DEFAULT_DEGREE_FLOOR
from secure.protocol import answering_party


@dataclass(frozen=True)
class PartyPredictions:
    party: str
    path: Path
    rows: int
    metrics: dict[str, Any]  # on the scored nodes this party holds a label for


@dataclass(frozen=True)
class ScoringSummary:
    session_id: str
    scored_nodes: int
    alignment: str
    answering: str  # the party whose prediction is the model's answer
    predictions: list[PartyPredictions]
    privacy: dict[str, Any] | None  # the scoring session's spend (GET .../privacy)
    training_privacy: list[dict[str, Any] | None]  # each model's training spend, as recorded


def read_models(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """Every party's manifest, checked to be one training's models, in party order."""
    manifests = [read_manifest(folder) for folder in folders]
    sessions = {m["session_id"] for m in manifests}
    if len(sessions) != 1:
        raise ModelError(f"the models come from different trainings (sessions {sorted(sessions)})")
    for index, (folder, manifest) in enumerate(zip(folders, manifests, strict=True)):
        party = manifest["party"]
        if party["index"] != index or party["parties"] != len(folders):
            raise ModelError(
                f"{folder} is the model of party {party['index']} of {party['parties']}, but "
                f"it is given as party {index} of {len(folders)}: give --party in the training's "
                "order"
            )
    return manifests


def scoring_config(manifests: Sequence[dict[str, Any]], *, encrypted: bool) -> TrainConfig:
    """The workers' settings: each model as it was trained (the worker options that rebuild
    the network; the release's noise of the training)."""
    model = manifests[0]["model"]
    release = manifests[0].get("release")
    privacy: dict[str, Any] = {"dp": False}
    if release is not None:
        privacy = {
            "dp": True,
            "epsilon": None,
            "noise_multiplier": release["noise_multiplier"],
            "delta": release["delta"],
            "accountant": release["accountant"],
            "clip": release["clip"],
            "occurrence_cap": release["occurrence_cap"],
            "shared_noise": release["shared_noise"],
            "split_noise": release.get("split_noise", False),
            "release": release.get("release", "clip-after"),
            "degree_floor": release.get("degree_floor", DEFAULT_DEGREE_FLOOR),
            "release_width": model["receiver_width"],
        }
    return TrainConfig(
        clients=len(manifests),
        backbone=model["backbone"],
        hops=model.get("hops", DEFAULT_HOPS),
        feature_scale=model.get("feature_scale") or "auto",
        layers=model["layers"],
        hidden=model["hidden"],
        dropout=model["dropout"],
        fanout=model["fanout"],
        eval_fanout=model["eval_fanout"],
        seed=model["seed"],
        nodes=model["nodes"],
        label_holder=manifests[0]["party"]["label_holder"],
        encryption="ckks" if encrypted else "none",
        **privacy,
    )


def nodes_to_score(
    federation: AlignedFederation, *, holder: int, holder_ids: Sequence[str] | None, party_ids
) -> np.ndarray:
    """Every aligned node, or the aligned nodes of the label holder's ``holder_ids`` in their
    order (as often as they are listed)."""
    if holder_ids is None:
        return np.arange(federation.index.aligned_nodes, dtype=np.int64)
    rows = federation.index.rows[holder]
    position = {pid: row for row, pid in enumerate(party_ids[holder])}
    unknown = [i for i in holder_ids if i not in position]
    if unknown:
        raise ValueError(
            f"{len(unknown)} of the ids to score are not in the label holder's table (e.g. "
            f"{unknown[0]!r})"
        )
    nodes = rows[[position[i] for i in holder_ids]]
    if (nodes == NOT_SHARED).any():
        raise ValueError(
            f"{int((nodes == NOT_SHARED).sum())} of the ids to score are not shared by the other"
            " parties: only shared nodes can be scored jointly"
        )
    return nodes


def score_locally(
    folders: Sequence[Path],
    model_dir: Path,
    out: Path,
    *,
    holder_ids: Sequence[str] | None = None,
    encrypted: bool = True,
    output_format: str = "csv",
    threads: int = 1,
    device: str = "auto",
    progress: bool = True,
    ledgers: PartyLedgers | None = None,
    keeping: AlignmentKeeping | None = None,
    share_predictions: str = "none",
) -> ScoringSummary:
    """``ledgers``: each party's organisation's privacy ledger (default: the organisations'
    own, ``clients.owner_ledger.party_ledgers``, under the owner's default lifetime cap).
    ``keeping``: how the alignment each party keeps is used (default: updated, made afresh
    when there is none or its keys are due to rotate). The answering party (the label holder,
    else the first) gets the model's answer; its partners get it too with
    ``share_predictions`` 'label-holder' (its owner, the user here, agrees), nothing with
    'none'."""
    if ledgers is None:
        ledgers = PartyLedgers(
            paths=party_ledgers(folders), max_lifetime_epsilon=PrivacyPolicy.max_lifetime_epsilon
        )
    names = party_names(folders)
    models = model_folders(model_dir, names)
    manifests = read_models(models)
    config = dataclasses.replace(scoring_config(manifests, encrypted=encrypted), device=device)
    holder = config.label_holder
    federation = federation_of_parties(
        folders,
        seed=manifests[0]["model"]["session_seed"],
        nodes=config.nodes,
        label_holder=holder,
        progress=progress,
        keeping=keeping or AlignmentKeeping(),
    )
    party_ids = [read_party(Path(folder)).ids for folder in folders]
    listed = nodes_to_score(
        federation, holder=holder or 0, holder_ids=holder_ids, party_ids=party_ids
    )
    nodes = np.unique(listed)
    answering = answering_party(holder)
    receivers = list(range(len(folders))) if share_predictions != "none" else [answering]
    files = predictions_files(out, names, output_format)
    out.mkdir(parents=True, exist_ok=True)
    # a fresh service, which never ran the training whose models score (the workers check them)
    with local_federation(encrypted=encrypted, serve_args=("--score-foreign-models",)) as fed:
        training = {
            **manifests[0]["session_config"],
            "num_nodes": federation.index.aligned_nodes,
            "encryption": "ckks" if encrypted else "none",
        }
        created = fed.admin.create_session(
            scoring_request(
                training,
                model_session=manifests[0]["session_id"],
                nodes=nodes,
                share_predictions=share_predictions,
            )
        )
        raw = {m: fed.root / f"predictions-{m}.parquet" for m in receivers}
        fed.start_workers(
            config,
            federation.partitions,
            created,
            threads=threads,
            extra=lambda m: (
                ["--model", str(models[m])]
                + (["--predictions", str(raw[m])] if m in raw else [])
                + (["--share-predictions"] if m == answering else [])
            ),
            ledgers=ledgers,
        )
        follow(fed.admin, created["session_id"], fed.processes, created["passes_total"], progress)
        privacy = fed.admin.privacy(created["session_id"]) if config.private else None
        predictions = []
        for m in receivers:
            ids = own_ids_by_node(
                federation.index.rows[m], party_ids[m], federation.index.aligned_nodes
            )
            # rows in the order of --ids, or of the party's own table
            rank = ids.rows_of_nodes if holder_ids is None else first_places(listed)
            predictions.append(
                _in_own_ids(
                    raw[m],
                    files[m],
                    ids=ids,
                    rank=rank,
                    labels=federation.dataset.labels.numpy(),
                    party=names[m],
                )
            )
    return ScoringSummary(
        session_id=created["session_id"],
        scored_nodes=int(nodes.size),
        alignment=federation.summary,
        answering=names[answering],
        predictions=predictions,
        privacy=privacy,
        training_privacy=[manifest.get("privacy") for manifest in manifests],
    )


def first_places(listed: np.ndarray) -> np.ndarray:
    """Each node's first place in ``listed`` (a node listed twice keeps its first place)."""
    rank = np.full(int(listed.max(initial=-1)) + 1, listed.size, dtype=np.int64)
    rank[listed[::-1]] = np.arange(listed.size - 1, -1, -1)
    return rank


def _in_own_ids(
    raw: Path, path: Path, *, ids: IdsByNode, rank: np.ndarray, labels: np.ndarray, party: str
) -> PartyPredictions:
    """The worker's predictions (its folder's ids are aligned node indices, since this
    machine wrote its folder) in the party's own ids, in the order ``rank`` gives the aligned
    nodes, and their metrics where labels are known."""
    table = pq.read_table(raw)
    nodes = np.asarray(table.column("id").to_pylist(), dtype=np.int64)
    held = np.array([i is not None for i in ids[nodes]], dtype=bool)
    table = table.filter(pa.array(held)).set_column(
        0, "id", pa.array(ids[nodes[held]].tolist(), pa.string())
    )
    order = np.argsort(rank[nodes[held]], kind="stable")
    table, nodes = table.take(pa.array(order)), nodes[held][order]
    if path.suffix == ".csv":
        pa_csv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    probabilities = np.stack(
        [table.column(name).to_numpy() for name in table.column_names[2:]], axis=1
    )
    known = labels[nodes]
    labelled = known >= 0
    metrics = classification_metrics(
        known[labelled], probabilities[labelled], num_classes=probabilities.shape[1]
    )
    return PartyPredictions(party=party, path=path, rows=table.num_rows, metrics=metrics)
