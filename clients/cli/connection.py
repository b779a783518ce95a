"""The options and the client of the commands that talk to a running service as its operator
(``glasu session``, ``glasu align create``, ``glasu budget``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.errors import CliError, failing_as

if TYPE_CHECKING:
    from clients.admin import AdminClient


def add_server_arguments(p: argparse._ActionsContainer, *, required: bool = True) -> None:
    p.add_argument(
        "--server",
        required=required,
        metavar="URL",
        help="base URL of the service" + (" (required)" if required else ""),
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="CA certificate that signed the service's TLS certificate (default: the system's CAs)",
    )


def add_admin_arguments(p: argparse._ActionsContainer) -> None:
    """The service and the operator's admin token."""
    add_server_arguments(p)
    p.add_argument(
        "--admin-token-file",
        type=Path,
        required=True,
        metavar="PATH",
        help="file with the service's admin token (required)",
    )


def read_token(path: Path | None, *, env: str | None = None, flag: str) -> str:
    """The bearer token from ``path`` (stripped), else from the variable ``env``."""
    if path is not None:
        with failing_as(f"cannot read the token file given by {flag}"):
            token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise CliError(f"the token file {path} is empty")
        return token
    token = os.environ.get(env, "").strip() if env else ""
    if not token:
        raise CliError(f"give {flag}" + (f" or set {env}" if env else ""))
    return token


def admin_client(args: argparse.Namespace, token: str) -> AdminClient:
    from clients.admin import AdminClient, tls_verification

    with failing_as("--ca-file"):
        verify = tls_verification(args.ca_file)
    return AdminClient(base_url=args.server, token=token, verify=verify)
