"""The kept alignment (clients/alignment_keeping.py, clients/alignment_update.py): an update
aligns the same nodes as a fresh alignment of the updated tables (additions, removals, an id a
partner added that a party already had, an empty delta) and blinds only the ids added since; the
kept file is private, and one that was changed or is another party's or federation's is refused
by its path; keys rotate. Every alignment runs through the service's routes in this process (no
sockets), updates through a service database that keeps the fully blinded sets."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

import clients.alignment_keeping as keeping
from clients.alignment import AlignmentOutcome
from clients.alignment_keeping import KEPT_FILE, KeptAlignmentError, read_kept
from clients.local.alignment import align_in_process, align_keeping

DAY = 86400.0
START = 1_800_000_000.0

TABLES = [
    [f"c{i}" for i in range(0, 60)],
    [f"c{i}" for i in range(20, 80)],
    [f"c{i}" for i in range(10, 70)],
]


def aligned_ids(outcomes: Sequence[AlignmentOutcome], tables: Sequence[Sequence[str]]) -> set:
    """The aligned nodes as each party's id of it (None where a party lacks it)."""
    by_node: dict[int, list] = {}
    for m, (outcome, ids) in enumerate(zip(outcomes, tables, strict=True)):
        for row, node in enumerate(outcome.rows):
            if node >= 0:
                by_node.setdefault(int(node), [None] * len(tables))[m] = ids[row]
    return {tuple(ids) for ids in by_node.values()}


def updated(tables: Sequence[Sequence[str]]) -> list[list[str]]:
    """Every party adds two new customers (one of them shared by all), and removes some ids;
    party 0 takes back an id it removes (c3) and adds one only it and party 2 hold."""
    return [
        [*tables[0][5:], "new-a", "new-0", "c3", "new-02"],
        [*tables[1][:-4], "new-a", "new-1"],
        [*tables[2][2:], "new-a", "new-2", "new-02"],
    ]


def folders(tmp_path: Path, name: str = "fed") -> list[Path]:
    made = [tmp_path / name / f"party-{m}" for m in range(len(TABLES))]
    for folder in made:
        folder.mkdir(parents=True)
    return made


def test_an_update_aligns_the_same_nodes_as_a_fresh_alignment_of_the_updated_tables(
    tmp_path: Path,
) -> None:
    service = tmp_path / "service.sqlite3"
    first = align_in_process(TABLES, seed=3, keep=True, database=service)
    kept = [outcome.kept for outcome in first]
    # party 0 also adds c65, which parties 1 and 2 held already: an old id of theirs aligns now
    tables = updated(TABLES)
    tables[0].append("c65")
    update = align_in_process(tables, seed=3, kept=kept, database=service)  # type: ignore[arg-type]
    fresh = align_in_process(tables, seed=3)
    assert aligned_ids(update, tables) == aligned_ids(fresh, tables)
    assert {("new-a",) * 3, ("c65",) * 3} <= aligned_ids(update, tables)
    assert update[0].aligned_nodes == fresh[0].aligned_nodes
    assert all(o.kept is None for o in fresh)  # not asked to keep: nothing remembered
    assert {o.digest for o in update} == {update[0].digest}
    # a second update, from the first update's kept alignment; then an empty delta
    again = [ids[:-1] for ids in tables]
    second = align_in_process(again, seed=3, kept=[o.kept for o in update], database=service)
    fresh_again = align_in_process(again, seed=3)
    assert aligned_ids(second, again) == aligned_ids(fresh_again, again)
    same = align_in_process(again, seed=3, kept=[o.kept for o in second], database=service)
    assert [o.kept.blinded_last for o in same] == [0, 0, 0]
    assert same[0].digest == second[0].digest
    for before, after in zip(second, same, strict=True):
        assert after.rows.tolist() == before.rows.tolist()


def test_the_union_is_aligned_afresh_every_time(tmp_path: Path) -> None:
    parties = folders(tmp_path)
    align_keeping(parties, TABLES, seed=3, nodes="union", now=START)
    outcomes, note = align_keeping(parties, updated(TABLES), seed=3, nodes="union", now=START)
    assert note.startswith("a fresh alignment with new keys (the union is aligned afresh")
    assert outcomes[0].aligned_nodes == len(set.union(*map(set, updated(TABLES))))


def test_an_update_blinds_only_the_ids_added_since(tmp_path: Path) -> None:
    service = tmp_path / "service.sqlite3"
    first = align_in_process(TABLES, seed=3, keep=True, database=service)
    assert [o.kept.blinded_last for o in first] == [len(TABLES[0]) * 3] * 3
    tables = updated(TABLES)
    update = align_in_process(tables, seed=3, kept=[o.kept for o in first], database=service)
    added = [len(set(new) - set(old)) for new, old in zip(tables, TABLES, strict=True)]
    assert added == [3, 2, 3]  # c3, removed and taken back, is no new id to the kept alignment
    # party m blinds its own new ids and, at hops 1 and 2, those of parties m - 1 and m - 2
    assert [o.kept.blinded_last for o in update] == [sum(added)] * 3
    assert [o.kept.updates for o in update] == [1, 1, 1]


def test_the_kept_file_is_the_partys_alone_and_reads_back(tmp_path: Path) -> None:
    parties = folders(tmp_path)
    outcomes, note = align_keeping(parties, TABLES, seed=3, now=START)
    assert note.startswith("a fresh alignment with new keys (none kept yet")
    path = parties[1] / KEPT_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    kept = read_kept(path, parties=3, party=1)
    assert kept is not None and kept.domain == outcomes[1].alignment_id
    assert kept.scalar == outcomes[1].kept.scalar
    assert "redacted" in repr(kept.scalar) and kept.scalar.reveal().hex() not in repr(kept)
    _, note = align_keeping(parties, updated(TABLES), seed=3, now=START + DAY)
    assert note.startswith("the kept alignment updated (update 1 of its keys); 24 blindings")


def test_a_changed_kept_file_is_refused_by_its_path(tmp_path: Path) -> None:
    parties = folders(tmp_path)
    align_keeping(parties, TABLES, seed=3, now=START)
    path = parties[2] / KEPT_FILE
    data = bytearray(path.read_bytes())
    data[-100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(KeptAlignmentError, match=f"{path} was changed since glasu wrote it"):
        align_keeping(parties, TABLES, seed=3, now=START + DAY)


def test_another_partys_kept_file_is_refused_by_its_path(tmp_path: Path) -> None:
    parties = folders(tmp_path)
    align_keeping(parties, TABLES, seed=3, now=START)
    (parties[0] / KEPT_FILE).write_bytes((parties[1] / KEPT_FILE).read_bytes())
    with pytest.raises(
        KeptAlignmentError, match=f"{parties[0] / KEPT_FILE} is the kept alignment of party 1"
    ):
        align_keeping(parties, TABLES, seed=3, now=START + DAY)


def test_another_federations_kept_file_is_refused_by_its_path(tmp_path: Path) -> None:
    ours, theirs = folders(tmp_path, "ours"), folders(tmp_path, "theirs")
    align_keeping(ours, TABLES, seed=3, now=START)
    align_keeping(theirs, TABLES, seed=3, now=START)
    (ours[2] / KEPT_FILE).write_bytes((theirs[2] / KEPT_FILE).read_bytes())
    with pytest.raises(
        KeptAlignmentError, match=f"{ours[2] / KEPT_FILE} is a kept alignment of another federation"
    ):
        align_keeping(ours, TABLES, seed=3, now=START + DAY)


def test_keys_rotate_after_the_cap_on_updates_on_age_and_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keeping, "MAX_UPDATES", 1)
    parties = folders(tmp_path)
    first, _ = align_keeping(parties, TABLES, seed=3, now=START)
    update, note = align_keeping(parties, TABLES, seed=3, now=START + DAY)
    assert note.startswith("the kept alignment updated")
    assert update[0].kept.domain == first[0].alignment_id  # the first alignment's keys
    rotated, note = align_keeping(parties, TABLES, seed=3, now=START + 2 * DAY)
    assert "rotated" in note and "1 updates (at most 1)" in note
    assert rotated[0].kept.domain == rotated[0].alignment_id != first[0].alignment_id
    assert rotated[0].kept.scalar != first[0].kept.scalar
    assert rotated[0].kept.blinded_last == len(TABLES[0]) * 3
    later = START + 2 * DAY + keeping.MAX_AGE_SECONDS
    _, note = align_keeping(parties, TABLES, seed=3, now=later)
    assert "rotated" in note and "days old" in note
    _, note = align_keeping(parties, TABLES, seed=3, now=later, realign=True)
    assert note.startswith("a fresh alignment with new keys (--realign)")


def prepared(root: Path, tables: Sequence[Sequence[str]]) -> list[Path]:
    """Each party's ids as a tiny table, through `glasu prepare` (its folder names its
    organisation), party 0 with labels."""
    from clients.cli.main import main

    made = []
    for m, ids in enumerate(tables):
        source = root / "tables" / f"org{m}"
        source.mkdir(parents=True)
        (source / "nodes.csv").write_text(
            "customer,f\n" + "".join(f"{node},{i % 7}\n" for i, node in enumerate(ids))
        )
        (source / "edges.csv").write_text(f"source,target\n{ids[0]},{ids[1]}\n")
        args = ["prepare", "--nodes", str(source / "nodes.csv"), "--edges",
                str(source / "edges.csv"), "--id-column", "customer", "--quiet",
                "--out", str(root / "prepared" / f"org{m}")]  # fmt: skip
        if m == 0:
            (source / "labels.csv").write_text(
                "customer,label\n" + "".join(f"{node},{i % 2}\n" for i, node in enumerate(ids))
            )
            args += ["--labels", str(source / "labels.csv")]
        assert main(args) == 0
        made.append(root / "prepared" / f"org{m}")
    return made


def test_scoring_finds_the_kept_alignment_of_each_organisation_in_a_new_copy_of_its_data(
    tmp_path: Path,
) -> None:
    """`glasu score`'s alignment (federation_of_parties with keeping): kept with each
    organisation's ledger, so tables prepared again into new folders update it."""
    import os

    from clients.local.parties import AlignmentKeeping, federation_of_parties

    first = federation_of_parties(
        prepared(tmp_path / "day1", TABLES), seed=1, keeping=AlignmentKeeping(now=START)
    )
    assert "(a fresh alignment with new keys (none kept yet" in first.summary
    kept = Path(os.environ["XDG_DATA_HOME"]) / "glasu" / "alignments"
    assert sorted(p.name for p in kept.iterdir()) == ["org0", "org1", "org2"]
    assert not list((tmp_path / "day1").rglob(KEPT_FILE))
    tables = updated(TABLES)
    second = federation_of_parties(
        prepared(tmp_path / "day2", tables), seed=1, keeping=AlignmentKeeping(now=START + DAY)
    )
    assert "(the kept alignment updated (update 1 of its keys); 24 blindings" in second.summary
    assert second.index.aligned_nodes == len(set.intersection(*map(set, tables)))
    again = federation_of_parties(
        prepared(tmp_path / "day3", tables),
        seed=1,
        keeping=AlignmentKeeping(realign=True, now=START + DAY),
    )
    assert "(a fresh alignment with new keys (--realign)" in again.summary


def test_ids_that_differ_only_by_trailing_nul_are_told_apart() -> None:
    kept = keeping.KeptAlignment.fresh(domain="d", parties=2, party=0, now=START).placed(
        alignment_id="d", kept_digest="k", aligned_nodes=0, keys=keeping.id_keys(["a"]),
        positions=np.array([0]), aligned=np.array([-1]), updated=False, blinded=1,
    )  # fmt: skip
    delta = kept.delta(["a\x00", "a"])
    assert delta.added_rows.tolist() == [0] and delta.row_positions.tolist() == [-1, 0]
    assert delta.removed_positions.size == 0


def test_a_lost_service_database_is_refused_with_the_way_out(tmp_path: Path) -> None:
    from clients.local.alignment import service_database

    parties = folders(tmp_path)
    align_keeping(parties, TABLES, seed=3, now=START)
    service_database(parties[0] / KEPT_FILE).unlink()
    with pytest.raises(KeptAlignmentError, match=r"cannot update the kept alignment .* realign"):
        align_keeping(parties, updated(TABLES), seed=3, now=START + DAY)
    _, note = align_keeping(parties, updated(TABLES), seed=3, now=START + DAY, realign=True)
    assert note.startswith("a fresh alignment with new keys (--realign)")
