"""Three organisations' own tables built from Cora, as a bank and its partners would hand them
over: each holds a vertical slice of the features, its own sample of the edges, string ids that
are not the node indices, rows in its own order; 70% of the nodes are held by all three, every
other node by one of them only. Used by the tests of `glasu prepare` and `glasu train --party`."""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.data.partition import feature_blocks, sample_edges
from models.data.planetoid import GraphDataset

PARTIES = ("bank", "insurer", "telco")
LABEL_HOLDERS = ("bank", "insurer")  # the telco carries no labels


@dataclass(frozen=True)
class CoraParties:
    folders: dict[str, Path]  # party -> folder with nodes.csv, edges.csv (, labels.csv)
    shared: np.ndarray  # Cora node indices every party holds, sorted
    nodes: dict[str, np.ndarray]  # party -> Cora node index of each row of its node table
    columns: list[np.ndarray]  # party m's feature columns (Cora indices)
    edges: dict[str, np.ndarray]  # party -> (2, 2E) Cora node indices, both directions


def node_id(node: int) -> str:
    """The id every party uses for Cora node ``node``: text, not the index."""
    return "acct-" + hashlib.sha256(f"cora-{node}".encode()).hexdigest()[:12]


def write_cora_parties(
    cora: GraphDataset, root: Path, *, overlap: float = 0.7, seed: int = 0
) -> CoraParties:
    rng = np.random.default_rng(seed)
    n = cora.num_nodes
    shared = np.sort(rng.choice(n, size=round(overlap * n), replace=False))
    owner_of_rest = rng.integers(len(PARTIES), size=n)
    columns = feature_blocks(cora.num_features, clients=len(PARTIES), seed=seed)
    folders, nodes, edges = {}, {}, {}
    for m, party in enumerate(PARTIES):
        held = np.union1d(shared, np.setdiff1d(np.flatnonzero(owner_of_rest == m), shared))
        rows = rng.permutation(held)  # the party's own row order
        own = sample_edges(cora.edge_index, fraction=0.8, rng=np.random.default_rng([seed, m]))
        own = own.numpy()
        inside = np.isin(own[0], held) & np.isin(own[1], held)
        own = own[:, inside]
        folder = root / party
        folder.mkdir(parents=True)
        features = cora.features.numpy()
        with (folder / "nodes.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["customer", *[f"f{c}" for c in columns[m]]])
            for node in rows:
                values = features[node, columns[m]]
                writer.writerow([node_id(node), *[f"{v:g}" for v in values]])
        with (folder / "edges.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["from", "to"])
            for a, b in own.T:
                if a < b:  # one row per undirected edge
                    writer.writerow([node_id(a), node_id(b)])
        if party in LABEL_HOLDERS:
            labels = cora.labels.numpy()
            with (folder / "labels.csv").open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["customer", "class"])
                for node in rows:
                    writer.writerow([node_id(node), int(labels[node])])
        folders[party], nodes[party], edges[party] = folder, rows, own
    return CoraParties(folders=folders, shared=shared, nodes=nodes, columns=columns, edges=edges)
