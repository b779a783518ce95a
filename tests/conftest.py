"""Shared fixtures: the real Planetoid datasets, copied from ../shared/datasets into a temporary
directory (the shared copy is read-only and tests never download)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.postgres import PostgresCluster, postgres_binaries

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "planetoid"


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.fail(f"the shared datasets are missing: expected {SHARED_DATASETS}")
    root = tmp_path_factory.mktemp("planetoid")
    for name in ("Cora", "CiteSeer"):
        shutil.copytree(SHARED_DATASETS / name, root / name)
    return root


@pytest.fixture(scope="session")
def cora(data_dir: Path):
    from models.data.planetoid import load_dataset

    return load_dataset("cora", data_dir=data_dir, split="paper", seed=0)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL server for the test run (tests take databases of their own with
    ``new_database``); skips where PostgreSQL is not installed."""
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    # Not under pytest's temporary folder: that is private to root, and the server runs as
    # the postgres user.
    root = Path(tempfile.mkdtemp(prefix="glasu-postgres-"))
    with PostgresCluster.start(root) as cluster:
        yield cluster
    shutil.rmtree(root, ignore_errors=True)
