"""``glasu <command>``: argument parsing, checks and dispatch, and the one place where failures
become messages.

Each command is a module with ``add_parser(commands)`` (cheap: argparse, the settings models
and the service's limits; never torch, the models or the app), an optional ``check(args)``
(the checks across options, raising :class:`UsageError`) and ``run(args)``, which imports what
the command needs. So ``glasu serve`` (the service container's entrypoint) and ``glasu --help``
never load torch.

Exit codes and failures: see :mod:`clients.cli.errors`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from importlib import import_module, metadata
from types import ModuleType

from clients.cli.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    UsageError,
    describe_error,
)
from clients.cli.options import CommandParser, HelpFormatter, usage_hint

log = logging.getLogger("glasu.cli")

# Command name -> module, in the order `glasu --help` lists them.
COMMANDS: dict[str, str] = {
    "train": "clients.cli.train_cmd",
    "serve": "clients.cli.serve_cmd",
    "worker": "clients.cli.worker_cmd",
    "prepare": "clients.cli.prepare_cmd",
    "align": "clients.cli.align_cmd",
    "partition": "clients.cli.partition_cmd",
    "score": "clients.cli.score_cmd",
    "model": "clients.cli.model_cmd",
    "keygen": "clients.cli.keygen_cmd",
    "session": "clients.cli.session_cmd",
    "budget": "clients.cli.budget_cmd",
    "report": "clients.cli.report_cmd",
    "ask": "clients.cli.ask_cmd",
}
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def package_version() -> str:
    try:
        return metadata.version("glasu")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def command_module(name: str) -> ModuleType:
    return import_module(COMMANDS[name])


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="glasu",
        description="Privacy-hardened vertical federated GNN training (GLASU): CKKS-encrypted "
        "aggregation and differential privacy, on by default.",
        epilog="Run `glasu COMMAND --help` for the options of a command.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument(
        "--log-level",
        dest="cli_log_level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="warning",
        metavar="LEVEL",
        help="how much the command logs: debug, info, warning, error or critical (debug also "
        "shows the traceback of a failure)",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", title="commands"
    )
    for name in COMMANDS:
        command_module(name).add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a reader gone shows here, not in the interpreter's last flush
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """Whoever read stdout stopped (``glasu budget ... | head -2``): end quietly. Python's docs
    (signal module, "Note on SIGPIPE"): point stdout at devnull, so that flushing it again at
    exit does not fail once more, and exit with 1."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_FAILED


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command they were given to, not by `glasu`
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=args.cli_log_level,
        format="%(levelname)s %(name)s: %(message)s",
        force=True,  # some dependencies configure logging when imported
    )
    command: argparse.ArgumentParser = args.command_parser
    module = command_module(args.command)
    try:
        check = getattr(module, "check", None)
        if check is not None:
            check(args)
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return _fail(command, "interrupted", EXIT_INTERRUPTED)
    except UsageError as exc:
        return _fail(command, f"error: {exc}\n{usage_hint(command.prog)}", EXIT_USAGE, exc)
    except CliError as exc:
        return _fail(command, f"error: {exc}", exc.exit_code, exc)
    except BrokenPipeError:
        raise  # stdout's reader is gone: main ends quietly
    except OSError as exc:  # a file the user named cannot be read or written
        return _fail(command, f"error: {describe_error(exc)}", EXIT_FAILED, exc)
    except Exception as exc:
        handled = _service_failure(exc)
        if handled is None:
            raise
        return _fail(command, f"error: {handled[0]}", handled[1], exc)


def _service_failure(exc: Exception) -> tuple[str, int] | None:
    """The service refused (exit 3) or could not be reached (exit 4): one sentence. Looked up
    lazily: the HTTP clients are not imported by every command."""
    service_http = sys.modules.get("clients.service_http")
    if service_http is not None:
        if isinstance(exc, service_http.ServiceError):
            return exc.describe(), EXIT_REFUSED
        if isinstance(exc, service_http.ServiceUnavailable):
            return str(exc), EXIT_UNREACHABLE
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.TransportError):
        try:
            url = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        except RuntimeError:  # no request attached
            url = "its URL"
        hint = (
            service_http.transport_hint(exc, httpx.URL(url)) if service_http and "//" in url else ""
        )
        message = f"cannot reach the service at {url}: {type(exc).__name__}: {exc}"
        return message + (f" ({hint})" if hint else ""), EXIT_UNREACHABLE
    return None


def _fail(
    command: argparse.ArgumentParser, message: str, code: int, exc: BaseException | None = None
) -> int:
    if exc is not None:
        log.debug("%s failed", command.prog, exc_info=exc)
    print(f"{command.prog}: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
