"""The scale map as the product reads it: ``models/regime_map.json``, which ``models/regime.py``
turns into the run report's regime sentence.

``python -m bench.regime_map`` rewrites it from ``bench/results/frontier_scale.json``;
``bench/frontier_scale.py`` calls :func:`write` at the end of its runs. The bench's design labels
("design 1", ...) stay in the bench: the map names each design by what it is (:data:`DESIGNS`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from models.regime import write_map

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "results" / "frontier_scale.json"
OUT = ROOT / "models" / "regime_map.json"
#: the share of the graph's edges each party of the scale map keeps (bench/frontier_scale.py)
PARTY_EDGE_FRACTION = 0.8
#: bench/frontier_scale.py's private designs, by the names the run report says
DESIGNS = {
    "design 1": "this run's private arrangement",
    "design 2": "a privately trained predictor released once",
    "design 3": "the private arrangement with per-node accounting",
}


def write(
    summary: Iterable[Mapping[str, Any]],
    *,
    path: Path = OUT,
    party_edge_fraction: float = PARTY_EDGE_FRACTION,
    source: str = "bench/results/frontier_scale.json",
) -> dict[str, Any]:
    """Write the regime map the run report reads (:func:`models.regime.write_map`) from the
    ``summary`` rows of ``bench/results/frontier_scale.json`` (``bench.frontier_scale.summarize``),
    each private design's rows under its name in :data:`DESIGNS`; and return it."""
    return write_map(
        [_named(row) for row in summary],
        path=path,
        source=source,
        party_edge_fraction=party_edge_fraction,
    )


def _named(row: Mapping[str, Any]) -> Mapping[str, Any]:
    if row.get("epsilon") is None:  # not private: the map leaves it out
        return row
    if row["design"] not in DESIGNS:
        raise ValueError(f"name the private design {row['design']!r} in DESIGNS: the run report "
                         "says a design's name")  # fmt: skip
    return {**row, "design": DESIGNS[row["design"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, default=SOURCE, help="the scale map's results")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    summary = json.loads(args.source.read_text()).get("summary") or []
    written = write(summary, path=args.out)
    print(f"wrote {args.out}: {len(written['cells'])} cells")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
