"""The deployed alignment kept and updated, over real HTTP (a `glasu serve` process on loopback,
three organisations running `glasu align run`): `glasu align create --keep`, then an update
(`--base`) over tables with new, removed and newly shared ids, which aligns the same nodes as a
fresh alignment of the same tables; a fresh kept alignment does not replace a kept file without
`--realign`."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.cli.main import main
from models.data.party import read_alignment, read_party
from tests.clients.cli.test_align_cmd import run_alignment, server  # noqa: F401 (a fixture)
from tests.clients.test_alignment_keeping import TABLES, prepared, updated


def aligned_ids(folders: list[Path]) -> set[tuple[str, ...]]:
    """The aligned nodes, as every party's id of each."""
    by_node: dict[int, list[str]] = {}
    for m, folder in enumerate(folders):
        data = read_party(folder)
        alignment = read_alignment(folder, rows=data.num_rows)
        assert alignment is not None
        for row, node in enumerate(alignment.rows):
            if node >= 0:
                by_node.setdefault(int(node), [""] * len(folders))[m] = data.ids[row]
    return {tuple(ids) for ids in by_node.values()}


def test_a_deployed_update_aligns_as_a_fresh_alignment_of_the_same_tables(
    server: dict[str, str],  # noqa: F811 (the fixture)
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    kept = [tmp_path / f"kept-{m}" for m in range(3)]

    def keeping(m: int) -> list[str]:
        return ["--kept", str(kept[m])]

    first = run_alignment(
        server, tmp_path / "day1", prepared(tmp_path / "day1", TABLES),
        create_args=["--keep"], party_args=keeping,
    )  # fmt: skip
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in kept)
    tables = updated(TABLES)
    tables[0].append("c65")  # parties 1 and 2 held it already
    current = prepared(tmp_path / "day2", tables)
    run_alignment(
        server, tmp_path / "update", current, create_args=["--base", first], party_args=keeping
    )
    assert "update 1 of its keys" in capsys.readouterr().out
    again = prepared(tmp_path / "day2-fresh", tables)
    run_alignment(server, tmp_path / "fresh", again)
    assert aligned_ids(current) == aligned_ids(again)
    assert {("new-a",) * 3, ("c65",) * 3} <= aligned_ids(current)
    # a fresh kept alignment (new keys) replaces the kept files only with --realign
    run_alignment(
        server, tmp_path / "rotated", current, create_args=["--keep"], party_args=keeping,
        codes_expected=dict.fromkeys(range(3), 1),
    )  # fmt: skip
    assert "give --realign to replace it" in capsys.readouterr().err
    assert main(["align", "status", "--server", server["url"], "--alignment", first,
                 "--token-file", server["token_file"]]) == 0  # fmt: skip
    assert f"alignment {first} (no label; kept): done" in capsys.readouterr().out
