"""The run report's regime sentence (models/regime.py) on a small synthetic map written by
``write_map`` from points like bench/frontier_scale.py's summary rows; and the shipped map."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from models.regime import (
    MAP_PATH,
    PartyScale,
    describe_regime,
    load_map,
    nearest_regime,
    write_map,
)

ARRANGEMENT = "this run's private arrangement"
LATER = "a later design"


def row(
    nodes: int, degree: float, signal: str, design: str, epsilon: float | None, gain: float
) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "labelled": 0.01,
        "signal": signal,
        "degree": degree,
        "design": design,
        "epsilon": epsilon,
        "seeds": 3,
        "test": [50.0, 1.0],
        "gain": [gain, 0.5],
    }


@pytest.fixture
def regime_map(tmp_path: Path) -> dict[str, Any]:
    """Two sizes at degree 4 and 64, ε=4: nothing pays at 20k nodes; at 1M nodes and degree 64
    "a later design" (a design the writer has never seen) gains 3 to 5 points."""
    summary = []
    for nodes in (20_000, 1_000_000):
        for degree in (4.0, 64.0):
            pays = nodes == 1_000_000 and degree == 64.0
            for signal, shift in (("weak", 0.0), ("strong", 2.0)):
                summary += [
                    row(nodes, degree, signal, ARRANGEMENT, 4.0, -10.0 - shift),
                    row(nodes, degree, signal, LATER, 4.0, 3.0 + shift if pays else -1.0),
                    row(nodes, degree, signal, "party alone (SGC)", None, 0.0),
                    row(nodes, degree, signal, "a design without noise", None, 9.0),
                ]
    return write_map(
        summary, path=tmp_path / "map.json", source="synthetic", party_edge_fraction=0.8
    )


def test_the_map_keeps_every_private_design_and_only_those(
    regime_map: dict[str, Any], tmp_path: Path
) -> None:
    assert json.loads((tmp_path / "map.json").read_text()) == regime_map
    assert len(regime_map["cells"]) == 4
    for cell in regime_map["cells"]:
        assert set(cell["designs"]) == {ARRANGEMENT, LATER}
        assert cell["party_degree"] == pytest.approx(0.8 * cell["degree"])
        assert set(cell["designs"][ARRANGEMENT]["gain"]) == {"weak", "strong"}
        assert cell["designs"][ARRANGEMENT]["seeds"] == 3


def test_the_nearest_regime_compares_the_partys_own_degree_and_epsilon(
    regime_map: dict[str, Any],
) -> None:
    party = PartyScale(nodes=700_000, labelled=0.012, degree=40.0)
    regime = nearest_regime(regime_map, party=party, epsilon=3.0)
    assert (regime.nodes, regime.degree, regime.party_degree) == (1_000_000, 64.0, 51.2)
    assert regime.outside == ()
    (later,) = [g for g in regime.gains if g.design == LATER]
    assert (later.mean, later.low, later.high) == (4.0, 3.0, 5.0)
    assert later.best_signal == "strong" and later.seeds == 3
    small = nearest_regime(regime_map, party=PartyScale(nodes=30_000, labelled=0.01, degree=4.0),
                           epsilon=4.0)  # fmt: skip
    assert (small.nodes, small.degree) == (20_000, 4.0)


def test_a_regime_where_nothing_pays_says_so_with_the_numbers(
    regime_map: dict[str, Any],
) -> None:
    party = PartyScale(nodes=25_000, labelled=0.01, degree=3.0)
    text = describe_regime(regime_map, party=party, epsilon=4.0, whose="bank, the label holder")
    assert "bank, the label holder: 25,000 nodes, 1% labelled, own mean degree 3.0" in text
    assert "lies in the regime 20,000 nodes, 1% labelled, degree 4 (a party's own 3.2), ε=4" in text
    assert "this run's private arrangement -11.0 points, -12.0 to -10.0 over strong and weak " \
        "signal, 3 seeds, ± 0.5" in text  # fmt: skip
    assert "a later design -1.0 points" in text
    assert text.endswith("No private design beat the party alone there.")
    assert "docs/privacy.md, section 1.5" in text and "outside" not in text


def test_a_regime_with_a_gain_renders_what_paid(regime_map: dict[str, Any]) -> None:
    party = PartyScale(nodes=1_000_000, labelled=0.01, degree=51.0)
    text = describe_regime(regime_map, party=party, epsilon=4.0)
    assert "a later design +4.0 points, +3.0 to +5.0 over strong and weak signal" in text
    assert "Private federation paid there: a later design gained at least +3.0 points" in text
    assert "No private design" not in text


def test_data_far_from_the_map_is_named_with_its_nearest_regime(
    regime_map: dict[str, Any],
) -> None:
    party = PartyScale(nodes=2_708, labelled=0.05, degree=3.9)
    text = describe_regime(regime_map, party=party, epsilon=16.0)
    assert "lies outside the map (2,708 nodes is far below the smallest measured, 20,000 nodes" in (
        text
    )
    assert "5% labelled is far above the largest measured, 1% labelled" in text
    assert "ε=16.00 is far above the largest measured, ε=4.00" in text
    assert (
        "nearest measured regime: 20,000 nodes, 1% labelled, degree 4 (a party's own 3.2)" in text
    )


def test_the_shipped_map_is_the_scale_benchs_and_reads() -> None:
    summary = json.loads(
        (Path(__file__).resolve().parents[2] / "bench/results/frontier_scale.json").read_text()
    )["summary"]
    shipped = load_map()
    assert MAP_PATH.name == "regime_map.json"
    # the map is drawn from the 5-class points (the two-class slice has a table of its own)
    private = {(r["nodes"], r["labelled"], r["degree"], r["epsilon"]) for r in summary
               if r["epsilon"] is not None and r.get("classes", 5) == 5}  # fmt: skip
    # and issue 40's private sign cells (bench/model_at_scale.py: 5 classes, 1% labelled)
    runs = json.loads(
        (Path(__file__).resolve().parents[2] / "bench/results/model_at_scale.json").read_text()
    )["runs"]
    degree = {"shared": 16.0, "differing": 35.0}
    sign = {(r["nodes"], 0.01, degree[r["family"]], float(eps.group(1))) for r in runs
            if (eps := re.search(r"private sign \(eps=([0-9.]+)\)", r["method"]))
            and r.get("classes", 5) == 5}  # fmt: skip
    cells = {(c["nodes"], c["labelled"], c["degree"], c["epsilon"]) for c in shipped["cells"]}
    assert cells == private | sign
    # each design by what it is, never by the bench's label ("design 2")
    names = {name for cell in shipped["cells"] for name in cell["designs"]}
    assert names == {
        "the per-pass private arrangement (gcnii)",
        "a privately trained predictor released once",
        "the private arrangement with per-node accounting",
        "the private sign design (one release)",
        "the private sign design (one release) with partners of own degree 16",
    }
    text = describe_regime(shipped, party=PartyScale(nodes=20_000, labelled=0.01, degree=12.8),
                           epsilon=4.0)  # fmt: skip
    assert "lies in the regime 20,000 nodes, 1% labelled, degree 16" in text
    assert "a privately trained predictor released once -0.4 points" in text
    assert re.search(r"design \d", text) is None


def test_a_partys_own_degree_from_its_prepared_folders_meta() -> None:
    party = PartyScale(nodes=1_000, labelled=0.1, degree=0.0)
    meta = {"num_rows": 1_200, "undirected_edges": 3_000}
    assert party.with_degree_of(meta) == PartyScale(nodes=1_000, labelled=0.1, degree=5.0)


def test_a_cell_of_differing_graphs_is_found_by_the_party_s_own_degree_and_says_how_to_run(
    tmp_path: Path,
) -> None:
    """A point may give its party's own degree (the parties' graphs differ): the cell keeps it,
    the nearest cell is found by it, and a design the product runs is named with its command."""
    sign = "the private sign design (one release) with partners of own degree 16"
    points = [
        row(20_000, 16.0, "weak", ARRANGEMENT, 4.0, -2.0),
        {**row(20_000, 35.0, "weak", sign, 4.0, 20.0), "party_degree": 4.0},
    ]
    written = write_map(points, path=tmp_path / "map.json", source="t", party_edge_fraction=0.8)
    assert [c["party_degree"] for c in written["cells"]] == [12.8, 4.0]
    party = PartyScale(nodes=20_000, labelled=0.01, degree=4.5)
    assert nearest_regime(written, party=party, epsilon=4.0).degree == 35.0
    text = describe_regime(written, party=party, epsilon=4.0)
    assert "paid there" in text and "`glasu train` runs it by default" in text
    dense = describe_regime(written, party=PartyScale(20_000, 0.01, 13.0), epsilon=4.0)
    assert "runs it by default" not in dense
    with pytest.raises(ValueError, match="two party degrees"):
        write_map(
            [*points, {**row(20_000, 35.0, "strong", sign, 4.0, 1.0), "party_degree": 5.0}],
            path=tmp_path / "other.json", source="t", party_edge_fraction=0.8,
        )  # fmt: skip
