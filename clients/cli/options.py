"""What every command's options share: one help formatter (defaults shown one way,
"(default: X)"), switches that read as switches, argument types that refuse bad values at once
(argparse exits with code 2 before anything starts) and the check that an output file can be
written before the work that produces it.

Only the standard library: building any command's parser stays cheap.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NoReturn

from clients.cli.errors import EXIT_USAGE, CliError, UsageError, failing_as

# -- help -------------------------------------------------------------------------------------


def default_note(value: Any) -> str:
    """How every default is shown: ``(default: X)``."""
    return f"(default: {value})"


def switch_note(on_by_default: bool) -> str:
    """How a boolean setting's default is shown: it reads as a switch, not as a value."""
    return "(on by default)" if on_by_default else "(off by default)"


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a value default and its help
    does not already say what the default is (switches say "on by default" themselves)."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", 30)
        super().__init__(prog, **kwargs)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is None
            or action.default is argparse.SUPPRESS
            or isinstance(action.default, bool)
            or action.nargs == 0  # store_true/false/const, help, version: switches
            or "(default" in text
            or "by default" in text
        ):
            return text
        return f"{text} {default_note('%(default)s')}" if text else default_note("%(default)s")


def usage_hint(prog: str) -> str:
    """The line under a usage error: where the usage is, instead of argparse's usage text."""
    return f"run `{prog} --help` for usage"


class CommandParser(argparse.ArgumentParser):
    """The parser of ``glasu`` and of each of its (sub)commands (``add_subparsers`` hands its
    class down): a usage error is one line, "glasu train: error: ...", and the line saying where
    the usage is, not argparse's usage text before it."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n{usage_hint(self.prog)}\n")


def add_command(
    commands: argparse._SubParsersAction, name: str, *, help: str, description: str
) -> argparse.ArgumentParser:
    """A (sub)command's parser, with the shared formatter. It remembers itself in the parsed
    arguments (``command_parser``), so that errors name it ("glasu session create: ...")."""
    parser = commands.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter
    )
    parser.set_defaults(command_parser=parser)
    return parser


def add_actions(
    command: argparse.ArgumentParser, *, title: str | None = "actions", required: bool = True
) -> argparse._SubParsersAction:
    """A command's actions (``glasu session create``, ``glasu session list``): the one given is
    ``args.action``."""
    heading = {} if title is None else {"title": title}
    return command.add_subparsers(dest="action", required=required, metavar="ACTION", **heading)


# -- options given explicitly ------------------------------------------------------------------


def given_options(args: argparse.Namespace) -> set[str]:
    """The options of ``args`` that the command line gave (those parsed with :class:`StoreGiven`
    or :class:`BooleanGiven`), as written: ``{"--epsilon", "--shared-noise"}``."""
    return set(getattr(args, "given_options", ()))


class _RemembersGiven(argparse.Action):
    """Stores as its base action does, then remembers which option string was given."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        if option_string:
            namespace.given_options = given_options(namespace) | {option_string}


class StoreGiven(_RemembersGiven, argparse._StoreAction):
    """``store``, remembering that the option was given (a default cannot tell: it may equal
    the value given)."""


class BooleanGiven(_RemembersGiven, argparse.BooleanOptionalAction):
    """``--foo/--no-foo``, remembering which of them was given."""


# -- argument types ----------------------------------------------------------------------------
# Each returns the converted value or raises ArgumentTypeError, which argparse reports as
# "argument --rounds: must be an integer >= 1, got -1" with exit code 2.


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_range(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in [low, high] (no upper bound when ``high`` is None)."""

    def parse(text: str) -> int:
        value = _integer(text)
        if value < low or (high is not None and value > high):
            wanted = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be an integer {wanted}, got {value}")
        return value

    return parse


positive_int = int_range(1)
non_negative_int = int_range(0)


def check_device(name: str) -> None:
    """Fail now, not after loading the data, when ``--device`` names a CUDA device this machine
    lacks. Loads torch for a CUDA name only."""
    if not name.startswith("cuda"):
        return
    from models.device import resolve_device

    try:
        resolve_device(name)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def probability(text: str) -> float:
    """In the open interval (0, 1), e.g. delta."""
    value = _number(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def fraction(text: str) -> float:
    """In (0, 1], e.g. the share of edges a client holds."""
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1, got {text}")
    return value


def rate(text: str) -> float:
    """In [0, 1), e.g. dropout."""
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text}")
    return value


# -- output files --------------------------------------------------------------------------------

PLOT_FORMATS = frozenset(
    {"png", "pdf", "svg", "svgz", "jpg", "jpeg", "eps", "ps", "tif", "tiff", "webp", "pgf"}
)


def check_output_file(
    path: Path | None,
    flag: str,
    *,
    formats: frozenset[str] = frozenset(),
    overwrite: bool | None = None,
) -> None:
    """Fail now, not after the work, if ``path`` cannot be written later: it is a directory,
    a parent is a regular file, or nothing can be created where it goes (tried: a permission
    bit does not tell for root, nor on /proc or a read-only mount). Missing parents are fine
    (they are created). ``formats``: allowed suffixes (a missing suffix is allowed).
    ``overwrite`` False: an existing file is refused (None: no such check)."""
    if path is None:
        return
    suffix = path.suffix.lower().lstrip(".")
    if formats and suffix and suffix not in formats:
        raise UsageError(
            f"{flag} {path}: unknown format {suffix!r}; use one of {', '.join(sorted(formats))}"
        )
    target = Path(os.path.abspath(path))
    if target.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name")
    if target.exists():
        if overwrite is False:
            raise existing_refused(flag, path)
        if not os.access(target, os.W_OK):
            raise UsageError(f"{flag} {path} is not writable")
    parent = next(p for p in target.parents if p.exists())
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
    try:  # the folder that will hold the file, or the nearest one that exists
        with tempfile.TemporaryFile(dir=parent, prefix=".glasu-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {path}: cannot create files in {parent} ({reason})") from None


def existing_refused(flag: str, path: Path) -> UsageError:
    """The refusal of an output that exists: every output flag words it the same."""
    return UsageError(f"{flag} {path} exists; pass --overwrite to replace it")


def check_model_folder(path: Path, flag: str, *, party: int, overwrite: bool) -> None:
    """A folder a party's model will be kept in: another party's model (or a folder a worker of
    another party claimed) is refused by name, even with ``overwrite`` (one folder per party);
    this party's own model is replaced only with ``overwrite``."""
    from models.artefact import ModelError, holds_model, model_folder_party

    check_output_dir(path, flag)
    try:
        owner = model_folder_party(path)
    except ModelError as exc:
        raise UsageError(f"{flag} {path}: {exc}") from None
    if owner is not None and owner != party:
        raise UsageError(
            f"{flag} {path} holds the model of party {owner}, not of this party ({party}): give "
            "each party its own model folder (--overwrite never replaces another party's model)"
        )
    if holds_model(path) and not overwrite:
        raise existing_refused(flag, path)


def check_party_folders(folders: Sequence[Path]) -> None:
    """``--party``: one existing folder per organisation, at least two."""
    if len(folders) < 2:
        raise UsageError("give --party once per organisation, at least two")
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--party {folder} is not a directory (a folder of glasu prepare)")


def ledger_errors() -> AbstractContextManager[None]:
    """Around finding an organisation's privacy ledger (``clients.owner_ledger``): its
    ValueError (an older ledger beside the data, a bad organisation name, two folders of one
    organisation) fails the command in one sentence, "privacy ledger: <reason>"."""
    return failing_as("privacy ledger", ValueError)


def ledger_in(folder: Path | None, *, ledger: Path | None = None) -> Path:
    """The organisation's privacy ledger: ``ledger`` (``--ledger``), or the one the flows on the
    data in ``folder`` write (``clients.owner_ledger.ledger_location``); :class:`CliError` if it
    does not exist (yet)."""
    from clients.owner_ledger import ledger_location

    with ledger_errors():
        path = ledger_location(folder, ledger=ledger)
    if not path.is_file():
        raise CliError(f"no privacy ledger at {path}: this data has released nothing yet")
    return path


def add_output_dir_argument(
    p: argparse._ActionsContainer, help: str = "output directory (required)"
) -> None:
    """``--out DIR``, required; a command checks it with :func:`check_output_dir`."""
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help=help)


def check_output_dir(path: Path, flag: str) -> None:
    """Fail now if ``path`` cannot be (created and) written as a directory later."""
    target = Path(os.path.abspath(path))
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == target else f"is under the file {existing}"
        raise UsageError(f"{flag} {path} {where}; give a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write in {existing} (permission denied)")


def write_private_file(path: Path, content: str) -> None:
    """Write a secret (a token) readable by its owner only (mode 0600), with a final newline."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(content + "\n")
