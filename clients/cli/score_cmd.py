"""``glasu score``: score customers jointly with the models of a training, on this machine
(clients/local/scoring.py). Deployed, each party runs ``glasu worker --model DIR
--predictions FILE`` in a scoring session the operator creates (docs/data.md, "Using the
model")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clients.cli.errors import CliError, UsageError, failing_as
from clients.cli.options import (
    add_command,
    add_output_dir_argument,
    check_output_dir,
    check_output_file,
    check_party_folders,
    positive_int,
)
from clients.cli.train_options import (
    add_encryption_argument,
    add_owner_ledger_arguments,
    check_ledger_arguments,
    owner_ledgers,
)


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "score",
        help="score customers jointly with trained models (predictions out)",
        description="Align the parties' current tables privately (new customers included; "
        "each party keeps its alignment beside its organisation's ledger, so only the ids "
        "added since are blinded), start the service and one worker per party on this "
        "machine, and score every shared node (or the label holder's --ids) with the models "
        "of `glasu train --model-dir`. Each pass is an evaluation pass with the training's "
        "protections: its layer-1 releases are encrypted, noised and counted (scoring spends "
        "privacy budget). One answer per customer: the label holder's (without one, the first "
        "party's) prediction is the model's, in OUT/<party>.csv (or .parquet), in the order of "
        "--ids (or of its own table): id, predicted class (by name where the labels table "
        "named the classes), class probabilities to 4 decimals; its partners get it too with "
        "--share-predictions label-holder. Each party's releases are counted in its "
        "organisation's privacy ledger, the one its training counted in (--ledger), under its "
        "lifetime cap.",
    )
    p.add_argument(
        "--party",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="an organisation's folder of `glasu prepare` (its current tables), once per "
        "organisation, in the training's order",
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="the folder of `glasu train --model-dir`: one model per party, DIR/<party>",
    )
    add_output_dir_argument(p, "predictions folder")
    p.add_argument(
        "--ids",
        type=Path,
        default=None,
        metavar="FILE",
        help="score only these ids of the label holder (a text file, one id per line; "
        "default: every shared node)",
    )
    p.add_argument(
        "--format", choices=["csv", "parquet"], default="csv", help="predictions file format"
    )
    p.add_argument(
        "--share-predictions",
        choices=["none", "label-holder"],
        default="none",
        help="what the label holder's partners get: the label holder's prediction is the "
        "model's answer (without a label holder, the first party's), written to "
        "OUT/<label holder>.csv; 'none' (default): nothing; 'label-holder': the same answer, "
        "in OUT/<partner>.csv in the partner's own ids",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing predictions files in --out (refused by default)",
    )
    p.add_argument(
        "--realign",
        action="store_true",
        help="align afresh with new keys instead of updating the alignment each party keeps "
        "(beside its ledger, or alignment.kept in its folder; keys also rotate after a number "
        "of updates or days: docs/data.md)",
    )
    add_owner_ledger_arguments(p)
    add_encryption_argument(p)
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch threads per worker (for graphs of 100k nodes and more, give cores / parties)",
    )
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where workers compute"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def check(args: argparse.Namespace) -> None:
    check_party_folders(args.party)
    if not args.model_dir.is_dir():
        raise UsageError(f"--model-dir {args.model_dir} is not a directory")
    if args.ids is not None and not args.ids.is_file():
        raise UsageError(f"--ids {args.ids} is not a file")
    check_output_dir(args.out, "--out")
    from clients.local.parties import party_names, predictions_files

    for path in predictions_files(args.out, party_names(args.party), args.format):
        check_output_file(path, "--out", overwrite=args.overwrite)
    check_ledger_arguments(args)
    args.owner_ledgers = owner_ledgers(args)  # an older ledger beside the data: refused now


def run(args: argparse.Namespace) -> int:
    from clients.alignment import AlignmentFailed
    from clients.local.parties import AlignmentKeeping
    from clients.local.processes import FederationFailed
    from clients.local.scoring import score_locally
    from models.artefact import ModelError
    from models.metrics import describe_scores
    from secure.accounting import count_releases

    holder_ids = None
    if args.ids is not None:
        with failing_as("--ids"):
            holder_ids = [line.strip() for line in args.ids.read_text().splitlines()]
            holder_ids = [i for i in holder_ids if i]
    with failing_as("the scoring failed", ModelError, ValueError, OSError, FederationFailed):
        try:
            summary = score_locally(
                args.party,
                args.model_dir,
                args.out,
                holder_ids=holder_ids,
                encrypted=args.encryption == "ckks",
                output_format=args.format,
                threads=args.threads,
                device=args.device,
                progress=not args.quiet,
                ledgers=args.owner_ledgers,
                keeping=AlignmentKeeping(realign=args.realign),
                share_predictions=args.share_predictions,
            )
        except AlignmentFailed as exc:
            raise CliError(f"the alignment failed: {exc}") from exc
    print(f"aligned privately: {summary.alignment}")
    print(f"scored {summary.scored_nodes} shared nodes (session {summary.session_id})")
    print(f"one answer per customer: {summary.answering}'s prediction is the model's")
    for party in summary.predictions:
        print(f"{party.party}: {party.rows} predictions in {party.path}")
        if party.metrics.get("count"):
            print(
                f"  on the {party.metrics['count']} scored nodes it has labels for: "
                + describe_scores(party.metrics)
            )
    if summary.privacy is not None:
        print(
            f"privacy spent by this scoring: epsilon {summary.privacy['epsilon']:.4g} at delta "
            f"{summary.privacy['delta']:g} ({count_releases(summary.privacy['releases'])}), "
            "counted with "
            "everything else in each organisation's ledger (glasu budget --local DIR)",
        )
    else:
        print("privacy: none (the models were trained without differential privacy)")
    sys.stdout.flush()
    return 0
