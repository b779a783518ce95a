"""bench/ is a package run as ``python -m bench.NAME``: every benchmark imports as a module of
it (no sys.path tricks), and each has a ``main``. The benchmarks are imported in a child
process (what ``python -m bench.NAME`` does), never in the test process: no test imports
bench."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: helpers of the benchmarks, not benchmarks: the docs sections and results files, the
#: predictors the scale map trains (bench/frontier_scale.py), model_at_scale's private methods
HELPERS = {"results_doc", "predictor_release", "alignment_update", "model_at_scale_private"}

# Imports every module of bench/ (a package's __main__ for a subpackage) and prints, as JSON,
# each one's name and whether it has a callable main.
LIST_ENTRY_POINTS = """
import importlib, json, pkgutil, sys
package = importlib.import_module("bench")
found = {}
for info in pkgutil.iter_modules(package.__path__):
    if info.name in set(sys.argv[1:]):
        continue
    module = importlib.import_module(f"bench.{info.name}")
    if info.ispkg:
        module = importlib.import_module(f"bench.{info.name}.__main__")
    found[info.name] = callable(getattr(module, "main", None))
print(json.dumps(found))
"""


def test_every_benchmark_imports_as_a_module_of_the_package_and_has_a_main() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LIST_ENTRY_POINTS, *sorted(HELPERS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    on_disk = {p.stem for p in BENCH.glob("*.py")} | {
        p.parent.name for p in BENCH.glob("*/__main__.py")
    }
    assert set(found) == on_disk - HELPERS - {"__init__"}
    assert [name for name, has_main in found.items() if not has_main] == []


def test_no_benchmark_changes_sys_path() -> None:
    offenders = [p.name for p in BENCH.rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


def test_no_test_imports_bench() -> None:
    """bench/ only measures: what a test needs lives in the packages or in tests/support."""
    tests = ROOT / "tests"
    offenders = [
        str(p.relative_to(ROOT))
        for p in tests.rglob("*.py")
        if any(
            line.lstrip().startswith(("import bench", "from bench"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []
