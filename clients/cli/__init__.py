"""The ``glasu`` command line: the composition root, the one place that wires service, clients,
models and secure together."""

from clients.cli.main import main

__all__ = ["main"]
