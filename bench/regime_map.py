"""The scale map as the product reads it: ``models/regime_map.json``, which ``models/regime.py``
turns into the run report's regime sentence.

``python -m bench.regime_map`` rewrites it from ``bench/results/frontier_scale.json`` (issue 29's
designs) and ``bench/results/model_at_scale.json`` (issue 40's private sign design, five-class
graphs); ``bench/frontier_scale.py`` calls :func:`write` at the end of its runs. The bench's
design labels ("design 1", ...) stay in the bench: the map names each design by what it is
(:data:`DESIGNS`, :data:`SIGN_DESIGNS`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.regime import write_map

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "results" / "frontier_scale.json"
SIGN_SOURCE = ROOT / "bench" / "results" / "model_at_scale.json"
OUT = ROOT / "models" / "regime_map.json"
#: the share of the graph's edges each party of the scale map keeps (bench/frontier_scale.py)
PARTY_EDGE_FRACTION = 0.8
#: bench/frontier_scale.py's private designs, by the names the run report says
DESIGNS = {
    "design 1": "the per-pass private arrangement (gcnii)",
    "design 2": "a privately trained predictor released once",
    "design 3": "the private arrangement with per-node accounting",
}

#: bench/model_at_scale.py's private sign design, by graph family: the differing family's gain
#: comes from partners whose own graphs are denser than the label holder's, which a party cannot
#: see of its partners, so the name says it
SIGN_DESIGNS = {
    "shared": "the private sign design (one release)",
    "differing": "the private sign design (one release) with partners of own degree 16",
}
#: the degree of each family's graph and the label holder's own (bench/model_at_scale.py)
FAMILY_DEGREES = {"shared": (16.0, None), "differing": (35.0, 4.0)}


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
        [*(_named(row) for row in summary), *sign_points()],
        path=path,
        source=source,
        party_edge_fraction=party_edge_fraction,
    )


def sign_points(source: Path = SIGN_SOURCE) -> list[dict[str, Any]]:
    """The private sign design's five-class cells of ``source`` as map points: each epsilon's
    gain over the best party alone of the same graph and seed (``[mean, std]`` over seeds)."""
    from bench.model_at_scale import ALONE
    from bench.model_at_scale_private import summary

    if not source.exists():
        return []
    points = []
    for cell in summary(json.loads(source.read_text())["runs"], alone=ALONE):
        epsilon = re.search(r"private sign \(eps=([0-9.]+)\)", cell["method"])
        if epsilon is None or cell["classes"] != 5 or not cell["gain"]:
            continue
        degree, party_degree = FAMILY_DEGREES[cell["family"]]
        points.append({
            "nodes": cell["nodes"], "labelled": 0.01, "signal": "weak", "degree": degree,
            "party_degree": party_degree, "design": SIGN_DESIGNS[cell["family"]],
            "epsilon": float(epsilon.group(1)), "seeds": cell["seeds"],
            "gain": [float(np.mean(cell["gain"])), float(np.std(cell["gain"]))],
        })  # fmt: skip
    return points


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
