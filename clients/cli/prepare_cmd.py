"""``glasu prepare``: one organisation's own tables (nodes, edges, labels; CSV or Parquet) checked
and converted into the worker's folder format (docs/data.md).

Nothing half-written is left behind: the folder is written beside OUT under a temporary name and
renamed to OUT at the end; any failure removes it."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

from clients.cli.errors import CliError, UsageError, failing_as
from clients.cli.options import add_command, add_output_dir_argument, check_output_dir


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "prepare",
        help="check one organisation's own tables and write its folder",
        description="Check an organisation's node, edge and (optional) label tables (CSV, "
        ".csv.gz or Parquet) and write them to OUT in the worker's folder format, keeping the "
        "organisation's own ids (private) beside the arrays. Self-loops and duplicate edges are "
        "dropped and counted; every other problem stops with one message naming the file, row "
        "and column, and leaves nothing behind. Then train with `glasu train --party OUT ...` "
        "or, deployed, `glasu align` and `glasu worker --data OUT` (docs/data.md).",
    )
    p.add_argument(
        "--nodes",
        type=Path,
        required=True,
        metavar="FILE",
        help="node table: the id column and one numeric column per feature (required)",
    )
    p.add_argument(
        "--edges",
        type=Path,
        required=True,
        metavar="FILE",
        help="edge table: two id columns, one undirected edge per row (required)",
    )
    p.add_argument(
        "--labels",
        type=Path,
        default=None,
        metavar="FILE",
        help="label table: the id column and a class index (0, 1, ...) per labelled node",
    )
    p.add_argument(
        "--id-column",
        required=True,
        metavar="NAME",
        help="the id column of the node and label tables (required)",
    )
    p.add_argument(
        "--edge-columns",
        type=_column_pair,
        default=None,
        metavar="SOURCE,TARGET",
        help="the edge table's two id columns (default: its only two columns)",
    )
    p.add_argument(
        "--label-column",
        default=None,
        metavar="NAME",
        help="the label table's class column (default: its column besides the id)",
    )
    p.add_argument(
        "--organisation",
        default=None,
        metavar="NAME",
        help="whose data this is: every flow on the folder (glasu train --party, glasu score, "
        "glasu worker) counts its releases in this organisation's privacy ledger, "
        "$XDG_DATA_HOME/glasu/ledgers/NAME.sqlite3, shared by every folder prepared under the "
        "same name (letters, digits, '.', '_', '-') (default: --out's folder name)",
    )
    add_output_dir_argument(p, "a new output folder (required)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _column_pair(text: str) -> tuple[str, str]:
    names = [name.strip() for name in text.split(",")]
    if len(names) != 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected SOURCE,TARGET, got {text!r}")
    return names[0], names[1]


def check(args: argparse.Namespace) -> None:
    if args.out.exists():
        raise UsageError(f"--out {args.out} exists; give a new folder (nothing is overwritten)")
    check_output_dir(args.out, "--out")
    from clients.owner_ledger import check_organisation_name

    if args.organisation is None:
        args.organisation = Path(os.path.abspath(args.out)).name
        flag = "--out's folder name (the default --organisation)"
    else:
        flag = "--organisation"
    try:
        check_organisation_name(args.organisation)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from models.data.party_tables import PartyTables, write_party_tables
    from models.data.table_file import TableError

    tables = PartyTables(
        nodes=args.nodes,
        edges=args.edges,
        labels=args.labels,
        id_column=args.id_column,
        edge_columns=args.edge_columns,
        label_column=args.label_column,
    )
    out = Path(os.path.abspath(args.out))
    with failing_as(f"cannot write --out {args.out}"):
        out.parent.mkdir(parents=True, exist_ok=True)
        pending = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            try:
                meta = write_party_tables(
                    tables, pending, progress=not args.quiet, organisation=args.organisation
                )
            except TableError as exc:
                raise CliError(str(exc)) from exc
            pending.rename(out)  # refuses to replace a folder that appeared meanwhile
        except BaseException:
            shutil.rmtree(pending, ignore_errors=True)
            raise
    counts = meta["summary"]
    print(
        f"{args.out}: {meta['num_rows']} nodes, {meta['num_features']} features, "
        f"{counts['undirected_edges']} undirected edges ({counts['self_loops_dropped']} "
        f"self-loops and {counts['duplicate_edges_dropped']} duplicate edges dropped), "
        f"{meta['labeled_rows']} labelled nodes"
        + (f" (classes {', '.join(meta['class_names'])})" if meta.get("class_names") else "")
    )
    from clients.owner_ledger import organisation_ledger

    print(
        f"organisation {args.organisation}: its releases are counted in "
        f"{organisation_ledger(args.organisation)} (every folder prepared for it shares it)"
    )
    return 0
