"""The scale map as the product reads it: ``models/regime_map.json``, which ``models/regime.py``
turns into the run report's regime sentence.

``python -m bench.regime_map`` rewrites it from ``bench/results/frontier_scale.json``;
``bench/frontier_scale.py`` calls :func:`write` at the end of its runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "results" / "frontier_scale.json"
OUT = ROOT / "models" / "regime_map.json"
#: the share of the graph's edges each party of the scale map keeps (bench/frontier_scale.py)
PARTY_EDGE_FRACTION = 0.8


def write(
    summary: Iterable[Mapping[str, Any]],
    *,
    path: Path = OUT,
    party_edge_fraction: float = PARTY_EDGE_FRACTION,
    source: str = "bench/results/frontier_scale.json",
) -> dict[str, Any]:
    """Write the regime map the run report reads, and return it.

    ``summary``: the ``summary`` rows of ``bench/results/frontier_scale.json``
    (``bench.frontier_scale.summarize``): each with ``nodes``, ``labelled``, ``signal``,
    ``degree`` (of the whole graph), ``design``, ``epsilon``, ``seeds`` and ``gain`` (``[mean,
    std]`` over seeds, in points, over the better party alone of the same graph and seed, or
    None). Every row with an epsilon and a gain is a private design's point and is kept, whatever
    the design's name ("design 1", "design 2", a later "design 3"...); rows without an epsilon
    (the party-alone references, non-private GLASU, a design without noise) are not private and
    are left out. Extra fields are ignored.

    The map has one cell per (nodes, labelled, degree, epsilon), each with, per design, the gain
    per signal (``[mean, std]`` over its seeds) and its number of seeds (the fewest over the
    signals). ``party_degree`` is the degree of one party's own graph (it keeps
    ``party_edge_fraction`` of the edges), which is what a party can measure of its own data.
    """
    cells: dict[tuple[int, float, float, float], dict[str, dict[str, Any]]] = {}
    for row in summary:
        if row.get("epsilon") is None or not row.get("gain"):
            continue
        key = (
            int(row["nodes"]),
            float(row["labelled"]),
            float(row["degree"]),
            float(row["epsilon"]),
        )
        design = cells.setdefault(key, {}).setdefault(
            str(row["design"]), {"gain": {}, "seeds": None}
        )
        design["gain"][str(row["signal"])] = [round(float(v), 2) for v in row["gain"]]
        seeds = int(row["seeds"])
        design["seeds"] = seeds if design["seeds"] is None else min(design["seeds"], seeds)
    payload = {
        "source": source,
        "gain": "test accuracy minus the better party alone (GNN or SGC) of the same graph and "
        "seed, in points: [mean, std over seeds] per signal",
        "party_edge_fraction": party_edge_fraction,
        "cells": [
            {
                "nodes": nodes,
                "labelled": labelled,
                "degree": degree,
                "party_degree": round(degree * party_edge_fraction, 2),
                "epsilon": epsilon,
                "designs": {name: designs[name] for name in sorted(designs)},
            }
            for (nodes, labelled, degree, epsilon), designs in sorted(cells.items())
        ],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_one_cell_a_line(payload))
    return payload


def _one_cell_a_line(payload: Mapping[str, Any]) -> str:
    head = {k: v for k, v in payload.items() if k != "cells"}
    lines = [json.dumps(head, indent=1)[:-2] + ',\n "cells": [']
    cells = [f"  {json.dumps(cell, ensure_ascii=False)}" for cell in payload["cells"]]
    return "\n".join([*lines, ",\n".join(cells), " ]", "}"]) + "\n"


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
