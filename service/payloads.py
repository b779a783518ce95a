"""Binary bodies: the X-Glasu-* headers, node-set validation and unions.

Everything here raises domain errors (:mod:`service.domain_errors`): ``BadHeader`` for a missing
or malformed header, ``WrongShape`` / ``BadPayload`` for a body that does not fit. The round
engine calls these functions; the app turns the errors into problem details. The encodings and
the node union are the wire protocol's own (:mod:`secure.protocol`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from secure.protocol import EMBEDDING_ENCODINGS, INT64_LE, NODE_ENCODING, sorted_union
from secure.wire.headers import ENCODING_HEADER, SHAPE_HEADER
from service.domain_errors import BadHeader, BadPayload, WrongShape

_NODE_SHAPE = re.compile(r"\s*(\d{1,19})\s*")
_MATRIX_SHAPE = re.compile(r"\s*(\d{1,19})\s*,\s*(\d{1,19})\s*")


@dataclass(frozen=True, slots=True)
class MatrixHeader:
    rows: int
    cols: int
    encoding: str


def parse_node_headers(shape: str | None, encoding: str | None) -> int:
    """The declared length n of a node set."""
    match = _match_shape(shape, _NODE_SHAPE, expected="n", what="a node count 'n' for a node set")
    _require_encoding(encoding, allowed=(NODE_ENCODING,))
    return int(match.group(1))


def parse_matrix_headers(shape: str | None, encoding: str | None) -> MatrixHeader:
    match = _match_shape(
        shape, _MATRIX_SHAPE, expected="rows,cols", what="'rows,cols' for an embedding"
    )
    return MatrixHeader(
        rows=int(match.group(1)),
        cols=int(match.group(2)),
        encoding=_require_encoding(encoding, allowed=EMBEDDING_ENCODINGS),
    )


def _match_shape(
    shape: str | None, pattern: re.Pattern[str], *, expected: str, what: str
) -> re.Match[str]:
    if shape is None:
        raise BadHeader(f"missing {SHAPE_HEADER} header (expected '{expected}')")
    match = pattern.fullmatch(shape)
    if not match:
        raise BadHeader(f"{SHAPE_HEADER} {shape!r} is not {what}")
    return match


def _require_encoding(encoding: str | None, *, allowed: tuple[str, ...]) -> str:
    expected = " or ".join(repr(a) for a in allowed)
    if encoding is None:
        raise BadHeader(f"missing {ENCODING_HEADER} header (expected {expected})")
    value = encoding.strip().lower()
    if value not in allowed:
        raise BadHeader(f"{ENCODING_HEADER} {encoding!r} is not valid here (expected {expected})")
    return value


def validate_node_set(body: bytes, *, declared: int, num_nodes: int) -> np.ndarray:
    """Little-endian int64, exactly ``declared`` entries, strictly ascending, in [0, num_nodes)."""
    if declared > num_nodes:
        raise WrongShape.node_set_too_large(declared, num_nodes)
    if len(body) != declared * INT64_LE.itemsize:
        raise BadPayload(
            f"node set body has {len(body)} bytes; {SHAPE_HEADER} {declared} needs"
            f" {declared * INT64_LE.itemsize} (little-endian int64)"
        )
    nodes = np.frombuffer(body, dtype=INT64_LE)
    # Range first, over all entries: np.diff of arbitrary int64 can overflow and look ascending.
    if nodes.size and (nodes.min() < 0 or nodes.max() >= num_nodes):
        raise BadPayload(f"node ids must lie in [0, num_nodes={num_nodes})")
    if nodes.size > 1 and not bool(np.all(nodes[1:] > nodes[:-1])):
        raise BadPayload("node ids must be sorted ascending and unique")
    return nodes


def union_of(bodies: list[bytes]) -> bytes:
    """Sorted union of int64 node set bodies, as little-endian int64 bytes."""
    union = sorted_union([np.frombuffer(b, dtype=INT64_LE) for b in bodies])
    return union.astype(INT64_LE).tobytes()
