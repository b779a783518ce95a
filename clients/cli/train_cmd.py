"""``glasu train``: a whole federation on this machine.

The parser is torch-free (``train_options``); torch, the datasets and the models are imported
when the command runs, after every option has been checked and the output files are known to
be writable."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from clients.cli import train_config, train_options
from clients.cli.errors import CliError, UsageError, failing_as
from clients.cli.options import (
    PLOT_FORMATS,
    add_command,
    check_device,
    check_model_folder,
    check_output_dir,
    check_output_file,
    check_party_folders,
    given_options,
    positive_int,
)
from secure.protocol import AlignedNodes

if TYPE_CHECKING:
    import numpy as np

    from models.config import TrainConfig
    from models.data.partition import ClientPartition
    from models.data.planetoid import GraphDataset
    from models.run_summary import RunSummary


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "train",
        help="train a federation on this machine",
        description="Start the aggregation service and one worker process per client on this "
        "machine and train (or, with --transport inprocess, every client in this process). "
        "Encryption and differential privacy are on unless switched off.",
    )
    data = p.add_argument_group("data")
    train_options.add_data_arguments(data)
    data.add_argument(
        "--party",
        type=Path,
        action="append",
        default=None,
        metavar="DIR",
        help="an organisation's folder from `glasu prepare`, given once per organisation (at "
        "least two): trains on the nodes they share, aligned by a private set intersection, "
        "instead of --dataset (docs/data.md)",
    )
    data.add_argument(
        "--nodes",
        choices=get_args(AlignedNodes),
        default="intersection",
        help="with --party: train on the nodes every party holds (intersection), or on every "
        "node any party holds (union: a party's share is zero where it lacks a node and each "
        "row is averaged over the parties that hold it; docs/data.md)",
    )
    train_options.add_owner_ledger_arguments(data)
    federation = p.add_argument_group("federation and training")
    train_options.add_federation_arguments(federation, local=True)
    federation.add_argument(
        "--transport",
        choices=["http", "inprocess"],
        default="http",
        help="http: the service and one worker process per client on loopback; "
        "inprocess: every client in this process (no sockets)",
    )
    federation.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="CPU threads per process (1 is fastest on small graphs; with --party, every worker "
        "on this machine takes N: for graphs of 100k nodes and more, give cores / parties)",
    )
    security = p.add_argument_group("encryption and differential privacy (both on by default)")
    train_options.add_encryption_argument(security)
    train_options.add_privacy_arguments(security)
    train_options.add_session_about_arguments(federation)
    output = p.add_argument_group("output")
    output.add_argument(
        "--report", type=Path, default=None, metavar="PATH", help="write the JSON report here"
    )
    output.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="write a plot of the history here (PNG, or the format its suffix names)",
    )
    output.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --report or --plot file, or the parties' models in "
        "--model-dir (refused by default)",
    )
    output.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep each organisation's trained model (the best evaluation round's) in "
        "DIR/<party> (its --party folder's name, or client-<m>), over HTTP or in process; "
        "`glasu model show DIR/<party>` describes one, `glasu score` uses them",
    )
    output.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def uses_service(args: argparse.Namespace) -> bool:
    return args.transport == "http" and args.mode != "standalone"


def check(args: argparse.Namespace) -> None:
    """Everything that can be checked before anything starts (no torch, no dataset)."""
    if args.party is not None:
        check_parties(args)
    check_nodes(args)
    train_options.check_ledger_arguments(args)
    # each organisation's ledger, before anything starts (an older ledger beside the data is
    # refused here, in one sentence, not after the alignment)
    through_service = args.party is not None and uses_service(args)
    if args.party is not None and not through_service and args.ledger is not None:
        raise UsageError(
            "--ledger: this run releases nothing to a service (--transport inprocess or --mode"
            " standalone), so it writes no ledger; leave --ledger out"
        )
    epsilon = args.epsilon if through_service and args.dp else None
    if epsilon is not None and epsilon > args.max_lifetime_epsilon:
        raise UsageError(
            f"--epsilon {epsilon:g} is over --max-lifetime-epsilon"
            f" {args.max_lifetime_epsilon:g}: every party's worker would refuse the run"
        )
    args.owner_ledgers = train_options.owner_ledgers(args) if through_service else None
    train_config.check_federation(args, through_service=uses_service(args))
    check_output_file(args.report, "--report", overwrite=args.overwrite)
    check_output_file(args.plot, "--plot", formats=PLOT_FORMATS, overwrite=args.overwrite)
    check_device(args.device)
    if args.model_dir is not None:
        if args.mode == "standalone":
            raise UsageError(
                "--model-dir keeps the models of a federation: --mode standalone trains each "
                "client apart"
            )
        check_output_dir(args.model_dir, "--model-dir")
        for party, folder in enumerate(model_folders(args) or []):
            check_model_folder(folder, "--model-dir", party=party, overwrite=args.overwrite)


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    config = train_config.config_from_args(args, **party_settings(args))
    with _sigterm_interrupts():
        summary = _train(config, args)
    finish(summary, report_path=args.report, plot_path=args.plot)
    for folder in model_folders(args) or []:
        print(f"model kept in {folder} (glasu model show {folder})")
    return 0


def _train(config: TrainConfig, args: argparse.Namespace) -> RunSummary:
    summary, partitions = _train_federation(config, args)
    if summary.gain is not None:  # a private run with its party-alone reference
        from clients.cli.train_summary import regime

        summary.regime = regime(summary, partitions, config=config, folders=args.party)
    return summary


def _train_federation(
    config: TrainConfig, args: argparse.Namespace
) -> tuple[RunSummary, list[ClientPartition]]:
    from models.device import resolve_device
    from models.layout import layout_federation
    from models.trainer import train_inprocess

    with failing_as("--device", RuntimeError, ValueError):
        resolve_device(config.device)
    if args.party is not None and _workers_read_folders(args, config):
        return _train_party_folders(config, args)
    own_ids = None  # each party's own id of each aligned node (what a kept release is keyed by)
    if args.party is not None:
        dataset, partitions, own_ids = _aligned_parties(args.party, config, progress=not args.quiet)
    else:
        dataset = train_options.load_benchmark(config)
        partitions = None
    config = _with_recipe(config, args, dataset)
    with failing_as(f"the options do not fit {config.dataset}", ValueError):
        layout = layout_federation(config, dataset, partitions=partitions)
    if not uses_service(args):
        keep = None
        folders = model_folders(args)
        if folders is not None:
            import uuid

            from clients.local.session import session_view
            from models.keeper import KeepModels

            keep = KeepModels(
                folders=folders,
                session_config={
                    **session_view(config, layout, dataset),
                    **train_options.session_about(args),
                },
                session_id=f"inprocess-{uuid.uuid4().hex}",
                own_ids=own_ids,
            )
        with failing_as(f"the options do not fit {config.dataset}", ValueError):
            summary = train_inprocess(
                config, dataset=dataset, layout=layout, progress=not args.quiet, keep=keep
            )
        return summary, layout.partitions
    from clients.local.federation import train_over_http
    from clients.local.processes import FederationFailed

    with failing_as("the federation failed", FederationFailed):
        summary = train_over_http(
            config,
            layout,
            dataset,
            threads=args.threads,
            progress=not args.quiet,
            model_dirs=model_folders(args),
            about=train_options.session_about(args),
            ledgers=args.owner_ledgers,
        )
    return summary, layout.partitions


def _with_recipe(
    config: TrainConfig, args: argparse.Namespace, dataset: GraphDataset
) -> TrainConfig:
    """The recipe's choices for this data (``models.recipe``): the labelled nodes, if this
    process holds the labels (the workers may read them from their own folders)."""
    labelled = len(dataset.train_nodes) or None
    return train_config.with_recipe(config, args, labelled=labelled)


def _workers_read_folders(args: argparse.Namespace, config: TrainConfig) -> bool:
    """Parties trained over the service on the nodes they share: each worker reads its party's
    folder, and this process never loads their features (no pooled dataset, no copies)."""
    return uses_service(args) and config.releases_anything and config.nodes == "intersection"


def _train_party_folders(
    config: TrainConfig, args: argparse.Namespace
) -> tuple[RunSummary, list[ClientPartition]]:
    import tempfile

    from clients.alignment import AlignmentFailed
    from clients.local.federation import train_over_http
    from clients.local.parties import worker_folders
    from clients.local.processes import FederationFailed
    from models.layout import layout_federation

    holder = config.label_holder
    passive = [m for m in range(len(args.party)) if holder is not None and m != holder]
    with tempfile.TemporaryDirectory(prefix="glasu-parties-") as out:
        with failing_as("--party", ValueError, OSError):
            try:
                parties = worker_folders(
                    args.party,
                    Path(out),
                    seed=config.seed,
                    label_holder=holder,
                    passive=passive,
                    progress=not args.quiet,
                )
            except AlignmentFailed as exc:
                raise CliError(f"the alignment failed: {exc}") from exc
        print(f"aligned privately: {parties.summary}", flush=True)
        config = _with_recipe(config, args, parties.dataset)
        with failing_as(f"the options do not fit {config.dataset}", ValueError):
            layout = layout_federation(config, parties.dataset, partitions=parties.partitions)
        with failing_as("the federation failed", FederationFailed):
            summary = train_over_http(
                config,
                layout,
                parties.dataset,
                threads=args.threads,
                progress=not args.quiet,
                model_dirs=model_folders(args),
                about=train_options.session_about(args),
                folders=parties.folders,
                ledgers=args.owner_ledgers,
            )
        return summary, layout.partitions


def model_folders(args: argparse.Namespace) -> list[Path] | None:
    """``--model-dir``: one folder per organisation, named after its ``--party`` folder."""
    if args.model_dir is None:
        return None
    from clients.local import parties

    names = (
        parties.party_names(args.party)
        if args.party
        else [f"client-{m}" for m in range(args.clients)]
    )
    return parties.model_folders(args.model_dir, names)


#: The options that choose or partition a benchmark dataset, which ``--party`` replaces.
BENCHMARK_OPTIONS = ("--dataset", "--data-dir", "--split", "--edge-fraction")


def check_parties(args: argparse.Namespace) -> None:
    """``--party``: at least two existing folders, no benchmark dataset (an option of one is
    refused, not ignored); M is their number."""
    check_party_folders(args.party)
    given = given_options(args) | ({"--data-dir"} if args.data_dir is not None else set())
    benchmark = [flag for flag in BENCHMARK_OPTIONS if flag in given]
    if benchmark:
        raise UsageError(
            f"--party trains the organisations' own data: drop {', '.join(benchmark)} (a "
            "benchmark dataset's)"
        )
    if "--clients" in given and args.clients != len(args.party):
        raise UsageError(
            f"--clients {args.clients}: there is one client per --party, {len(args.party)} here"
        )
    args.clients = len(args.party)


def check_nodes(args: argparse.Namespace) -> None:
    if args.nodes == "union" and args.party is None:
        raise UsageError(
            "--nodes union needs --party: in a benchmark dataset every party holds every node"
        )


def party_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--party`` sets in the run's configuration: M, the data's name, the split."""
    if args.party is None:
        return {}
    from clients.local.parties import party_names

    return {
        "clients": len(args.party),
        "dataset": f"own data ({', '.join(party_names(args.party))})",
        "split": "aligned",
    }


def _aligned_parties(
    folders: list[Path], config: TrainConfig, *, progress: bool
) -> tuple[GraphDataset, list[ClientPartition], list[np.ndarray]]:
    """The parties aligned privately: the pooled dataset, each party's partition, and each
    party's own id of each aligned node (None where it lacks it)."""
    import numpy as np

    from clients.alignment import AlignmentFailed
    from clients.local.parties import federation_of_parties
    from clients.predictions import own_ids_by_node
    from models.data.party import read_ids

    with failing_as("--party", ValueError, OSError):
        try:
            federation = federation_of_parties(
                folders,
                seed=config.seed,
                nodes=config.nodes,
                label_holder=config.label_holder,
                progress=progress,
            )
        except AlignmentFailed as exc:
            raise CliError(f"the alignment failed: {exc}") from exc
    print(f"aligned privately: {federation.summary}", flush=True)
    index = federation.index
    nodes = np.arange(index.aligned_nodes, dtype=np.int64)
    own_ids = [
        own_ids_by_node(index.rows[m], read_ids(Path(folder)), index.aligned_nodes)[nodes]
        for m, folder in enumerate(folders)
    ]
    return federation.dataset, federation.partitions, own_ids


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM (a supervisor, `kill`) stops the processes this command started, as Ctrl-C does,
    instead of leaving them behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def finish(summary: RunSummary, *, report_path: Path | None, plot_path: Path | None) -> None:
    """Print the summary, then write the files (checked before training; should writing still
    fail, the summary has been shown)."""
    from clients.cli.train_summary import describe_run
    from models.run_summary import plot_history

    print(describe_run(summary), flush=True)

    if report_path:
        with failing_as(f"cannot write the report {report_path}"):
            summary.write(report_path)
    if plot_path:
        with failing_as(f"cannot write the plot {plot_path}"):
            plot_history(summary, plot_path)
