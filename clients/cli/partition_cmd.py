"""``glasu partition``: write each client's partition files from a dataset (demos, tests)."""

from __future__ import annotations

import argparse

from clients.cli.errors import failing_as
from clients.cli.options import (
    add_command,
    add_output_dir_argument,
    check_output_dir,
    non_negative_int,
    positive_int,
)
from clients.cli.train_options import (
    add_data_arguments,
    add_edge_fraction_argument,
    add_setting,
    load_benchmark,
)


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "partition",
        help="write one partition directory per client",
        description="Split a dataset vertically (each client gets a block of the features and "
        "a share of the edges) and write OUT/client-<m>/ directories in the worker's on-disk "
        "format.",
    )
    add_data_arguments(p)
    add_setting(p, "--clients", "number of clients", type=positive_int, metavar="M")
    add_edge_fraction_argument(p)
    add_setting(p, "--seed", "seeds the split and the partition", type=non_negative_int)
    add_output_dir_argument(p)
    return p


def check(args: argparse.Namespace) -> None:
    check_output_dir(args.out, "--out")


def run(args: argparse.Namespace) -> int:
    from models.data.partition import partition, save_partition

    dataset = load_benchmark(args)
    with failing_as(f"cannot partition {args.dataset}", ValueError):
        parts = partition(
            dataset, clients=args.clients, edge_fraction=args.edge_fraction, seed=args.seed
        )
    for part in parts:
        with failing_as("cannot write the partition"):
            folder = save_partition(part, args.out)
        print(
            f"client {part.client}: {part.features.shape[1]} features, "
            f"{part.edge_index.shape[1] // 2} edges -> {folder}"
        )
    return 0
