"""bench/ is a package run as ``python -m bench.NAME``: every benchmark imports as a module of
it (no sys.path tricks), and each has a ``main``."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import bench

MODULES = sorted(
    info.name for info in pkgutil.iter_modules(bench.__path__) if info.name not in {"results_doc"}
)

# the in-process federation and the throwaway PostgreSQL cluster
HARNESSES = {
    "asgi_federation": "run_in_process",
    "postgres": "PostgresCluster",
    "predictor_release": "PredictorRelease",  # design 2 of the scale map (bench/frontier_scale.py)
}


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_imports_as_a_module_of_the_package(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    if name in HARNESSES:  # what benchmarks and tests start, not a benchmark
        assert callable(getattr(module, HARNESSES[name]))
        return
    entry = (
        importlib.import_module(f"bench.{name}.__main__") if hasattr(module, "__path__") else module
    )
    assert callable(entry.main)


def test_no_benchmark_changes_sys_path() -> None:
    root = Path(bench.__file__).parent
    offenders = [p.name for p in root.rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []
