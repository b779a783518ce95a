"""What the benchmarks share: one named section of docs/results.md each (the others' sections
are left alone), the dataset root, and one CPU thread per run."""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
HEADER = (
    "# Results\n\nEvery table below is written by a script in `bench/` from runs on this "
    "project's code; each section names its script, the machine and the settings.\n"
)


def write_section(name: str, markdown: str, *, path: Path = RESULTS) -> None:
    text = path.read_text() if path.exists() else HEADER
    begin, end = f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text}\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def mean_std(values: list[float]) -> str:
    import numpy as np

    if not values:
        return "-"
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values):.1f}"


def add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    """The Planetoid root: $GLASU_DATA, else the shared datasets beside the project."""
    default = os.environ.get(
        "GLASU_DATA", str(RESULTS.parents[2] / "shared" / "datasets" / "planetoid")
    )
    parser.add_argument("--data-dir", default=default, help=f"dataset root (default {default})")


SHARED_PLANETOID = RESULTS.parents[2] / "shared" / "datasets" / "planetoid"
PLANETOID_FOLDERS = {"cora": "Cora", "citeseer": "CiteSeer", "pubmed": "PubMed"}


def load_copied(name: str, *, scratch: Path, source: Path = SHARED_PLANETOID, **split):
    """Benchmark dataset ``name`` loaded from a copy in ``scratch``: the shared copy is
    read-only, and PyG writes its processed files beside the raw ones."""
    from models.data import load_dataset

    folder = PLANETOID_FOLDERS[name]
    if not (scratch / folder).exists():
        shutil.copytree(source / folder, scratch / folder)
    return load_dataset(name, data_dir=scratch, **split)


def single_thread() -> None:
    """Runs are small: one thread each is fastest, and parallel runs do not fight for cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
