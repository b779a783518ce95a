"""Fixtures for the service tests: apps on a temporary SQLite file and an in-process client."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

sys.path.insert(0, str(Path(__file__).parent))

from service_testkit import ADMIN_TOKEN, http_client

from service.app import create_app, service_context
from service.clock import Clock
from service.settings import ServiceSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _no_glasu_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read GLASU_* variables; the developer's shell must not change the tests."""
    for name in list(os.environ):
        if name.startswith("GLASU_"):
            monkeypatch.delenv(name)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "service.sqlite3"


@pytest.fixture
def make_settings(database: Path) -> Callable[..., ServiceSettings]:
    def make(**overrides: Any) -> ServiceSettings:
        values: dict[str, Any] = {"database": database, "admin_token": ADMIN_TOKEN}
        values.update(overrides)
        return ServiceSettings(**values)

    return make


@pytest.fixture
def make_app(make_settings: Callable[..., ServiceSettings]) -> Iterator[Callable[..., FastAPI]]:
    """Builds apps (on the system clock unless ``clock`` is given) and closes their databases
    at the end (ASGITransport runs no lifespan)."""
    apps: list[FastAPI] = []

    def make(*, clock: Clock | None = None, **overrides: Any) -> FastAPI:
        app = create_app(make_settings(**overrides), clock=clock)
        apps.append(app)
        return app

    yield make
    for app in apps:
        service_context(app).close()


@pytest.fixture
async def client(make_app: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(make_app()) as http:
        yield http
