"""Binary bodies: the X-Glasu-* headers, node-set validation and unions."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from service.errors import ProblemError

INT64_LE = np.dtype("<i8")
NODE_ENCODING = "int64"
EMBEDDING_ENCODINGS = ("float32", "ckks")

_NODE_SHAPE = re.compile(r"\s*(\d{1,19})\s*")
_MATRIX_SHAPE = re.compile(r"\s*(\d{1,19})\s*,\s*(\d{1,19})\s*")


@dataclass(frozen=True, slots=True)
class MatrixHeader:
    rows: int
    cols: int
    encoding: str


def parse_node_headers(shape: str | None, encoding: str | None) -> int:
    """The declared length n of a node set."""
    if shape is None:
        raise ProblemError(400, "bad-header", "missing X-Glasu-Shape header (expected 'n')")
    match = _NODE_SHAPE.fullmatch(shape)
    if not match:
        raise ProblemError(
            400, "bad-header", f"X-Glasu-Shape {shape!r} is not a node count 'n' for a node set"
        )
    _require_encoding(encoding, allowed=(NODE_ENCODING,))
    return int(match.group(1))


def parse_matrix_headers(shape: str | None, encoding: str | None) -> MatrixHeader:
    if shape is None:
        raise ProblemError(400, "bad-header", "missing X-Glasu-Shape header (expected 'rows,cols')")
    match = _MATRIX_SHAPE.fullmatch(shape)
    if not match:
        raise ProblemError(
            400, "bad-header", f"X-Glasu-Shape {shape!r} is not 'rows,cols' for an embedding"
        )
    return MatrixHeader(
        rows=int(match.group(1)),
        cols=int(match.group(2)),
        encoding=_require_encoding(encoding, allowed=EMBEDDING_ENCODINGS),
    )


def _require_encoding(encoding: str | None, *, allowed: tuple[str, ...]) -> str:
    expected = " or ".join(repr(a) for a in allowed)
    if encoding is None:
        raise ProblemError(
            400, "bad-header", f"missing X-Glasu-Encoding header (expected {expected})"
        )
    value = encoding.strip().lower()
    if value not in allowed:
        raise ProblemError(
            400,
            "bad-header",
            f"X-Glasu-Encoding {encoding!r} is not valid here (expected {expected})",
        )
    return value


def validate_node_set(body: bytes, *, declared: int, num_nodes: int) -> np.ndarray:
    """Little-endian int64, exactly ``declared`` entries, strictly ascending, in [0, num_nodes)."""
    if declared > num_nodes:
        raise ProblemError(
            422,
            "wrong-shape",
            f"a node set has at most num_nodes={num_nodes} distinct ids,"
            f" X-Glasu-Shape says {declared}",
        )
    if len(body) != declared * INT64_LE.itemsize:
        raise ProblemError(
            422,
            "bad-payload",
            f"node set body has {len(body)} bytes; X-Glasu-Shape {declared} needs"
            f" {declared * INT64_LE.itemsize} (little-endian int64)",
        )
    nodes = np.frombuffer(body, dtype=INT64_LE)
    # Range first, over all entries: np.diff of arbitrary int64 can overflow and look ascending.
    if nodes.size and (nodes.min() < 0 or nodes.max() >= num_nodes):
        raise ProblemError(422, "bad-payload", f"node ids must lie in [0, num_nodes={num_nodes})")
    if nodes.size > 1 and not bool(np.all(nodes[1:] > nodes[:-1])):
        raise ProblemError(422, "bad-payload", "node ids must be sorted ascending and unique")
    return nodes


def union_of(bodies: list[bytes]) -> bytes:
    """Sorted union of int64 node sets, as little-endian int64 bytes."""
    arrays = [np.frombuffer(b, dtype=INT64_LE) for b in bodies]
    return np.unique(np.concatenate(arrays)).astype(INT64_LE).tobytes()
