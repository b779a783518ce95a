"""``glasu serve``: run the aggregation service (the service container's entrypoint).

Only the settings model is imported to build the parser; the app, uvicorn and the encryption
are imported when the command runs."""

from __future__ import annotations

import argparse

from clients.cli.errors import failing_as
from clients.cli.options import add_command
from clients.cli.settings_args import add_settings_arguments, settings_from_args
from service.settings import ServiceSettings


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "serve",
        help="run the aggregation service",
        description="Run the FastAPI aggregation service. Every flag can also be given as an "
        "environment variable GLASU_<FLAG> (a flag wins over its variable). An admin token is "
        "required.",
    )
    add_settings_arguments(p, ServiceSettings)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the settings (and the public context) and exit",
    )
    return p


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(ServiceSettings, args)
    from service.app import create_app
    from service.server import serve

    if args.dry_run:
        with failing_as("the service cannot start"):
            create_app(settings)
        print(f"settings are valid; would serve on {settings.host}:{settings.port}")
        return 0
    with failing_as("the service cannot start"):
        serve(settings)
    return 0
