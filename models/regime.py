"""Where a party's data lies on the scale map (issue 29), and what private federation gained
there: the run report's regime sentence.

The map (``models/regime_map.json``) has one cell per measured (nodes, labelled fraction,
degree, epsilon), each with the gain of every private design over the better party alone, per
feature signal; :func:`write_map` builds it from the measured points (``bench/regime_map.py``
writes the shipped one from ``bench/results/frontier_scale.json``). A design is named in the map
by what it is, and the sentence says that name. A party knows its own nodes, labels and graph,
and the run's epsilon, but not how strong the signal in its features is: the sentence gives the
range over the signals measured. Pure functions on plain numbers; no torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.data.partition import ClientPartition

MAP_PATH = Path(__file__).with_name("regime_map.json")
GUIDE = "docs/privacy.md, section 1.5"
#: the gain the issue asks of a design before the product adopts it (points)
PAYS = 2.0
#: a measured value more than this factor away from the party's on an axis: outside the map
OUTSIDE_FACTOR = 2.0


@dataclass(frozen=True)
class PartyScale:
    """What a party can measure of its own data: its nodes, the fraction of them that are
    training labels, and the mean degree of its own graph."""

    nodes: int
    labelled: float
    degree: float

    @classmethod
    def of_partition(cls, partition: ClientPartition) -> PartyScale:
        nodes = int(partition.held.sum()) if partition.held is not None else partition.num_nodes
        nodes = max(nodes, 1)
        return cls(
            nodes=nodes,
            labelled=len(partition.train_nodes) / nodes,
            degree=int(partition.edge_index.shape[1]) / nodes,  # both directions of each edge
        )

    def with_degree_of(self, meta: Mapping[str, Any]) -> PartyScale:
        """The mean degree of the party's own graph as ``glasu prepare`` recorded it
        (``meta.json``), where the process holds none of its edges."""
        degree = 2 * int(meta["undirected_edges"]) / max(int(meta["num_rows"]), 1)
        return dataclasses.replace(self, degree=degree)


@dataclass(frozen=True)
class DesignGain:
    design: str
    mean: float  # over the signals, of each signal's mean over seeds (points)
    low: float  # the lowest and highest signal's mean
    high: float
    seed_std: float  # the largest spread over seeds of one signal
    seeds: int
    signals: tuple[str, ...]
    best_signal: str  # the signal of the highest mean


@dataclass(frozen=True)
class Regime:
    """The map's cell nearest the party's data, and what each private design gained there."""

    nodes: int
    labelled: float
    degree: float
    party_degree: float
    epsilon: float
    gains: tuple[DesignGain, ...]
    outside: tuple[str, ...]  # why the party's data lies outside the map; empty when inside


def load_map(path: Path = MAP_PATH) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def write_map(
    points: Iterable[Mapping[str, Any]],
    *,
    path: Path,
    source: str,
    party_edge_fraction: float,
) -> dict[str, Any]:
    """Write the regime map (one cell a line) and return it.

    ``points``: measured points, each with ``nodes``, ``labelled``, ``signal``, ``degree`` (of
    the whole graph), ``design`` (its name in the map), ``epsilon``, ``seeds`` and ``gain``
    (``[mean, std]`` over seeds, in points, over the better party alone of the same graph and
    seed, or None). Every point with an epsilon and a gain is a private design's and is kept,
    whatever the design; points without an epsilon (the party-alone references, non-private
    runs, a design without noise) are not private and are left out. Extra fields are ignored.

    The map has one cell per (nodes, labelled, degree, epsilon), each with, per design, the gain
    per signal (``[mean, std]`` over its seeds) and its number of seeds (the fewest over the
    signals). ``party_degree`` is the degree of one party's own graph, which is what a party can
    measure of its own data: a point's own ``party_degree`` where it gives one (the parties'
    graphs differ), else the graph's degree times ``party_edge_fraction`` (each party keeps
    that share of one graph's edges).
    """
    cells: dict[tuple[int, float, float, float], dict[str, dict[str, Any]]] = {}
    party_degrees: dict[tuple[int, float, float, float], float] = {}
    for point in points:
        if point.get("epsilon") is None or not point.get("gain"):
            continue
        key = (
            int(point["nodes"]),
            float(point["labelled"]),
            float(point["degree"]),
            float(point["epsilon"]),
        )
        party_degree = round(float(point.get("party_degree") or key[2] * party_edge_fraction), 2)
        if party_degrees.setdefault(key, party_degree) != party_degree:
            raise ValueError(f"the points of cell {key} give two party degrees")
        design = cells.setdefault(key, {}).setdefault(
            str(point["design"]), {"gain": {}, "seeds": None}
        )
        design["gain"][str(point["signal"])] = [round(float(v), 2) for v in point["gain"]]
        seeds = int(point["seeds"])
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
                "party_degree": party_degrees[(nodes, labelled, degree, epsilon)],
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


def nearest_regime(regime_map: Mapping[str, Any], *, party: PartyScale, epsilon: float) -> Regime:
    """The cell nearest the party's data and epsilon (the sum over the four axes of the
    absolute log-ratios; a party's own degree against the cell's ``party_degree``)."""
    cells: Sequence[Mapping[str, Any]] = regime_map.get("cells") or []
    if not cells:
        raise ValueError("the regime map has no cell")
    wanted = {
        "nodes": party.nodes,
        "labelled": party.labelled,
        "party_degree": party.degree,
        "epsilon": epsilon,
    }
    cell = min(cells, key=lambda c: sum(_log_ratio(v, c[k]) for k, v in wanted.items()))
    outside = tuple(
        reason
        for axis, value in wanted.items()
        if (reason := _outside(axis, value, [float(c[axis]) for c in cells]))
    )
    return Regime(
        nodes=int(cell["nodes"]),
        labelled=float(cell["labelled"]),
        degree=float(cell["degree"]),
        party_degree=float(cell["party_degree"]),
        epsilon=float(cell["epsilon"]),
        gains=tuple(_design_gain(name, d) for name, d in sorted(cell["designs"].items())),
        outside=outside,
    )


def run_regime(
    *,
    party: PartyScale,
    epsilon: float,
    whose: str,
    regime_map: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a private run's report carries: the party's data, the nearest regime and the
    sentence (``regime_map``: the shipped map by default)."""
    regime_map = load_map() if regime_map is None else regime_map
    nearest = nearest_regime(regime_map, party=party, epsilon=epsilon)
    cell = {k: getattr(nearest, k) for k in ("nodes", "labelled", "degree", "party_degree")}
    return {
        "party": whose,
        **dataclasses.asdict(party),
        "epsilon": epsilon,
        "nearest": {**cell, "epsilon": nearest.epsilon, "outside": list(nearest.outside)},
        "sentence": describe_regime(regime_map, party=party, epsilon=epsilon, whose=whose),
    }


def describe_regime(
    regime_map: Mapping[str, Any], *, party: PartyScale, epsilon: float, whose: str = "this party"
) -> str:
    """One or two plain sentences: the nearest measured regime and what private federation
    gained there, per design, with a pointer to the guidance."""
    regime = nearest_regime(regime_map, party=party, epsilon=epsilon)
    own = (
        f"{whose}: {party.nodes:,} nodes, {_percent(party.labelled)} labelled, own mean degree "
        f"{party.degree:.1f}, ε={epsilon:.2f}"
    )
    cell = (
        f"{regime.nodes:,} nodes, {_percent(regime.labelled)} labelled, degree "
        f"{regime.degree:g} (a party's own {regime.party_degree:g}), ε={regime.epsilon:g}"
    )
    if regime.outside:
        where = (
            f"your data ({own}) lies outside the map ({'; '.join(regime.outside)}); nearest "
            f"measured regime: {cell}"
        )
    else:
        where = f"your data ({own}) lies in the regime {cell}"
    gains = "; ".join(_describe_gain(g) for g in regime.gains)
    return (
        f"Scale map ({GUIDE}): {where}. There private federation gained over the better party "
        f"alone: {gains}. {_verdict(regime.gains)}."
    )


def _verdict(gains: Sequence[DesignGain]) -> str:
    """Paid: a design gained at least PAYS points beyond its seed spread, at every signal (or at
    some, which the party cannot know of its data)."""
    always = [g for g in gains if g.low >= PAYS and g.low > g.seed_std]
    if always:
        best = max(always, key=lambda g: g.low)
        return (
            f"Private federation paid there: {best.design} gained at least {best.low:+.1f} "
            f"points over the party alone {_over_signals(best)}{_how_to_run(best.design)}"
        )
    sometimes = [g for g in gains if g.high >= PAYS and g.high > g.seed_std]
    if sometimes:
        best = max(sometimes, key=lambda g: g.high)
        return (
            f"Private federation paid there only with a {best.best_signal} signal ("
            f"{best.design} {best.high:+.1f} points), which your features may not have"
            f"{_how_to_run(best.design)}"
        )
    if any(g.high > 0 for g in gains):
        return f"No private design gained {PAYS:g} points over the party alone there"
    return "No private design beat the party alone there"


def _over_signals(gain: DesignGain) -> str:
    if len(gain.signals) == 1:
        return f"with a {gain.signals[0]} signal (the only one measured)"
    return "whatever the signal"


#: how a user runs a design the map names, by the start of its name
HOW_TO_RUN = {
    "the private sign design": "`glasu train` runs it by default under differential privacy; "
    "`--backbone sign` names it"
}


def _how_to_run(design: str) -> str:
    how = next((run for name, run in HOW_TO_RUN.items() if design.startswith(name)), None)
    return "" if how is None else f" ({how})"


def _design_gain(name: str, design: Mapping[str, Any]) -> DesignGain:
    per_signal: Mapping[str, Sequence[float]] = design["gain"]
    means = [float(v[0]) for v in per_signal.values()]
    return DesignGain(
        design=name,
        mean=sum(means) / len(means),
        low=min(means),
        high=max(means),
        seed_std=max(float(v[1]) for v in per_signal.values()),
        seeds=int(design.get("seeds") or 1),
        signals=tuple(sorted(per_signal)),
        best_signal=max(per_signal, key=lambda s: float(per_signal[s][0])),
    )


def _describe_gain(gain: DesignGain) -> str:
    if len(gain.signals) == 1:
        spread = f"{gain.signals[0]} signal only"
    elif gain.low == gain.high:
        spread = f"the same over {' and '.join(gain.signals)} signal"
    else:
        spread = f"{gain.low:+.1f} to {gain.high:+.1f} over {' and '.join(gain.signals)} signal"
    seeds = "1 seed" if gain.seeds == 1 else f"{gain.seeds} seeds, ± {gain.seed_std:.1f}"
    return f"{gain.design} {gain.mean:+.1f} points, {spread}, {seeds}"


def _log_ratio(a: float, b: float) -> float:
    return abs(math.log(max(float(a), 1e-9) / max(float(b), 1e-9)))


def _outside(axis: str, value: float, measured: list[float]) -> str | None:
    nearest = min(measured, key=lambda m: _log_ratio(value, m))
    if _log_ratio(value, nearest) <= math.log(OUTSIDE_FACTOR):
        return None
    low, high = min(measured), max(measured)
    shown = {
        "nodes": lambda v: f"{v:,.0f} nodes",
        "labelled": lambda v: f"{_percent(v)} labelled",
        "party_degree": lambda v: f"own degree {v:.1f}",
        "epsilon": lambda v: f"ε={v:.2f}",
    }[axis]
    if value < low:
        return f"{shown(value)} is far below the smallest measured, {shown(low)}"
    if value > high:
        return f"{shown(value)} is far above the largest measured, {shown(high)}"
    return f"{shown(value)} is far from any measured (nearest {shown(nearest)})"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g}%"
