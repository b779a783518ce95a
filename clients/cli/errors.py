"""The failures a person can act on: ``glasu`` prints them as one line, without a traceback
(``glasu --log-level debug ...`` adds it), and exits with their code.

Exit codes of every command: 0 done, 1 a failure (:class:`CliError`), 2 bad arguments
(:class:`UsageError`, argparse), 3 the service refused a call, 4 the service could not be
reached, 5 (``glasu worker``) other clients never delivered, 6 (``glasu worker``) the data owner's
privacy policy refused the session or its budget is spent, 130 interrupted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNREACHABLE = 4
EXIT_PEERS_MISSING = 5
EXIT_POLICY = 6
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure with a message for people (what failed and, where known, what to do)."""

    exit_code = EXIT_FAILED


class UsageError(CliError):
    """The arguments do not fit together; reported like argparse's own errors, before anything
    starts."""

    exit_code = EXIT_USAGE


@contextmanager
def failing_as(what: str, *types: type[BaseException]) -> Iterator[None]:
    """Turn the errors ``types`` (default: ``ValueError`` and ``OSError``) raised by a step the
    user's input drives (loading a dataset, a partition, a key file) into a :class:`CliError`
    "``what``: <reason>"."""
    caught = types or (ValueError, OSError)
    try:
        yield
    except CliError:
        raise
    except caught as exc:
        raise CliError(f"{what}: {describe_error(exc)}") from exc


def describe_error(exc: BaseException) -> str:
    """An exception as a short reason: ``OSError`` as "<reason>: <file>", others as text."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc) or type(exc).__name__
