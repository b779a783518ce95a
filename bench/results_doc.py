"""What the benchmarks share: one named section of docs/results.md each (the others' sections
are left alone), the results files, the dataset root, and one CPU thread per run."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.config import TrainConfig

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


def roc_auc_field(value: float | None) -> dict[str, float]:
    """A run row's ``roc_auc`` (a two-class task only: 5-class rows stay as they were)."""
    return {} if value is None else {"roc_auc": value}


def mean_roc_auc(metrics: Sequence[Mapping[str, Any] | None] | None) -> dict[str, float]:
    """The mean over clients of the test ROC-AUC in a run report's per-client metrics."""
    values = [m["roc_auc"] for m in metrics or [] if m and "roc_auc" in m]
    return roc_auc_field(sum(values) / len(values) if values else None)


def rounded_mean_std(values: Sequence[float], digits: int = 4) -> tuple[float, float]:
    import numpy as np

    return round(float(np.mean(values)), digits), round(float(np.std(values)), digits)


def grouped(
    records: Sequence[Mapping[str, Any]], axes: Mapping[str, Iterable[Any]]
) -> Iterator[tuple[dict[str, Any], list[Mapping[str, Any]]]]:
    """Every combination of the axes' values (in their order, the first axis outermost) that
    some records have, with those records."""
    for values in itertools.product(*axes.values()):
        where = dict(zip(axes, values, strict=True))
        group = [r for r in records if all(r[k] == v for k, v in where.items())]
        if group:
            yield where, group


def federation_settings(config: TrainConfig) -> dict[str, Any]:
    """What a results file records of a run's federation: M, rounds, width, K and Q."""
    return {
        "clients": config.clients,
        "rounds": config.rounds,
        "hidden": config.hidden,
        "agg_layers": config.agg_layers,
        "stale": config.stale,
    }


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
    from models.data.planetoid import load_dataset

    folder = PLANETOID_FOLDERS[name]
    if not (scratch / folder).exists():
        shutil.copytree(source / folder, scratch / folder)
    return load_dataset(name, data_dir=scratch, **split)


def single_thread() -> None:
    """Runs are small: one thread each is fastest, and parallel runs do not fight for cores."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


def publish(section: str, lines: list[str]) -> None:
    """Write ``lines`` as docs/results.md's section ``section`` and print them."""
    write_section(section, "\n".join(lines))
    print("\n".join(lines))


def add_results_arguments(parser: argparse.ArgumentParser, default: Path) -> None:
    """``--out``: the results file; ``--docs-only``: rewrite the docs section from it, no run."""
    parser.add_argument("--out", type=Path, default=default)
    parser.add_argument(
        "--docs-only", action="store_true", help="rewrite the docs section from --out, no run"
    )


def add_labelled_results_arguments(parser: argparse.ArgumentParser, default: Path) -> None:
    """``--seed``, ``--label`` (a run's name: the results file keeps a run per label, e.g. the
    code before and after a change) and :func:`add_results_arguments`."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="current", help="the run's name in the results")
    add_results_arguments(parser, default)


def keep_labelled(path: Path, key: str, result: dict[str, Any]) -> dict[str, Any]:
    """The results file ``path`` with ``result`` kept under ``key`` (written), beside the
    others."""
    payload = json.loads(path.read_text()) if path.exists() else {}
    payload[key] = result
    write_json(path, payload)
    return payload


def rewrote_docs_only(
    args: argparse.Namespace, section: str, markdown: Callable[[dict[str, Any]], str]
) -> bool:
    """With ``--docs-only``: the docs section ``section`` rewritten from ``--out`` (True)."""
    if args.docs_only:
        write_section(section, markdown(json.loads(args.out.read_text())))
    return bool(args.docs_only)


def write_results(
    path: Path, *, config: dict[str, Any], summary: list[dict], runs: list[dict]
) -> dict[str, Any]:
    """Write a results file of the runs so far (after every run: nothing lost) and return it."""
    out = {"config": config, "summary": summary, "runs": runs}
    write_json(path, out)
    return out


def write_json(path: Path, payload: Any, *, indent: int | None = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=indent, default=str) + "\n")


def cached(path: Path, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The result kept in ``path`` by an earlier call, else ``run()``'s, kept there."""
    if path.exists():
        return json.loads(path.read_text())
    result = run()
    write_json(path, result, indent=None)
    return result


def train_one_thread(**settings: Any) -> Any:
    """``train_inprocess`` of ``TrainConfig(**settings)`` on one thread, without progress."""
    single_thread()
    from models.config import TrainConfig
    from models.trainer import train_inprocess

    return train_inprocess(TrainConfig(**settings), progress=False)
