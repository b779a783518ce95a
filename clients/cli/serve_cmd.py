"""``glasu serve``: run the aggregation service (the service container's entrypoint), or with
``--migrate-to postgresql://...`` copy its SQLite database (and payload files) into an empty
PostgreSQL database and exit (docs/deploy.md, "SQLite or PostgreSQL").

Only the settings model is imported to build the parser; the app, uvicorn and the encryption
are imported when the command runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from clients.cli.errors import failing_as
from clients.cli.options import add_command
from clients.cli.settings_args import add_settings_arguments, settings_from_args
from service.settings import POSTGRES_SCHEMES, ServiceSettings


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
    p.add_argument(
        "--migrate-to",
        metavar="URL",
        help="copy the SQLite --database (sessions, ledger, alignments and payload files) into"
        " the empty PostgreSQL database at URL (postgresql://...), then exit; a database that"
        " holds any table is refused",
    )
    return p


def run(args: argparse.Namespace) -> int:
    if args.migrate_to:
        with failing_as("the database cannot be migrated"):
            return migrate_to(_sqlite_database(args), args.migrate_to)
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


def migrate_to(source: Path, url: str) -> int:
    """Copy the SQLite database ``source`` and its payload files into the empty PostgreSQL
    database ``url``, in one transaction."""
    from service.store.transfer import copy_into_postgres

    copied = copy_into_postgres(source, url)
    rows = ", ".join(f"{table} {count}" for table, count in copied.rows.items() if count)
    print(f"copied {source} into PostgreSQL: {rows or 'no rows'}; {copied.bodies} payload bodies")
    return 0


def _sqlite_database(args: argparse.Namespace) -> Path:
    database = args.database or os.environ.get("GLASU_DATABASE")
    if database is None:
        database = ServiceSettings.model_fields["database"].default
    if str(database).startswith(POSTGRES_SCHEMES):
        raise ValueError("--migrate-to copies from an SQLite --database, not from PostgreSQL")
    return Path(database)
