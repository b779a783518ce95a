"""``glasu train --party DIR ...``: the organisations' prepared folders, aligned by the private
set intersection (``clients/local/alignment.py``) and assembled into one federation over their
shared nodes (``models/data/aligned.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clients.local.alignment import align_in_process
from models.data.aligned import AlignedFederation, SharedIndex, aligned_federation
from models.data.party import read_party


def party_names(folders: Sequence[Path]) -> list[str]:
    """How the run names each party: its folder's name, or its path where names repeat."""
    names = [Path(folder).name or str(folder) for folder in folders]
    if len(set(names)) == len(names):
        return names
    return [str(folder) for folder in folders]


def model_folders(model_dir: Path, names: Sequence[str]) -> list[Path]:
    """Where ``glasu train --model-dir`` keeps each party's model, and ``glasu score`` finds it:
    ``model_dir/<name>`` (``party-<m>`` where the names are paths, because they repeat)."""
    return [Path(model_dir) / (n if "/" not in n else f"party-{m}") for m, n in enumerate(names)]


def federation_of_parties(
    folders: Sequence[Path],
    *,
    seed: int,
    nodes: str = "intersection",
    label_holder: int | None = None,
    progress: bool = False,
) -> AlignedFederation:
    """Read every folder, align the parties' ids privately and build the federation over the
    shared nodes, or over the union (``nodes``), their labels merged, the split drawn from
    ``seed``."""
    parties = [read_party(Path(folder)) for folder in folders]
    outcomes = align_in_process(
        [data.ids for data in parties], seed=seed, nodes=nodes, progress=progress
    )
    index = SharedIndex(
        alignment_id=outcomes[0].alignment_id,
        digest=outcomes[0].digest,
        aligned_nodes=outcomes[0].aligned_nodes,
        rows=[outcome.rows for outcome in outcomes],
    )
    return aligned_federation(
        parties, index, names=party_names(folders), seed=seed, label_holder=label_holder
    )
