"""The service's incremental intersection (service/alignment/incremental.py), without HTTP:
random additions and removals against a from-scratch intersection of the same sets
(secure.psi.index_sets, what a fresh alignment under the same keys computes)."""

from __future__ import annotations

import numpy as np
import pytest

from secure.psi import index_sets
from service.alignment.incremental import (
    ELEMENT,
    HOLE,
    KeptSets,
    UpdateRefused,
    apply_update,
)

OWNERS = 3


def fresh(sets: list[np.ndarray]) -> KeptSets:
    """What a fresh alignment of ``sets`` (each owner's elements by position) keeps."""
    indexed = index_sets([s.tobytes() for s in sets])
    return KeptSets.from_bodies(
        [s.tobytes() for s in sets], indexed.positions, indexed.aligned_nodes
    )


def from_scratch(kept: KeptSets) -> tuple[KeptSets, bytes]:
    """The kept sets' live elements intersected afresh; holes stay holes (-1)."""
    live = [e[e != HOLE] for e in kept.elements]
    indexed = index_sets([e.tobytes() for e in live])
    positions = []
    for elements, body in zip(kept.elements, indexed.positions, strict=True):
        placed = np.full(elements.size, -1, np.int64)
        placed[elements != HOLE] = np.frombuffer(body, "<i8")
        positions.append(placed)
    return KeptSets(kept.elements, positions, indexed.aligned_nodes), indexed.digest


def random_elements(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.frombuffer(rng.bytes(32 * n), dtype=ELEMENT)


@pytest.mark.parametrize("seed", range(6))
def test_an_update_equals_the_intersection_of_the_updated_sets_from_scratch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    universe = random_elements(rng, 400)
    held = [rng.permutation(np.flatnonzero(rng.random(300) < 0.8)) for _ in range(OWNERS)]
    kept = fresh([universe[h] for h in held])
    for _ in range(3):  # a chain of updates, each on the last one's kept sets
        added, removed = [], []
        for m in range(OWNERS):
            live = set(universe.tolist()) & set(kept.elements[m][kept.elements[m] != HOLE].tolist())
            alive = np.flatnonzero(kept.elements[m] != HOLE)
            removed.append(np.sort(rng.choice(alive, size=int(rng.integers(0, 6)), replace=False)))
            # new customers, and ids a partner held and this owner adds now
            gone = {kept.elements[m][p] for p in removed[m]}
            choices = [e for e in universe.tolist() if e not in live and e not in gone]
            pick = rng.choice(len(choices), size=min(len(choices), int(rng.integers(0, 8))))
            added.append(np.array([choices[i] for i in np.unique(pick)], dtype=ELEMENT))
        result = apply_update(kept, added, removed)
        expected, digest = from_scratch(result.kept)
        assert result.kept.aligned_nodes == expected.aligned_nodes
        assert result.digest == digest
        for got, want in zip(result.kept.positions, expected.positions, strict=True):
            np.testing.assert_array_equal(got, want)
        for m, change in enumerate(result.changes):
            # the changes alone take the base's positions to the new ones
            moved = _apply_changes(kept, m, change, len(added[m]))
            np.testing.assert_array_equal(moved, result.kept.positions[m])
        kept = result.kept


def _apply_changes(base: KeptSets, m: int, change, added: int) -> np.ndarray:
    new_nodes = base.aligned_nodes - change.removed.size + change.inserted.size
    survivors = np.setdiff1d(np.arange(new_nodes), change.inserted)
    old_to_new = np.full(base.aligned_nodes, -1, np.int64)
    old_to_new[np.setdiff1d(np.arange(base.aligned_nodes), change.removed)] = survivors
    old = base.positions[m]
    moved = np.concatenate(
        [np.where(old >= 0, old_to_new[np.maximum(old, 0)], -1), np.full(added, -1)]
    )
    moved[change.positions] = change.inserted
    return moved


def test_an_empty_delta_changes_nothing() -> None:
    rng = np.random.default_rng(7)
    universe = random_elements(rng, 50)
    kept = fresh([universe[:40], universe[5:45], universe[10:]])
    empty = np.empty(0, dtype=ELEMENT)
    result = apply_update(kept, [empty] * OWNERS, [np.empty(0, np.int64)] * OWNERS)
    assert result.kept.digest() == kept.digest()
    assert all(c.removed.size == c.inserted.size == 0 for c in result.changes)


def test_a_delta_that_cannot_apply_is_refused() -> None:
    rng = np.random.default_rng(8)
    universe = random_elements(rng, 20)
    kept = fresh([universe[:10], universe[:12], universe[:15]])
    none = [np.empty(0, dtype=ELEMENT)] * OWNERS
    no_removal = [np.empty(0, np.int64)] * OWNERS
    for removed, match in [
        (np.array([10]), "outside the kept set"),
        (np.array([3, 3]), "removed twice"),
    ]:
        with pytest.raises(UpdateRefused, match=match):
            apply_update(kept, none, [removed, *no_removal[1:]])
    again = apply_update(kept, none, [np.array([2]), *no_removal[1:]]).kept
    with pytest.raises(UpdateRefused, match="is a hole"):
        apply_update(again, none, [np.array([2]), *no_removal[1:]])
    with pytest.raises(UpdateRefused, match="its kept set holds"):
        apply_update(kept, [universe[4:5], *none[1:]], no_removal)
