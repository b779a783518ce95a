"""``glasu train --party DIR ...``: the organisations' prepared folders, aligned by the private
set intersection (``clients/local/alignment.py``) and assembled into one federation over their
shared nodes (``models/data/aligned.py``), or, for workers that read folders
(:func:`worker_folders`), passed through to them without their features ever being read here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from clients.alignment import AlignmentOutcome
from clients.local.alignment import align_in_process, align_keeping
from models.data.aligned import (
    AlignedFederation,
    SharedIndex,
    aligned_federation,
    aligned_split,
    party_alignment,
)
from models.data.class_names import CLASS_NAMES, class_names_in
from models.data.partition import ClientPartition, partition
from models.data.party import (
    IDS,
    META,
    NO_LABEL,
    NOT_SHARED,
    PartyData,
    read_meta,
    read_party,
    save_array,
    write_alignment,
)
from models.data.planetoid import GraphDataset


def party_names(folders: Sequence[Path]) -> list[str]:
    """How the run names each party: its folder's name, or its path where names repeat."""
    names = [Path(folder).name or str(folder) for folder in folders]
    if len(set(names)) == len(names):
        return names
    return [str(folder) for folder in folders]


def file_names(names: Sequence[str]) -> list[str]:
    """Each party's name as a file name: its name, or ``party-<m>`` where the names are paths
    (because they repeat)."""
    return [n if "/" not in n else f"party-{m}" for m, n in enumerate(names)]


def model_folders(model_dir: Path, names: Sequence[str]) -> list[Path]:
    """Where ``glasu train --model-dir`` keeps each party's model, and ``glasu score`` finds it:
    ``model_dir/<name>`` (:func:`file_names`)."""
    return [Path(model_dir) / name for name in file_names(names)]


def predictions_files(out: Path, names: Sequence[str], output_format: str) -> list[Path]:
    """Where ``glasu score --out`` writes each party's predictions: ``out/<name>.<format>``."""
    return [Path(out) / f"{name}.{output_format}" for name in file_names(names)]


def federation_of_parties(
    folders: Sequence[Path],
    *,
    seed: int,
    nodes: str = "intersection",
    label_holder: int | None = None,
    progress: bool = False,
    keeping: AlignmentKeeping | None = None,
) -> AlignedFederation:
    """Read every folder, align the parties' ids privately and build the federation over the
    shared nodes, or over the union (``nodes``), their labels merged, the split drawn from
    ``seed``. ``keeping``: align through the alignment each party keeps in its folder (the
    summary says whether it was updated or made afresh)."""
    parties = [read_party(Path(folder)) for folder in folders]
    note = None
    if keeping is None:
        index = _aligned_index(parties, seed=seed, nodes=nodes, progress=progress)
    else:
        outcomes, note = align_keeping(
            folders,
            [data.ids for data in parties],
            seed=seed,
            nodes=nodes,
            progress=progress,
            realign=keeping.realign,
            now=keeping.now,
        )
        index = _shared_index(outcomes)
    federation = aligned_federation(
        parties,
        index,
        names=party_names(folders),
        seed=seed,
        label_holder=label_holder,
    )
    if note is None:
        return federation
    return dataclasses.replace(federation, summary=f"{federation.summary} ({note})")


@dataclass(frozen=True)
class AlignmentKeeping:
    """Align through the parties' kept alignments: ``realign`` forces a fresh one (new keys);
    ``now`` (seconds since the epoch) dates it and decides whether its keys are due to rotate."""

    realign: bool = False
    now: float | None = None


def _aligned_index(
    parties: Sequence[PartyData], *, seed: int, nodes: str, progress: bool
) -> SharedIndex:
    outcomes = align_in_process(
        [data.ids for data in parties], seed=seed, nodes=nodes, progress=progress
    )
    return _shared_index(outcomes)


def _shared_index(outcomes: Sequence[AlignmentOutcome]) -> SharedIndex:
    return SharedIndex(
        alignment_id=outcomes[0].alignment_id,
        digest=outcomes[0].digest,
        aligned_nodes=outcomes[0].aligned_nodes,
        rows=[outcome.rows for outcome in outcomes],
    )


def _with_class_names(folder: Path, class_names: tuple[str, ...] | None) -> None:
    """The run's class names in a worker folder's meta.json, where the party's own differ (a
    party given the label holders' labels is given their names)."""
    meta = read_meta(folder)
    if class_names_in(meta) == class_names:
        return
    (folder / META).unlink()  # the link to the party's own meta.json, which stays as it was
    named = {k: v for k, v in meta.items() if k != CLASS_NAMES}
    if class_names is not None:
        named[CLASS_NAMES] = list(class_names)
    (folder / META).write_text(json.dumps(named, indent=2) + "\n")


@dataclass(frozen=True)
class WorkerFolders:
    """The parties' folders as the workers read them, and what the run needs of the federation
    without any features: the split and N (``dataset``; zero feature columns, no edges) and one
    partition per party of the same kind (``partitions``: who the clients are)."""

    folders: list[Path]
    dataset: GraphDataset
    partitions: list[ClientPartition]
    summary: str


def worker_folders(
    folders: Sequence[Path],
    out: Path,
    *,
    seed: int,
    label_holder: int | None = None,
    passive: Collection[int] = (),
    progress: bool = False,
) -> WorkerFolders:
    """Align the parties' ids privately (nodes every party holds) and give each party a folder in
    ``out`` that a worker reads as it would the folder of :func:`save_partition
    <models.data.partition.save_partition>` for the same federation: links to the party's own
    ``features.npy``, ``edges.npy``, ids and meta (never read or copied here; the meta copied
    where the run's class names are not the party's own), the run's labels in its row order and
    the alignment with the run's split. The ``passive`` parties (GLASU B.2) get no label and no
    split."""
    parties = [read_party(Path(folder)) for folder in folders]  # features stay on disk, mapped
    index = _aligned_index(parties, seed=seed, nodes="intersection", progress=progress)
    names = party_names(folders)
    split = aligned_split(parties, index, names=names, seed=seed, label_holder=label_holder)
    none = np.empty(0, dtype=np.int64)
    written = []
    for m, source in enumerate(folders):
        folder = Path(out) / f"client-{m}"
        folder.mkdir(parents=True)
        for name in ("features.npy", "edges.npy", IDS, META):
            (folder / name).symlink_to(Path(source).resolve() / name)
        if m not in passive:
            _with_class_names(folder, split.class_names)
        rows = index.rows[m]
        # as save_partition, without the alignment's id (no service holds it); its digest
        # names the alignment in the models this run keeps (`glasu model show`)
        alignment = dataclasses.replace(party_alignment(index, split, m), alignment_id=None)
        if m in passive:
            alignment = dataclasses.replace(
                alignment, train_nodes=none, val_nodes=none, test_nodes=none
            )
        else:
            shared = rows != NOT_SHARED
            own = np.full(rows.size, NO_LABEL, dtype=np.int64)
            own[shared] = split.labels[rows[shared]]
            save_array(folder / "labels.npy", own)
        write_alignment(alignment, folder)
        written.append(folder)
    n = index.aligned_nodes
    dataset = GraphDataset(
        name="own data (" + ", ".join(names) + ")",
        features=torch.empty((n, 0)),
        labels=torch.from_numpy(split.labels),
        edge_index=torch.empty((2, 0), dtype=torch.long),
        train_nodes=split.train_nodes,
        val_nodes=split.val_nodes,
        test_nodes=split.test_nodes,
        split="aligned",
        split_note=split.note,
    )
    # every party's partition of the same kind: all (none) of the columns, all (none) of the edges
    partitions = partition(dataset, clients=len(folders), edge_fraction=1.0, split_features=False)
    return WorkerFolders(written, dataset, partitions, split.summary)
