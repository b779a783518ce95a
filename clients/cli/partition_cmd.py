"""``glasu partition``: write each client's partition files from a dataset (demos, tests)."""

from __future__ import annotations

import argparse
from pathlib import Path

from models.data import load_dataset
from models.partition import partition, save_partition


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "partition",
        help="write one partition directory per client",
        description="Split a dataset vertically and write client-<m>/ "
        "directories in the worker's on-disk format.",
    )
    p.add_argument("--dataset", choices=["cora", "citeseer", "pubmed"], default="cora")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="dataset root (default: $GLASU_DATA, else a per-user cache)",
    )
    p.add_argument("--split", choices=["paper", "public"], default="paper")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--edge-fraction", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="output directory")


def run(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.dataset, data_dir=args.data_dir, split=args.split, seed=args.seed)
    parts = partition(
        dataset, clients=args.clients, edge_fraction=args.edge_fraction, seed=args.seed
    )
    for part in parts:
        folder = save_partition(part, args.out)
        print(
            f"client {part.client}: {part.features.shape[1]} features, "
            f"{part.edge_index.shape[1] // 2} edges -> {folder}"
        )
    return 0
