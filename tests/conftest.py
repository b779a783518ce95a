"""Shared fixtures: the real Planetoid datasets, copied from ../shared/datasets into a temporary
directory (the shared copy is read-only and tests never download), and a throwaway PostgreSQL
cluster (tests/support/postgres.py) for the tests that run the service on PostgreSQL."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import PostgresCluster, postgres_binaries

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "planetoid"


@pytest.fixture(autouse=True)
def _own_ledgers_folder(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test's organisations' default privacy ledgers ($XDG_DATA_HOME/glasu/ledgers) in a
    folder of its own, never the user's: a ledger outlives its runs, and a test's releases
    must count against no other test's caps (the processes a test starts inherit it)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))


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
    """One PostgreSQL server for the whole run (each test makes its own database with
    ``new_database``); skips where PostgreSQL is not installed (CI installs it: .ci/run)."""
    if postgres_binaries() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): skipping its tests")
    # not under pytest's temporary folder: as root the server runs as user postgres, who
    # cannot enter root's private folders
    root = Path(tempfile.mkdtemp(prefix="glasu-postgres-"))
    cluster = PostgresCluster.start(root)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
