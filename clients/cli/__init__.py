"""The ``glasu`` command line: the composition root, the one place that wires service, clients,
models and secure together."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``glasu`` entry point (``clients.cli.main.main``). Imported when called, so that
    ``python -m clients.cli.main`` runs the module once, as ``__main__``."""
    from clients.cli.main import main as run

    return run(argv)


__all__ = ["main"]
