"""The wire format of a ``ckks`` embedding: a header and length-prefixed chunks.

All integers big-endian::

    b"GLCK" | version: uint8 | key id: 8 bytes | chunk count: uint32
    then per chunk: length: uint32 | a serialized TenSEAL CKKSVector

The key id is bytes 5 to 12 of the payload. The matrix is flattened row-major and cut into
chunks of ``VALUES_PER_CIPHERTEXT`` (N = 4096) values (the last chunk may be shorter), two per
slot: values 2k and 2k + 1 of a chunk are the real and imaginary part of its slot k
(secure/ckks_packing.py); ``rows * cols == 0`` gives zero chunks. The key id is the first 8
bytes of SHA-256 over the public context's serialization, i.e. over the bytes of
``public.context`` (:func:`secure.ckks_context.context_key_id`): a share encrypted under another
key pair or other parameters is refused instead of silently corrupting the sum.

Framing only: no chunk is deserialized here (secure/ckks.py does that, after
secure/ckks_packing.py has checked it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from secure.aggregation import PayloadError
from secure.ckks_context import KEY_ID_BYTES, POLY_MODULUS_DEGREE, VALUES_PER_CIPHERTEXT

MAGIC = b"GLCK"
FORMAT_VERSION = 2  # 1: one value per slot, unseeded shares
_HEADER = struct.Struct(f">4sB{KEY_ID_BYTES}sI")
_CHUNK_LENGTH = struct.Struct(">I")
FRAME_HEADER_BYTES = _HEADER.size
CHUNK_PREFIX_BYTES = _CHUNK_LENGTH.size
#: The most a worker's chunk takes (secure/ckks_packing.py): a seeded ciphertext is one
#: polynomial at the data prime (N 64-bit words) and a 64-byte seed, zstd-compressed (~25 KiB
#: for N = 4096; zstd grows incompressible input by well under 1 KiB), with SEAL's header and
#: TenSEAL's wrapper. What a body limit's parts are sized by (``secure.body_limits``).
SHARE_CHUNK_BOUND_BYTES = POLY_MODULUS_DEGREE * 8 + 1024
# Twice an uncompressed 2-polynomial ciphertext at one 64-bit-word prime: 128 KiB for N = 4096
# (a seeded share's chunk is ~25 KiB, a sum's ~51 KiB, both zstd-compressed).
MAX_CHUNK_BYTES = 2 * (2 * POLY_MODULUS_DEGREE * 8)


@dataclass(frozen=True)
class CkksFrame:
    """A parsed payload: the key id and where each serialized chunk lies, not yet deserialized.

    A chunk is copied out of the payload only when it is reached (TenSEAL loads from ``bytes``
    only): loading one copy before making the next reuses one buffer instead of allocating a
    second payload's worth of memory (measured: 4% of the service's path for a 265 x 128 share).
    """

    key_id: bytes
    payload: bytes
    spans: tuple[tuple[int, int], ...]  # (start, end) of each chunk in the payload

    @property
    def chunks(self) -> tuple[bytes, ...]:
        return tuple(self.iter_chunks())

    def iter_chunks(self) -> Iterator[bytes]:
        for start, end in self.spans:
            yield self.payload[start:end]


def frame_chunks(chunks: Sequence[bytes], *, key_id: bytes) -> bytes:
    """Header plus length-prefixed chunks."""
    if len(key_id) != KEY_ID_BYTES:
        raise ValueError(f"key id must be {KEY_ID_BYTES} bytes, got {len(key_id)}")
    parts = [_HEADER.pack(MAGIC, FORMAT_VERSION, key_id, len(chunks))]
    for chunk in chunks:
        parts.append(_CHUNK_LENGTH.pack(len(chunk)))
        parts.append(chunk)
    return b"".join(parts)


def parse_frame(payload: bytes) -> CkksFrame:
    """Split a payload into chunks; :class:`PayloadError` for any framing problem."""
    view = memoryview(payload)
    if len(view) < _HEADER.size:
        raise PayloadError(f"ckks body of {len(view)} bytes is shorter than its header")
    magic, version, key_id, count = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise PayloadError(f"ckks body does not start with {MAGIC!r} (got {bytes(magic)!r})")
    if version != FORMAT_VERSION:
        raise PayloadError(f"ckks format version {version} is not supported ({FORMAT_VERSION})")
    spans: list[tuple[int, int]] = []
    offset = _HEADER.size
    for index in range(count):
        start, offset = _chunk_span(view, offset, index=index)
        spans.append((start, offset))
    if offset != len(view):
        raise PayloadError(f"{len(view) - offset} trailing bytes after {count} chunks")
    return CkksFrame(key_id=bytes(key_id), payload=bytes(payload), spans=tuple(spans))


def _chunk_span(view: memoryview, offset: int, *, index: int) -> tuple[int, int]:
    """Where the bytes of chunk ``index``, whose length prefix is at ``offset``, start and end."""
    if offset + _CHUNK_LENGTH.size > len(view):
        raise PayloadError(f"ckks body truncated before the length of chunk {index}")
    (length,) = _CHUNK_LENGTH.unpack_from(view, offset)
    offset += _CHUNK_LENGTH.size
    if length > MAX_CHUNK_BYTES:
        raise PayloadError(f"chunk {index} claims {length} bytes (at most {MAX_CHUNK_BYTES})")
    if offset + length > len(view):
        raise PayloadError(
            f"ckks body truncated inside chunk {index}: {length} bytes announced,"
            f" {len(view) - offset} left"
        )
    return offset, offset + length


def chunk_lengths(*, rows: int, cols: int) -> list[int]:
    """How many values each chunk of a (rows x cols) matrix holds."""
    _check_shape(rows=rows, cols=cols)
    total = rows * cols
    step = VALUES_PER_CIPHERTEXT
    return [min(step, total - start) for start in range(0, total, step)]


def max_payload_bytes(*, rows: int, cols: int) -> int:
    """An upper bound on a valid payload's size, to refuse oversized bodies before parsing."""
    chunks = len(chunk_lengths(rows=rows, cols=cols))
    return _HEADER.size + chunks * (_CHUNK_LENGTH.size + MAX_CHUNK_BYTES)


def _check_shape(*, rows: int, cols: int) -> None:
    if rows < 0 or cols < 0:
        raise PayloadError(f"shape ({rows}, {cols}) has a negative dimension")
