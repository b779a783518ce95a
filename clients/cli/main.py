"""``glasu <command>``: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from clients.cli import (
    budget_cmd,
    keygen_cmd,
    partition_cmd,
    serve_cmd,
    session_cmd,
    train_cmd,
    worker_cmd,
)

COMMANDS = {
    "train": train_cmd,
    "serve": serve_cmd,
    "worker": worker_cmd,
    "partition": partition_cmd,
    "keygen": keygen_cmd,
    "budget": budget_cmd,
    "session": session_cmd,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glasu",
        description="Privacy-hardened vertical federated GNN training (GLASU).",
    )
    parser.add_argument(
        "--log-level",
        dest="cli_log_level",
        default="WARNING",
        help="logging level of the command (default WARNING)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.cli_log_level.upper(),
        format="%(levelname)s %(name)s: %(message)s",
        force=True,  # some dependencies configure logging when imported
    )
    try:
        return int(COMMANDS[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("glasu: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"glasu {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
