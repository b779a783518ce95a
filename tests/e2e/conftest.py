"""Fixtures for the end-to-end tests; puts e2e_kit.py on the import path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.local.processes import ManagedProcess, stop_all

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def processes() -> Iterator[list[ManagedProcess]]:
    """Every process a test starts; all stopped at the end, whatever happened."""
    started: list[ManagedProcess] = []
    yield started
    stop_all(started)
