"""Fixtures for the deploy/ checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_glasu_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read GLASU_* variables; the developer's shell must not change the tests."""
    for name in list(os.environ):
        if name.startswith("GLASU_"):
            monkeypatch.delenv(name)
