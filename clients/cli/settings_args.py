"""Command-line flags generated from a pydantic-settings model, so that a flag, an environment
variable and a settings field are one name: ``--foo-bar`` = ``GLASU_FOO_BAR`` = ``foo_bar``."""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

SettingsT = TypeVar("SettingsT", bound=BaseSettings)


def add_settings_arguments(
    parser: argparse.ArgumentParser,
    model: type[BaseSettings],
    *,
    skip: frozenset[str] = frozenset(),
) -> None:
    prefix = model.model_config.get("env_prefix", "")
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        env = f"{prefix}{name}".upper()
        required = field.is_required()
        default = "" if required else f" (default {field.default})"
        help_text = f"{field.description or ''} [env {env}]{default}"
        if field.annotation is bool:
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                default=None,
                metavar=name.upper(),
                help=help_text,
            )


def settings_from_args(model: type[SettingsT], args: argparse.Namespace, **extra: Any) -> SettingsT:
    """Flags given on the command line win over the environment; unset flags fall through."""
    given = {
        name: getattr(args, name)
        for name in model.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return model(**given, **extra)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid settings: {problems}") from None
