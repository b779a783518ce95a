"""The incremental intersection of an alignment update (docs/protocol.md, "Alignment updates"):
what the service keeps of a done alignment, and the next one computed from the parties' deltas
alone, vectorised (numpy scans of the kept sets, no per-element Python loop).

The service keeps, per owner, the fully blinded element at each position of the owner's kept
set (the positions its own posts filled, in order: an update's added elements come after the
base's) and each position's index in the aligned node index (-1: not shared, or a hole). A
removed position becomes a hole (32 zero bytes: never a valid element, the identity's encoding)
until the next fresh alignment. The aligned index is the intersection's elements in byte order,
exactly as a fresh alignment of the same tables under the same keys orders them
(:func:`secure.psi.index_sets`), so an update's result is that alignment's result.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from secure.psi import ELEMENT_BYTES, IDENTITY

ELEMENT = f"S{ELEMENT_BYTES}"  # numpy bytes: equal and ordered as the 32 bytes
HOLE = IDENTITY


class UpdateRefused(ValueError):
    """A delta that cannot apply to the kept sets (its message says why)."""


@dataclass(frozen=True)
class KeptSets:
    """Per owner: its kept set's elements by position (holes zero) and their aligned indices."""

    elements: list[np.ndarray]  # (n_m,) ELEMENT
    positions: list[np.ndarray]  # (n_m,) int64: aligned index, -1 not shared or a hole
    aligned_nodes: int

    @classmethod
    def from_bodies(
        cls, elements: list[bytes], positions: list[bytes], aligned_nodes: int
    ) -> KeptSets:
        return cls(
            [np.frombuffer(body, dtype=ELEMENT) for body in elements],
            [np.frombuffer(body, dtype="<i8").astype(np.int64) for body in positions],
            aligned_nodes,
        )

    def bodies(self) -> tuple[list[bytes], list[bytes]]:
        return (
            [np.ascontiguousarray(e).tobytes() for e in self.elements],
            [p.astype("<i8").tobytes() for p in self.positions],
        )

    def aligned(self) -> np.ndarray:
        """The aligned index: its elements, sorted (from owner 0's kept set)."""
        held = self.positions[0] >= 0
        index = np.empty(self.aligned_nodes, dtype=ELEMENT)
        index[self.positions[0][held]] = self.elements[0][held]
        return index

    def digest(self) -> str:
        """SHA-256 (hex) of everything kept: each owner's elements and positions."""
        outer = hashlib.sha256(self.aligned_nodes.to_bytes(8, "little"))
        for elements, positions in zip(*self.bodies(), strict=True):
            outer.update(hashlib.sha256(elements).digest() + hashlib.sha256(positions).digest())
        return outer.hexdigest()


@dataclass(frozen=True)
class PartyChanges:
    """What changed for one owner: the base's aligned indices removed, the new index's inserted
    indices (sorted), and this owner's kept position of each inserted node."""

    removed: np.ndarray
    inserted: np.ndarray
    positions: np.ndarray
    kept_positions: int  # positions of this owner's kept set now (holes included)


@dataclass(frozen=True)
class UpdateResult:
    kept: KeptSets
    changes: list[PartyChanges]
    digest: bytes  # SHA-256 of the sorted aligned index, as a fresh alignment's


def check_removed(removed: np.ndarray, elements: np.ndarray) -> None:
    """Removed positions: distinct, within the kept set, none a hole already."""
    if removed.size and (removed.min() < 0 or removed.max() >= elements.size):
        raise UpdateRefused(
            f"a removed position is outside the kept set's {elements.size} positions"
        )
    if np.unique(removed).size != removed.size:
        raise UpdateRefused("a position is removed twice")
    if (elements[removed] == HOLE).any():
        raise UpdateRefused("a removed position was removed before (it is a hole)")


def apply_update(
    base: KeptSets, added: list[np.ndarray], removed: list[np.ndarray]
) -> UpdateResult:
    """``added[m]``: owner m's new fully blinded elements (ELEMENT), which take the positions
    after its kept set's, in order; ``removed[m]``: its removed positions (int64)."""
    owners = len(base.elements)
    elements, positions, gone = [], [], []
    for m in range(owners):
        check_removed(removed[m], base.elements[m])
        own = base.elements[m].copy()
        index = base.positions[m].copy()
        gone.append(index[removed[m]])
        own[removed[m]] = HOLE
        index[removed[m]] = -1
        elements.append(np.concatenate([own, added[m]]))
        positions.append(np.concatenate([index, np.full(added[m].size, -1, np.int64)]))
    removed_nodes = np.unique(np.concatenate(gone))
    removed_nodes = removed_nodes[removed_nodes >= 0]
    for m in range(owners):  # each added set is distinct: the service checked it as it came
        if (_find(elements[m][: base.elements[m].size], np.sort(added[m])) >= 0).any():
            raise UpdateRefused(f"party {m}'s added set holds an element its kept set holds")
    candidates = np.unique(np.concatenate(added))
    # where each owner now holds each candidate (-1: nowhere)
    where = np.stack([_find(elements[m], candidates) for m in range(owners)])
    shared = (where >= 0).all(axis=0)
    new_nodes = candidates[shared]  # sorted (np.unique)
    keep = np.ones(base.aligned_nodes, dtype=bool)
    keep[removed_nodes] = False
    survivors = base.aligned()[keep]
    at = np.searchsorted(survivors, new_nodes)
    index = np.insert(survivors, at, new_nodes)
    inserted = at + np.arange(new_nodes.size)
    is_new = np.zeros(index.size, dtype=bool)
    is_new[inserted] = True
    old_to_new = np.full(base.aligned_nodes, -1, np.int64)
    old_to_new[keep] = np.flatnonzero(~is_new)
    changes = []
    for m in range(owners):
        mapped = np.where(positions[m] >= 0, old_to_new[np.maximum(positions[m], 0)], -1)
        mapped[where[m][shared]] = inserted
        positions[m] = mapped
        changes.append(
            PartyChanges(removed_nodes, inserted, where[m][shared], int(elements[m].size))
        )
    kept = KeptSets(elements, positions, int(index.size))
    return UpdateResult(kept, changes, hashlib.sha256(index.tobytes()).digest())


def _find(elements: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each of the sorted, distinct ``queries``, its position in ``elements`` (-1: absent).
    One vectorised scan by the first 8 bytes, then the whole 32 compared on the few hits."""
    found = np.full(queries.size, -1, np.int64)
    if not queries.size or not elements.size:
        return found
    heads = np.ascontiguousarray(elements).view(np.uint64)[:: ELEMENT_BYTES // 8]
    wanted = np.sort(np.ascontiguousarray(queries).view(np.uint64)[:: ELEMENT_BYTES // 8])
    near = np.minimum(np.searchsorted(wanted, heads), wanted.size - 1)  # O(N log delta)
    hits = np.flatnonzero(wanted[near] == heads)
    at = np.searchsorted(queries, elements[hits])
    inside = at < queries.size
    same = np.zeros(hits.size, dtype=bool)
    same[inside] = queries[at[inside]] == elements[hits[inside]]
    found[at[same]] = hits[same]
    return found
