"""Fixtures for the `glasu` command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest


@pytest.fixture(autouse=True)
def _no_glasu_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read GLASU_* variables; the developer's shell must not change the tests."""
    for name in list(os.environ):
        if name.startswith("GLASU_"):
            monkeypatch.delenv(name)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASU_")}
    return {**env, **extra}


@pytest.fixture
def glasu() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `glasu ARGS` in a fresh interpreter (what a person sees: exit code, stdout, stderr)."""

    def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clients.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env(**env),
        )

    return run
