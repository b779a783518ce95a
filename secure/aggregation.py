"""The one aggregation interface: clients encode their share, the service sums shares it may not
be able to read, clients decode the sum and divide by the count.

The in-process trainer and the HTTP service use the same classes, so both transports run the same
arithmetic. The service only ever needs a :class:`SumAggregator`; clients own an
:class:`EmbeddingCodec`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from secure.protocol import FLOAT32_LE


class PayloadError(ValueError):
    """An uploaded payload that does not fit the slot it was sent to (shape, size, encoding)."""


class EmbeddingCodec(ABC):
    """Client side: turns a (rows x cols) float matrix into bytes for the service and a summed
    payload back into a float matrix."""

    encoding: str

    @abstractmethod
    def encode(self, matrix: np.ndarray) -> bytes: ...

    @abstractmethod
    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray: ...

    def value_bound(self, *, shares: int) -> float:
        """The largest |value| a share may hold so that a sum of ``shares`` decodes."""
        return math.inf


class SumAggregator(ABC):
    """Service side: validates shares and adds them without needing to read them."""

    encoding: str

    @abstractmethod
    def validate(self, payload: bytes, *, rows: int, cols: int) -> None:
        """Raise :class:`PayloadError` with a message saying what is wrong."""

    @abstractmethod
    def add(self, payloads: Sequence[bytes], *, rows: int, cols: int) -> bytes:
        """The sum of the shares, in the same encoding, in the order given."""


# Shares travel on a fixed-point grid of step 2^-12 (about 2.4e-4), and sums are rounded back to
# it. Encrypted sums then decode to exactly the plaintext sums: CKKS's decoding error (below
# 5.0e-5 for a sum of up to 16 shares except with probability 2^-40 per value,
# secure.ckks_context.SUM_ERROR_BOUND, docs/encryption.md) is below half a step (1.2e-4), so
# rounding removes it, and an encrypted run reproduces a plaintext run with the same seed bit for
# bit.
SHARE_GRID = 2.0**-12


def to_grid(values: np.ndarray) -> np.ndarray:
    """``values`` rounded to the share grid (float64)."""
    return np.round(np.asarray(values, dtype=np.float64) / SHARE_GRID) * SHARE_GRID


#: The largest |value| of a plaintext share: any sum of up to 2^27 shares of at most 2^100 stays
#: below 2^127, finite in float32 (whose largest value is about 2^128).
PLAIN_VALUE_BOUND = 2.0**100


class PlainCodec(EmbeddingCodec):
    """Little-endian float32, row-major, no header: ``rows * cols * 4`` bytes, values on the
    share grid, |values| at most :data:`PLAIN_VALUE_BOUND`."""

    encoding = "float32"

    def value_bound(self, *, shares: int) -> float:
        return PLAIN_VALUE_BOUND

    def encode(self, matrix: np.ndarray) -> bytes:
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        return np.ascontiguousarray(to_grid(matrix), dtype=FLOAT32_LE).tobytes()

    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        return to_grid(decode_float32(payload, rows=rows, cols=cols)).astype(np.float32)


class PlainSumAggregator(SumAggregator):
    encoding = "float32"

    def validate(self, payload: bytes, *, rows: int, cols: int) -> None:
        expected = rows * cols * FLOAT32_LE.itemsize
        if len(payload) != expected:
            raise PayloadError(
                f"float32 body of {len(payload)} bytes does not match shape ({rows}, {cols}):"
                f" expected {expected} bytes"
            )
        values = np.frombuffer(payload, dtype=FLOAT32_LE)
        if not np.isfinite(values).all():
            raise PayloadError("float32 body contains NaN or infinite values")
        if values.size and float(np.abs(values).max()) > PLAIN_VALUE_BOUND:
            raise PayloadError(
                f"float32 body holds values beyond +-{PLAIN_VALUE_BOUND:.3g} (2^100): the sum of"
                " the shares could overflow float32"
            )

    def add(self, payloads: Sequence[bytes], *, rows: int, cols: int) -> bytes:
        if not payloads:
            raise ValueError("nothing to add")
        total = np.zeros((rows, cols), dtype=FLOAT32_LE)
        for payload in payloads:
            total += decode_float32(payload, rows=rows, cols=cols)
        return total.tobytes()


def decode_float32(payload: bytes, *, rows: int, cols: int) -> np.ndarray:
    expected = rows * cols * FLOAT32_LE.itemsize
    if len(payload) != expected:
        raise PayloadError(f"expected {expected} bytes for ({rows}, {cols}), got {len(payload)}")
    return np.frombuffer(payload, dtype=FLOAT32_LE).reshape(rows, cols).astype(np.float32)
