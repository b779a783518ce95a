"""JSON bodies of the alignment routes (``service/api/routes/alignment.py``); the blinded sets
and the positions travel as binary bodies (docs/protocol.md, "Alignment"), the sets as
ristretto255 elements (``SET_ENCODING``, their ``X-Glasu-Encoding``), in parts of the
alignment's ``part_elements`` elements (:func:`set_parts`, :func:`set_part_span`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from secure.protocol import AlignedNodes
from secure.wire.common import MAX_CLIENTS, Label, ResponseModel, StrictModel, Waiting

AlignmentState = Literal["running", "done"]
MAX_SEED = 2**63 - 1
SET_ENCODING = "ristretto255"
#: Elements of a set (and positions) per part unless the alignment says otherwise: 32 MiB of
#: elements, under the service's default body limit of 64 MiB.
SET_PART_ELEMENTS = 2**20
MAX_PART_ELEMENTS = 2**26


def set_parts(size: int, part_elements: int) -> int:
    """How many parts a set of ``size`` elements travels in."""
    return max(1, -(-size // part_elements))


def set_part_span(part: int, *, size: int, part_elements: int) -> range:
    """The positions of a set of ``size`` elements that part ``part`` holds."""
    if not 0 <= part < set_parts(size, part_elements):
        raise ValueError(
            f"a set of {size} elements travels in {set_parts(size, part_elements)} parts of "
            f"{part_elements}: part {part} is not one of them"
        )
    return range(part * part_elements, min(size, (part + 1) * part_elements))


class AlignmentCreate(StrictModel):
    parties: int = Field(
        ge=2, le=MAX_CLIENTS, description="M, the organisations whose node ids are aligned."
    )
    seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description="Seeds the train/validation/test split drawn over the aligned node index.",
    )
    label: Label | None = Field(None, description="Free text shown in the status.")
    nodes: AlignedNodes = Field(
        "intersection",
        description="Which ids the aligned index covers: those every party holds "
        "(`intersection`), or those any party holds (`union`: partly shared nodes, trained with "
        "the count-aware mean; each party then also learns, per node, how many parties hold it).",
    )
    part_elements: int | None = Field(
        None,
        ge=1,
        le=MAX_PART_ELEMENTS,
        description="Elements per part of every blinded set and of the positions: a set of n "
        "elements travels in ceil(n / part_elements) parts (32 bytes an element). Null: the "
        f"service picks the most (up to {SET_PART_ELEMENTS}) whose parts fit its body limit "
        "(`max_body_bytes`, in the alignment's status); it refuses a given value over it.",
    )
    keep: bool = Field(
        False,
        description="Keep every owner's fully blinded set once done, so that an update can "
        "follow (`base`); intersection only.",
    )
    base: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="An update of this kept, done alignment (the last of its chain): each party "
        "posts only the ids it added (blinded around the ring) and the positions it removed, "
        "and fetches only what changed. It is kept in turn; the base's kept sets move to it.",
    )


class AlignmentCreated(ResponseModel):
    alignment_id: str
    party_tokens: list[str] = Field(description="One per party, returned once.")
    parties: int
    seed: int
    nodes: AlignedNodes
    part_elements: int


class SetProgress(ResponseModel):
    owner: int = Field(description="The party whose node ids the set holds (blinded).")
    size: int | None = Field(description="Elements in the set (null until its owner posts it).")
    hops: int = Field(description="Blinded versions posted so far (M when fully blinded).")
    removed: int | None = Field(
        None, description="An update's removed positions posted by the owner (null: not yet)."
    )


class AlignmentStatus(ResponseModel):
    alignment_id: str
    label: str | None
    parties: int
    seed: int
    state: AlignmentState
    created_at: float
    sets: list[SetProgress]
    nodes: AlignedNodes
    part_elements: int = Field(
        ge=1, le=MAX_PART_ELEMENTS, description="Elements per part of the sets and positions."
    )
    max_body_bytes: int | None = Field(
        None,
        description="The service's body limit: no part it sized passes it (null: an older "
        "service).",
    )
    aligned_nodes: int | None = Field(
        description="Size of the aligned index (the intersection or the union), once done."
    )
    shared_nodes: int | None = Field(
        description="Ids every party holds (the intersection's size), once done."
    )
    digest: str | None = Field(
        description="SHA-256 (hex) of the sorted aligned index of fully blinded values, once "
        "done: every party records it, so all can check they hold the same alignment."
    )
    keep: bool = Field(False, description="The service keeps the fully blinded sets.")
    kept_digest: str | None = Field(
        None,
        description="SHA-256 (hex) of what the service keeps of it, once done and kept: each "
        "party records it and checks it against `base_kept_digest` of the next update.",
    )
    base: str | None = Field(None, description="The kept alignment this update updates.")
    base_kept_digest: str | None = Field(
        None, description="SHA-256 (hex) of what the service keeps of the base, read anew."
    )


class AlignmentChanges(ResponseModel):
    """What an update changed for one party (docs/protocol.md, "Alignment updates")."""

    removed: list[int] = Field(description="The base's aligned indices no longer aligned.")
    inserted: list[int] = Field(description="The new aligned indices of nodes new to the index.")
    positions: list[int] = Field(
        description="This party's kept position of each inserted node, in the same order."
    )
    kept_positions: int = Field(
        description="Positions of this party's kept set now: the base's, then its added ids."
    )


class SetReceipt(ResponseModel):
    owner: int
    hop: int
    part: int
    parts: int = Field(description="The parts the whole set travels in.")
    party: int
    status: Literal["created", "duplicate"]
    size: int = Field(description="Elements in the whole set.")


class AlignmentWaiting(Waiting):
    """An alignment route's 202 answer: the parties that still owe a set it needs."""
