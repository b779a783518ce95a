"""CKKS codec (client side) and encrypted sum (service side) over chunked ``ckks_vector`` s.

Wire format of a ``ckks`` embedding (all integers big-endian)::

    b"GLCK" | version: uint8 | key id: 8 bytes | chunk count: uint32
    then per chunk: length: uint32 | a serialized TenSEAL CKKSVector

The key id is bytes 5 to 12 of the payload. The matrix is flattened row-major and cut into
chunks of ``VALUES_PER_CIPHERTEXT`` (N = 4096) values (the last chunk may be shorter), two per
slot: values 2k and 2k + 1 of a chunk are the real and imaginary part of its slot k
(secure/ckks_packing.py); ``rows * cols == 0`` gives zero chunks. The key id is the first 8
bytes of SHA-256 over the public context's serialization, i.e. over the bytes of
``public.context`` (:func:`secure.ckks_context.context_key_id`): a share encrypted under another
key pair or other parameters is refused instead of silently corrupting the sum. The service
returns only the sum; clients divide by the count (docs/encryption.md).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tenseal as ts

from secure.aggregation import (
    EmbeddingCodec,
    PayloadError,
    PlainCodec,
    PlainSumAggregator,
    RunningSum,
    SumAggregator,
    to_grid,
)
from secure.ckks_context import (
    COEFF_MOD_BIT_SIZES,
    GLOBAL_SCALE,
    GLOBAL_SCALE_BITS,
    KEY_ID_BYTES,
    MAX_ABS_SUM,
    MAX_SHARES,
    POLY_MODULUS_DEGREE,
    PUBLIC_CONTEXT_NAME,
    SECRET_CONTEXT_NAME,
    SLOTS_PER_CIPHERTEXT,
    SUM_ERROR_BOUND,
    VALUES_PER_CIPHERTEXT,
    KeyMaterialError,
    LoadedContext,
    context_key_id,
    describe_context,
    generate_keys,
    load_public_context,
    load_secret_context,
    new_context,
    public_context_bytes,
    secret_context_bytes,
    share_bound,
)
from secure.ckks_packing import SecretKeyCipher, slots_for

__all__ = [
    "COEFF_MOD_BIT_SIZES",
    "FORMAT_VERSION",
    "GLOBAL_SCALE",
    "GLOBAL_SCALE_BITS",
    "KEY_ID_BYTES",
    "MAGIC",
    "MAX_ABS_SUM",
    "MAX_CHUNK_BYTES",
    "MAX_SHARES",
    "POLY_MODULUS_DEGREE",
    "PUBLIC_CONTEXT_NAME",
    "SECRET_CONTEXT_NAME",
    "SLOTS_PER_CIPHERTEXT",
    "SUM_ERROR_BOUND",
    "VALUES_PER_CIPHERTEXT",
    "CkksCodec",
    "CkksFrame",
    "CkksRunningSum",
    "CkksSumAggregator",
    "KeyMaterialError",
    "LoadedContext",
    "chunk_lengths",
    "clear_caches",
    "context_key_id",
    "frame_chunks",
    "generate_keys",
    "load_public_context",
    "load_secret_context",
    "make_codec",
    "make_sum_aggregator",
    "max_payload_bytes",
    "new_context",
    "parse_frame",
    "public_context_bytes",
    "secret_context_bytes",
    "share_bound",
]

MAGIC = b"GLCK"
FORMAT_VERSION = 2  # 1: one value per slot, unseeded shares
_HEADER = struct.Struct(f">4sB{KEY_ID_BYTES}sI")
_CHUNK_LENGTH = struct.Struct(">I")
# Twice an uncompressed 2-polynomial ciphertext at one 64-bit-word prime: 128 KiB for N = 4096
# (a seeded share's chunk is ~25 KiB, a sum's ~51 KiB, both zstd-compressed).
MAX_CHUNK_BYTES = 2 * (2 * POLY_MODULUS_DEGREE * 8)

# TenSEAL's C++ binding of a CKKS vector. Its Python class (``ts.CKKSVector``) wraps each call in
# type checks and a new wrapper object: 16 of the ~110 us that loading one chunk costs, more than
# all of our own validation. The service and the codec call the binding directly (the version is
# pinned in pyproject.toml); it has no type stubs, hence ``Any``.
_native_vector_type = ts._ts_cpp.CKKSVector
NativeVector = Any


# ---------------------------------------------------------------------------------------------
# Framing


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
    return _max_payload_bytes(chunks=len(chunk_lengths(rows=rows, cols=cols)))


def _max_payload_bytes(*, chunks: int) -> int:
    return _HEADER.size + chunks * (_CHUNK_LENGTH.size + MAX_CHUNK_BYTES)


def _check_shape(*, rows: int, cols: int) -> None:
    if rows < 0 or cols < 0:
        raise PayloadError(f"shape ({rows}, {cols}) has a negative dimension")


# ---------------------------------------------------------------------------------------------
# Chunks <-> CKKS vectors


def _read_vectors(
    loaded: LoadedContext, payload: bytes, *, rows: int, cols: int
) -> list[NativeVector]:
    """Parse and deserialize a payload for a (rows x cols) slot; PayloadError if it does not fit.
    Each chunk is inflated by ``zstandard`` and checked before SEAL parses it
    (secure/ckks_packing.py: SEAL never inflates bytes from the network)."""
    expected = chunk_lengths(rows=rows, cols=cols)
    if len(payload) > _max_payload_bytes(chunks=len(expected)):
        raise PayloadError(f"ckks body of {len(payload)} bytes is too large for ({rows}, {cols})")
    frame = parse_frame(payload)
    if frame.key_id != loaded.key_id:
        raise PayloadError(
            f"share encrypted under key id {frame.key_id.hex()}, this session uses"
            f" {loaded.key_id.hex()} (a different key pair or CKKS parameters)"
        )
    if len(frame.spans) != len(expected):
        raise PayloadError(
            f"{len(frame.spans)} chunks, but ({rows}, {cols}) needs {len(expected)}"
            f" of {VALUES_PER_CIPHERTEXT} values"
        )
    return [
        _load_chunk(loaded, chunk, index=index, expected_slots=slots_for(values))
        for index, (chunk, values) in enumerate(zip(frame.iter_chunks(), expected, strict=True))
    ]


def _load_chunk(
    loaded: LoadedContext, data: bytes, *, index: int, expected_slots: int
) -> NativeVector:
    try:
        data, slots = loaded.layout.checked(data)
    except ValueError as error:
        raise PayloadError(f"chunk {index}: {error}") from None
    if slots != expected_slots:
        raise PayloadError(f"chunk {index} fills {slots} slots, expected {expected_slots}")
    try:
        return _native_vector_type(loaded.context.data, data)
    except Exception as error:  # TenSEAL raises ValueError/RuntimeError/TypeError/...
        raise PayloadError(
            f"chunk {index} is not a CKKS vector under this session's context: {error}"
        ) from None


# ---------------------------------------------------------------------------------------------
# Client side


class CkksCodec(EmbeddingCodec):
    """Encrypts shares and decrypts sums with a worker's secret context. Shares are encrypted
    with the secret key, two values per slot, and travel seeded (secure/ckks_packing.py): the
    service adds them under its public context like any other ciphertext."""

    encoding = "ckks"

    def __init__(self, context: ts.Context) -> None:
        if not context.is_private():
            raise KeyMaterialError("CkksCodec needs the secret context; this one is public")
        self._loaded = describe_context(context)
        self._cipher = SecretKeyCipher(context)

    @classmethod
    def from_file(cls, path: Path | str) -> CkksCodec:
        return cls(load_secret_context(path))

    @property
    def key_id(self) -> bytes:
        return self._loaded.key_id

    @property
    def context(self) -> ts.Context:
        return self._loaded.context

    def value_bound(self, *, shares: int) -> float:
        return share_bound(clients=shares)

    def encode(self, matrix: np.ndarray) -> bytes:
        chunks = self._cipher.encrypt(to_grid(_flatten_share(matrix)))
        return frame_chunks(chunks, key_id=self._loaded.key_id)

    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        values = self.decrypt_sum(payload, rows=rows, cols=cols)
        return to_grid(values).astype(np.float32)

    def decrypt_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        """The float64 (rows x cols) sum with its CKKS error (:meth:`decode_sum` rounds it off)."""
        vectors = _read_vectors(self._loaded, payload, rows=rows, cols=cols)
        if not vectors:
            return np.zeros((rows, cols))
        lengths = chunk_lengths(rows=rows, cols=cols)
        values = np.concatenate(
            [
                self._cipher.decrypt(vector.ciphertext()[0], values=length)
                for vector, length in zip(vectors, lengths, strict=True)
            ]
        )
        return values.reshape(rows, cols)


def _flatten_share(matrix: np.ndarray) -> np.ndarray:
    """Row-major float64 values of a share, refusing what CKKS cannot carry correctly."""
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
    values = np.ascontiguousarray(matrix, dtype=np.float64).reshape(-1)
    if values.size == 0:
        return values
    if not np.isfinite(values).all():
        raise ValueError("share contains NaN or infinite values")
    largest = float(np.abs(values).max())
    if largest > MAX_ABS_SUM:
        raise ValueError(
            f"share has |value| {largest:.4g} > {MAX_ABS_SUM:g}: its encrypted sum would overflow"
            " the CKKS modulus (bound shares with share_bound(clients=M) first)"
        )
    return values


# ---------------------------------------------------------------------------------------------
# Service side


class CkksSumAggregator(SumAggregator[list[NativeVector]]):
    """Validates and adds ciphertext shares with the public context only."""

    encoding = "ckks"

    def __init__(self, context: ts.Context) -> None:
        if context.is_private():
            raise KeyMaterialError(
                "CkksSumAggregator must be given the public context; this one holds a secret key"
            )
        self._loaded = describe_context(context)

    @classmethod
    def from_bytes(cls, public_context: bytes) -> CkksSumAggregator:
        return cls(load_public_context(public_context))

    @property
    def key_id(self) -> bytes:
        return self._loaded.key_id

    def read_share(self, payload: bytes, *, rows: int, cols: int) -> list[NativeVector]:
        return _read_vectors(self._loaded, payload, rows=rows, cols=cols)

    def new_sum(self, *, rows: int, cols: int) -> CkksRunningSum:
        return CkksRunningSum(key_id=self._loaded.key_id)


class CkksRunningSum(RunningSum[list[NativeVector]]):
    """Adds each share into the accumulator as it arrives. Ciphertext addition is exact
    arithmetic modulo q, so the order of arrival does not change a single bit of the sum."""

    def __init__(self, *, key_id: bytes) -> None:
        self._key_id = key_id
        self._clients: set[int] = set()
        self._total: list[NativeVector] | None = None

    @property
    def clients(self) -> frozenset[int]:
        return frozenset(self._clients)

    def add(self, client: int, share: list[NativeVector]) -> None:
        if client in self._clients:
            raise ValueError(f"the share of client {client} is already in the sum")
        if len(self._clients) >= MAX_SHARES:
            raise ValueError(
                f"{len(self._clients) + 1} shares exceed the {MAX_SHARES} the CKKS parameters are"
                " sized for"
            )
        if self._total is None:
            self._total = share  # freshly deserialized vectors: ours to accumulate into
        else:
            if len(share) != len(self._total):
                raise ValueError(f"share of {len(share)} chunks added to {len(self._total)}")
            for accumulator, vector in zip(self._total, share, strict=True):
                accumulator.add_(vector)
        self._clients.add(client)

    def payload(self) -> bytes:
        if self._total is None:
            raise ValueError("nothing to add")
        return frame_chunks([vector.serialize() for vector in self._total], key_id=self._key_id)


# ---------------------------------------------------------------------------------------------
# Factories (memoized: parsing a context and deriving its key id costs milliseconds per call)


def make_codec(secret_context_path: Path | str | None) -> EmbeddingCodec:
    """PlainCodec without a key file, else the (cached) CkksCodec for that secret context."""
    if secret_context_path is None:
        return PlainCodec()
    path = Path(secret_context_path).resolve()
    try:
        stat = path.stat()
    except OSError:
        return CkksCodec.from_file(path)  # raises a KeyMaterialError that says what is wrong
    return _cached_codec(str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)


def make_sum_aggregator(encoding: str, public_context_bytes: bytes | None) -> SumAggregator:
    """The service's aggregator for a session's encoding; ``ckks`` needs the public context."""
    if encoding == PlainSumAggregator.encoding:
        return PlainSumAggregator()
    if encoding == CkksSumAggregator.encoding:
        if public_context_bytes is None:
            raise KeyMaterialError("encoding 'ckks' needs the public context")
        return _cached_aggregator(bytes(public_context_bytes))
    raise ValueError(f"unknown encoding {encoding!r} (expected 'float32' or 'ckks')")


@functools.lru_cache(maxsize=8)
def _cached_codec(path: str, mtime_ns: int, size: int, inode: int) -> CkksCodec:
    del mtime_ns, size, inode  # part of the cache key only: a replaced file is re-read
    return CkksCodec.from_file(path)


@functools.lru_cache(maxsize=8)
def _cached_aggregator(public_context: bytes) -> CkksSumAggregator:
    return CkksSumAggregator.from_bytes(public_context)


def clear_caches() -> None:
    """Forget memoized codecs and aggregators (tests, key rotation)."""
    _cached_codec.cache_clear()
    _cached_aggregator.cache_clear()
