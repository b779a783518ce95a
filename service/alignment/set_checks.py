"""The checks of a posted part of a blinded set that need no alignment state
(``service/alignment/manager.py`` runs them): its headers (size, encoding, signature), its body
(canonical, distinct elements), its span among the set's parts, and that it agrees with the
set's other parts."""

from __future__ import annotations

import numpy as np

from secure.psi import ELEMENT_BYTES, check_elements, unpack
from secure.wire.alignment import SET_ENCODING, set_part_span
from secure.wire.headers import ENCODING_HEADER, SHAPE_HEADER, SIGNATURE_HEADER
from service.alignment.tables import PartRow
from service.domain_errors import AlignmentConflict, BadHeader, BadPayload, WrongShape

SIGNATURE_BYTES = 64  # Ed25519


def part_span(part: int, size: int, part_elements: int) -> range:
    try:
        return set_part_span(part, size=size, part_elements=part_elements)
    except ValueError as exc:
        raise WrongShape(str(exc)) from None


def check_distinct(body: bytes) -> None:
    """The elements of a whole set distinct (each part's are checked as it comes)."""
    elements = np.frombuffer(body, dtype=f"V{ELEMENT_BYTES}")
    if np.unique(elements).size != elements.size:
        raise BadPayload("the set holds the same element twice (in two of its parts)")


def check_like_the_other_parts(
    posted: list[PartRow], *, size: int, signature: bytes | None
) -> None:
    """Every part of a set declares the same size and carries the same signature."""
    if not posted:
        return
    first = posted[0]
    if first.size != size:
        raise WrongShape(
            f"part {first.part} of this set declared {first.size} elements in all, "
            f"{SHAPE_HEADER} says {size}"
        )
    if first.signature != signature:
        raise AlignmentConflict(
            f"part {first.part} of this set came with a different {SIGNATURE_HEADER}: a set's "
            "signature covers the whole set and travels with each of its parts"
        )


def declared_size(shape: str | None, encoding: str | None, *, update: bool = False) -> int:
    """The set's element count: >= 1, or >= 0 in an update (a party that added no id)."""
    if encoding is None or shape is None:
        missing = ENCODING_HEADER if encoding is None else SHAPE_HEADER
        raise BadHeader(f"a blinded set needs the header {missing}")
    if encoding != SET_ENCODING:
        raise BadHeader(f"a blinded set's {ENCODING_HEADER} is {SET_ENCODING!r}, not {encoding!r}")
    least = 0 if update else 1
    if not shape.isdigit() or int(shape) < least:
        raise BadHeader(
            f"{SHAPE_HEADER} of a blinded set is its element count >= {least}, not {shape!r}"
        )
    return int(shape)


def declared_signature(header: str | None) -> bytes | None:
    """The X-Glasu-Signature header's bytes: only its form is checked (the parties verify it)."""
    if header is None:
        return None
    try:
        signature = bytes.fromhex(header)
    except ValueError:
        signature = b""
    if len(signature) != SIGNATURE_BYTES:
        raise BadHeader(
            f"{SIGNATURE_HEADER} is an Ed25519 signature, {SIGNATURE_BYTES} bytes in hex, not "
            f"{header[:140]!r}"
        )
    return signature


def check_body(body: bytes, size: int) -> None:
    if len(body) != size * ELEMENT_BYTES:
        raise BadPayload(
            f"{size} elements take {size * ELEMENT_BYTES} bytes ({ELEMENT_BYTES} each), the body "
            f"has {len(body)}"
        )
    try:
        check_elements(unpack(body))
    except ValueError as exc:
        raise BadPayload(f"the blinded set is not usable: {exc}") from None
