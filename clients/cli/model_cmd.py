"""``glasu model show DIR``: a party's trained model (models/artefact.py) for people."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from clients.cli.errors import failing_as
from clients.cli.options import add_actions, add_command


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "model",
        help="describe a party's trained model",
        description="A party's trained model: the folder of `glasu train --model-dir DIR/<party>`"
        " or `glasu worker --model-out DIR`.",
    )
    actions = add_actions(p, title=None)
    show = add_command(
        actions,
        "show",
        help="print the model's manifest for people (or as JSON with --json)",
        description="The manifest of a party's model folder: what it is, how it was trained, "
        "what it spent of the privacy budget and how well it did.",
    )
    show.add_argument("folder", type=Path, metavar="DIR", help="the model folder")
    show.add_argument("--json", action="store_true", help="the manifest as it is stored")
    return p


def run(args: argparse.Namespace) -> int:
    from models.artefact import ModelError, describe, read_manifest

    with failing_as(str(args.folder), ModelError):
        manifest = read_manifest(args.folder)
    print(json.dumps(manifest, indent=2) if args.json else describe(manifest))
    return 0
