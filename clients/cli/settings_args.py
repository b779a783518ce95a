"""Command-line flags generated from a pydantic-settings model, so that a flag, an environment
variable and a settings field are one name: ``--foo-bar`` = ``GLASU_FOO_BAR`` = ``foo_bar``.

Every flag's argparse default is None, so that an unset flag falls through to the environment
and then to the field's default; the help shows that default as ``(default: X)``, a boolean as
a switch (``--foo/--no-foo``, "on by default"). Numbers and choices are checked when the flag
is parsed (argparse exits with code 2); the rest (files, cross-field rules) when the settings
are built, still before anything starts.

A command that only shares some of the settings (``glasu report``'s and ``glasu budget``'s
privacy policy, the worker's) takes them with :func:`add_field_arguments`: the field's type,
bounds, choices and default, under the command's own name and help where it has them.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Mapping
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Literal,
    NamedTuple,
    TypeVar,
    Union,
    get_args,
    get_origin,
)

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from clients.cli.errors import UsageError
from clients.cli.options import default_note, switch_note

SettingsT = TypeVar("SettingsT", bound=BaseSettings)

# Help for fields whose model gives no description (the models live outside the CLI).
FALLBACK_HELP = {
    "port": "TCP port to listen on",
    "log_level": "log level of the service and of uvicorn",
    "dropout": "dropout rate of the local layers",
    "lr": "learning rate of the local model",
    "weight_decay": "weight decay of the local model",
}


def add_settings_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseSettings],
    *,
    skip: frozenset[str] = frozenset(),
) -> None:
    prefix = model.model_config.get("env_prefix", "")
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = f"--{name.replace('_', '-')}"
        kind = _without_none(field.annotation)
        text = _help(name, field, env=f"{prefix}{name}".upper(), boolean=kind is bool)
        parser.add_argument(
            flag, dest=name, default=None, help=text, **_value_options(name, field, kind, name)
        )


class FieldFlag(NamedTuple):
    """A command's flag for a settings field: its name (default ``--foo-bar`` for ``foo_bar``)
    and its help (default: the field's description)."""

    flag: str | None = None
    help: str | None = None


def add_field_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    fields: Mapping[str, FieldFlag],
) -> None:
    """Flags for the ``fields`` of ``model`` in a command that reads no settings (neither the
    environment nor a settings file): each flag's type, bounds, choices and default are its
    field's, so that the command and the settings cannot disagree; the flag is stored under its
    own name (``--delta``: ``args.delta``)."""
    for name, own in fields.items():
        field = model.model_fields[name]
        flag = own.flag or f"--{name.replace('_', '-')}"
        dest = flag.removeprefix("--").replace("-", "_")
        kind = _without_none(field.annotation)
        text = own.help or _description(name, field)
        if kind is bool:
            text = f"{text} {switch_note(bool(field.default))}"
        parser.add_argument(
            flag,
            dest=dest,
            default=field.default,
            help=text,
            **_value_options(name, field, kind, dest),
        )


def _value_options(name: str, field: FieldInfo, kind: Any, dest: str) -> dict[str, Any]:
    """How argparse reads a field's value: a switch, one of its choices, or a number within its
    bounds (anything else: the string, converted when the settings are built)."""
    if kind is bool:
        return {"action": argparse.BooleanOptionalAction}
    if get_origin(kind) is Literal:
        return {"choices": [str(c) for c in get_args(kind)]}
    return {"type": _number_type(name, field, kind), "metavar": dest.upper()}


def settings_from_args(model: type[SettingsT], args: argparse.Namespace, **extra: Any) -> SettingsT:
    """Flags given on the command line win over the environment; unset flags fall through.
    Invalid or missing settings raise :class:`UsageError` naming the flag and the variable."""
    given = {
        name: getattr(args, name)
        for name in model.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return model(**given, **extra)
    except ValidationError as exc:
        prefix = model.model_config.get("env_prefix", "")
        problems = "; ".join(_problem(error, prefix) for error in exc.errors())
        raise UsageError(f"invalid settings: {problems}") from None


def _problem(error: Any, prefix: str) -> str:
    location = [str(part) for part in error.get("loc", ())]
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if not location:
        return message
    name = location[0]
    where = f"--{name.replace('_', '-')} (or {prefix}{name.upper()})"
    if error.get("type") == "missing":
        return f"{where} is required"
    return f"{where}: {message}"


def _help(name: str, field: FieldInfo, *, env: str, boolean: bool) -> str:
    text = f"{_description(name, field)} [env {env}]"
    if field.is_required():
        return f"{text} (required)"
    if boolean:
        return f"{text} {switch_note(bool(field.default))}"
    if field.default is None:
        return text
    default = str(field.default) if isinstance(field.default, Path) else field.default
    return f"{text} {default_note(default).replace('%', '%%')}"


def _description(name: str, field: FieldInfo) -> str:
    return _phrase(field.description or FALLBACK_HELP.get(name, name.replace("_", " ")))


def _phrase(description: str) -> str:
    """A model's description as a help phrase: no final period, lower case first word (unless
    it is an acronym or a name such as "CKKS" or "SQLite")."""
    text = description.strip().removesuffix(".")
    first = text.split(" ", 1)[0]
    if first[:1].isupper() and first[1:].islower():
        text = text[0].lower() + text[1:]
    return text.replace("%", "%%")


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _number_type(name: str, field: FieldInfo, kind: Any) -> Any:
    """For int and float fields, a parser that applies the field's bounds (ge, lt, ...) at once;
    None (the string as given) for everything else."""
    if kind not in (int, float):
        return None

    def parse(text: str) -> Any:
        adapter = TypeAdapter(Annotated[kind, *field.metadata] if field.metadata else kind)
        try:
            return adapter.validate_python(text)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"]
            raise argparse.ArgumentTypeError(f"{message}, got {text!r}") from None

    return parse
