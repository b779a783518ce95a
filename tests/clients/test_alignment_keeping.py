"""The kept alignment (clients/alignment_keeping.py): an update aligns the same nodes as a fresh
alignment of the updated tables and blinds only the ids added since; the kept file is private,
and one that was changed or is another party's or federation's is refused by its path; keys
rotate. Every alignment runs through the service's routes in this process (no sockets)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

import clients.alignment_keeping as keeping
from clients.alignment import AlignmentOutcome
from clients.alignment_keeping import KEPT_FILE, KeptAlignmentError, read_kept
from clients.local.alignment import align_in_process, align_keeping
from secure.psi import hash_to_group

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


@pytest.mark.parametrize("nodes", ["intersection", "union"])
def test_an_update_aligns_the_same_nodes_as_a_fresh_alignment_of_the_updated_tables(
    nodes: str,
) -> None:
    first = align_in_process(TABLES, seed=3, nodes=nodes, keep=True)
    kept = [outcome.kept for outcome in first]
    tables = updated(TABLES)
    update = align_in_process(tables, seed=3, nodes=nodes, kept=kept)  # type: ignore[arg-type]
    fresh = align_in_process(tables, seed=3, nodes=nodes)
    assert aligned_ids(update, tables) == aligned_ids(fresh, tables)
    assert ("new-a", "new-a", "new-a") in aligned_ids(update, tables)
    assert update[0].aligned_nodes == fresh[0].aligned_nodes
    assert all(o.kept is None for o in fresh)  # not asked to keep: nothing remembered
    assert {o.digest for o in update} == {update[0].digest}
    # and a second update, from the first update's kept alignment
    again = [ids[:-1] for ids in tables]
    second = align_in_process(again, seed=3, nodes=nodes, kept=[o.kept for o in update])
    fresh_again = align_in_process(again, seed=3, nodes=nodes)
    assert aligned_ids(second, again) == aligned_ids(fresh_again, again)


def test_an_update_blinds_only_the_ids_added_since() -> None:
    first = align_in_process(TABLES, seed=3, keep=True)
    assert [o.kept.blinded_last for o in first] == [len(TABLES[0]) * 3] * 3
    tables = updated(TABLES)
    update = align_in_process(tables, seed=3, kept=[o.kept for o in first])
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


def kept_after_blinding(elements: list[bytes], ids: list[str]) -> keeping.KeptAlignment:
    run = keeping.RunBlinding(
        keeping.KeptAlignment.fresh(domain="d", parties=2, party=0, now=START), workers=1
    )
    run.own(ids)
    run.relayed(1, elements)
    return run.result(updated=False)


def test_a_kept_party_still_refuses_a_relayed_set_that_repeats_or_spells_badly() -> None:
    """What it blinded before is looked up, not checked again: the checks of the rest, and the
    distinctness of the whole set, still hold."""
    elements = [hash_to_group("x", str(i)) for i in range(3)]
    kept = kept_after_blinding(elements, ["a"])
    run = keeping.RunBlinding(kept, workers=1)
    with pytest.raises(ValueError, match="the same element twice"):
        run.relayed(1, [elements[0], elements[1], elements[0]])
    with pytest.raises(ValueError, match="not a valid ristretto255 group element"):
        run.relayed(1, [elements[0], bytes(32)])
    assert run.blinded == 0  # neither set was worth blinding
    posted = run.relayed(1, [elements[2], hash_to_group("x", "new"), elements[0]])
    assert run.blinded == 1
    assert posted[0] == kept.key.blind(elements[2]) and posted[2] == kept.key.blind(elements[0])


def test_ids_that_differ_only_by_trailing_nul_are_told_apart() -> None:
    kept = kept_after_blinding([], ["a", "a\x00"])
    run = keeping.RunBlinding(kept, workers=1)
    assert run.own(["a\x00", "a"]) == kept.key.blind_all(
        [hash_to_group("d", "a\x00"), hash_to_group("d", "a")]
    )
    assert run.blinded == 0
