"""The wire protocol's messages, without I/O and without torch (docs/protocol.md).

A GLASU pass is a conversation between one client and the aggregation service: the client asks
for the union of the clients' node sets at an aggregation layer (:class:`NodesRequest`) and hands
in its share of an aggregation layer (:class:`ShareRequest`); it is answered with the union
(a sorted int64 array) and with the :class:`SharesSum` (the sum of all shares). The sans-IO
client in ``models/federated.py`` yields these requests, the in-process driver answers them with
function calls, the HTTP worker (``clients/session_client.py``) carries them to the service, and
the service (``service/``) parses them with the same names. Like h11's events, these are plain data.

Binary bodies carry their shape and their encoding in headers (``secure/wire/headers.py``).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Encoding = Literal["int64", "float32", "ckks", "bfv-masked"]
# how shares travel: float32, CKKS, or pairwise-masked under BFV (secure/masking/codec.py)
ShareEncoding = Literal["float32", "ckks", "bfv-masked"]
# "masks": pairwise-masked shares under BFV (docs/secure-aggregation.md)
SecureAggregation = Literal["none", "masks"]
# which node ids an alignment indexes, and a session averages over: those every party holds, or
# those any party holds (partly shared nodes, the count-aware mean)
AlignedNodes = Literal["intersection", "union"]
# what a pass does when a client is late: wait for it, or go on with the clients that arrived
StragglerPolicy = Literal["wait", "continue"]
# the fewest shares a sum may hold under "continue": one share alone would be revealed to the
# clients that fetch the sum
MIN_CONTRIBUTORS = 2


def answering_party(label_holder: int | None) -> int:
    """The party whose head's prediction is the model's answer: the label holder, or party 0
    where every party holds labels (its partners' heads answer nothing)."""
    return 0 if label_holder is None else label_holder


NODE_ENCODING: Encoding = "int64"
EMBEDDING_ENCODINGS: tuple[Encoding, ...] = ("float32", "ckks", "bfv-masked")
INT64_LE = np.dtype("<i8")
FLOAT32_LE = np.dtype("<f4")


@dataclass(frozen=True)
class NodesRequest:
    """This client's sampled node set at aggregation layer ``layer``; answered with the union."""

    layer: int
    nodes: np.ndarray  # sorted, distinct int64


@dataclass(frozen=True)
class ShareRequest:
    """This client's encoded share of aggregation layer ``layer``; answered with the SharesSum."""

    layer: int
    payload: bytes
    rows: int
    cols: int
    release: str | None = None  # a private release's digest (hex; secure.release_noise)
    part: int = 0  # this share holds part ``part`` of ``parts`` of the layer's rows (part_span)
    parts: int = 1
    # SHA-256 of the part's plaintext (float32, before encoding): what a worker's upload journal
    # records, so that a resumed worker recognises its own share (clients/checkpoint.py)
    plaintext_digest: str | None = None
    # the answering party's predictions (or a partner's zeros) in a scoring session that shares
    # them: what its owner agreed to disclose, not a noisy release (no release gate counts it)
    disclosure: bool = False


def plaintext_digest(share: np.ndarray) -> str:
    """The :attr:`ShareRequest.plaintext_digest` of ``share``."""
    array = np.ascontiguousarray(share, dtype=np.float32)
    return hashlib.sha256(f"{array.shape}".encode() + array.tobytes()).hexdigest()


#: Values (rows x columns) in one part of a share unless the session says otherwise (its
#: ``part_values``, which the service sizes to its body limit: ``secure.body_limits``): a layer's
#: rows travel in parts of ``part_rows(cols)`` consecutive rows, so no body grows with the number
#: of nodes.
PART_VALUES = 2**20


def part_rows(cols: int, part_values: int | None = None) -> int:
    """Rows in every part of a layer with ``cols`` columns but the last, in parts of
    ``part_values`` values (None: :data:`PART_VALUES`)."""
    if cols < 1:
        raise ValueError(f"a share has at least one column, got {cols}")
    return max(1, (PART_VALUES if part_values is None else part_values) // cols)


def part_count(rows: int, cols: int, part_values: int | None = None) -> int:
    """How many parts a layer of ``rows`` x ``cols`` travels in (at least one)."""
    return max(1, -(-rows // part_rows(cols, part_values)))


def part_span(
    part: int, *, rows: int, cols: int, part_values: int | None = None
) -> tuple[int, int]:
    """The rows ``[start, stop)`` of part ``part`` of a layer of ``rows`` x ``cols``."""
    count = part_count(rows, cols, part_values)
    if not 0 <= part < count:
        raise ValueError(f"part {part} of a {rows} x {cols} layer: it has {count} parts")
    size = part_rows(cols, part_values)
    return part * size, min(rows, (part + 1) * size)


@dataclass(frozen=True)
class SharesSum:
    """The sum of every live client's share of a (pass, layer, part), a ShareRequest's answer."""

    payload: bytes  # the sum of the shares, in the shares' encoding
    count: int  # how many shares were added


Request = NodesRequest | ShareRequest
Response = np.ndarray | SharesSum


def sorted_union(node_sets: Sequence[np.ndarray]) -> np.ndarray:
    """The sorted union of the clients' node sets: what every client is handed back."""
    if not node_sets:
        return np.empty(0, dtype=np.int64)
    return np.unique(np.concatenate([np.asarray(s, dtype=np.int64) for s in node_sets]))


def encode_nodes(nodes: np.ndarray) -> bytes:
    return np.ascontiguousarray(nodes, dtype=INT64_LE).tobytes()


def decode_nodes(body: bytes) -> np.ndarray:
    return np.frombuffer(body, dtype=INT64_LE).astype(np.int64)


class ProtocolViolation(ValueError):
    """An answer that breaks the protocol; the message says how. A worker must not go on: the
    sensitivity bound of its release assumes these invariants."""


def check_node_set(nodes: np.ndarray, *, num_nodes: int, what: str) -> np.ndarray:
    """``nodes`` as sorted, distinct int64 ids in [0, num_nodes), or :class:`ProtocolViolation`.

    A duplicated id would give one node two rows of a release and double its influence on it."""
    array = np.asarray(nodes)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ProtocolViolation(f"{what} is not a flat array of integer node ids")
    array = array.astype(np.int64, copy=False)
    if array.size and (array.min() < 0 or array.max() >= num_nodes):
        raise ProtocolViolation(f"{what} holds ids outside [0, {num_nodes})")
    if array.size > 1 and not bool(np.all(array[1:] > array[:-1])):
        raise ProtocolViolation(f"{what} is not sorted and free of duplicates")
    return array


def check_union(union: np.ndarray, *, own: np.ndarray, num_nodes: int, layer: int) -> np.ndarray:
    """The union handed back for ``layer``: a valid node set that contains this client's own."""
    checked = check_node_set(union, num_nodes=num_nodes, what=f"the node union of layer {layer}")
    if not bool(np.all(np.isin(own, checked, assume_unique=True))):
        raise ProtocolViolation(f"the node union of layer {layer} lacks nodes this client sent")
    return checked


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine: the only place plain HTTP is
    acceptable (both the service and the worker warn or refuse otherwise)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
