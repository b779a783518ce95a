"""CKKS codec (client side) and encrypted sum (service side) over chunked ``ckks_vector`` s.

A share travels in the frame of secure/ckks_frame.py, its chunks encrypted and checked by
secure/ckks_packing.py under the parameters and keys of secure/ckks_context.py. The service
returns only the sum; clients divide by the count (docs/encryption.md). This module is the
CKKS API the rest of glasu uses: it also names the key handling its users need.
"""

from __future__ import annotations

import functools
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
    ShareSlot,
    SumAggregator,
    to_grid,
)
from secure.ckks_context import (
    KEY_ID_BYTES,
    MAX_ABS_SUM,
    MAX_SHARES,
    VALUES_PER_CIPHERTEXT,
    KeyMaterialError,
    LoadedContext,
    describe_context,
    generate_keys,
    load_public_context,
    load_secret_context,
    share_bound,
)
from secure.ckks_frame import chunk_lengths, frame_chunks, max_payload_bytes, parse_frame
from secure.ckks_packing import SecretKeyCipher, slots_for

__all__ = [
    "KEY_ID_BYTES",
    "MAX_SHARES",
    "CkksCodec",
    "CkksRunningSum",
    "CkksSumAggregator",
    "KeyMaterialError",
    "clear_caches",
    "generate_keys",
    "load_public_context",
    "make_codec",
    "make_sum_aggregator",
]

# TenSEAL's C++ binding of a CKKS vector. Its Python class (``ts.CKKSVector``) wraps each call in
# type checks and a new wrapper object: 16 of the ~110 us that loading one chunk costs, more than
# all of our own validation. The service and the codec call the binding directly (the version is
# pinned in pyproject.toml); it has no type stubs, hence ``Any``.
_native_vector_type = ts._ts_cpp.CKKSVector
NativeVector = Any


# ---------------------------------------------------------------------------------------------
# Chunks <-> CKKS vectors


def _read_vectors(
    loaded: LoadedContext, payload: bytes, *, rows: int, cols: int
) -> list[NativeVector]:
    """Parse and deserialize a payload for a (rows x cols) slot; PayloadError if it does not fit.
    Each chunk is inflated by ``zstandard`` and checked before SEAL parses it
    (secure/ckks_packing.py: SEAL never inflates bytes from the network)."""
    expected = chunk_lengths(rows=rows, cols=cols)
    if len(payload) > max_payload_bytes(rows=rows, cols=cols):
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

    def encode(self, matrix: np.ndarray, *, slot: ShareSlot | None = None) -> bytes:
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
