"""``glasu serve``: run the aggregation service."""

from __future__ import annotations

import argparse

from clients.cli.settings_args import add_settings_arguments, settings_from_args
from service.settings import ServiceSettings


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve",
        help="run the aggregation service",
        description="Run the FastAPI aggregation service. Every flag can also be given as an "
        "environment variable GLASU_<FLAG>.",
    )
    add_settings_arguments(p, ServiceSettings)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate the settings (and the public context) and exit",
    )


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(ServiceSettings, args)
    from service.server import serve

    if args.dry_run:
        from service.app import create_app

        create_app(settings)
        print(f"settings are valid; would serve on {settings.host}:{settings.port}")
        return 0
    serve(settings)
    return 0
