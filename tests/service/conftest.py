"""Fixtures for the service tests: apps on a temporary database and an in-process client.

Every test that uses ``database`` (directly, or through ``make_settings``, ``make_app`` or
``client``) runs twice: on an SQLite file and on an empty PostgreSQL database of the session's
throwaway cluster (``postgres_cluster``, tests/conftest.py; skipped where PostgreSQL is not
installed). A test about SQLite's files (WAL, file modes, payload files) is marked
``sqlite_only`` and runs once."""

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: about SQLite's files; not run on PostgreSQL")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("backend") == "postgresql"
        (dropped if on_postgres and item.get_closest_marker("sqlite_only") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path | str]:
    """An SQLite file's path, or the URL of an empty PostgreSQL database (lent for the test)."""
    if backend == "sqlite":
        yield tmp_path / "service.sqlite3"
        return
    with request.getfixturevalue("postgres_cluster").scratch_database() as url:
        yield url


@pytest.fixture
def make_settings(database: Path | str) -> Callable[..., ServiceSettings]:
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
