"""The one aggregation interface: clients encode their share, the service sums shares it may not
be able to read, clients decode the sum and divide by the count.

The in-process trainer and the HTTP service use the same classes, so both transports run the same
arithmetic. The service only ever needs a :class:`SumAggregator`, which validates each share once
and adds it into a :class:`RunningSum` as it arrives; clients own an :class:`EmbeddingCodec`.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from secure.protocol import FLOAT32_LE

S = TypeVar("S")  # a share as an aggregator parsed it (a float32 matrix, CKKS vectors)


class PayloadError(ValueError):
    """An uploaded payload that does not fit the slot it was sent to (shape, size, encoding)."""


@dataclass(frozen=True)
class ShareSlot:
    """Where a share goes in its session: part ``part`` of wire layer ``layer`` in pass
    ``pass_index``, its rows the nodes of digest ``rows`` (:func:`rows_digest`; empty where the
    rows are not node ids). A codec that masks shares (``secure.masking.codec``) draws a mask
    per slot; the others ignore it."""

    pass_index: int
    layer: int
    part: int
    rows: bytes = b""


def rows_digest(nodes: np.ndarray) -> bytes:
    """SHA-256 of node ids (as little-endian int64): what every party's share of a part has
    alike, so that a masked slot asked for again with other rows gets other masks."""
    return hashlib.sha256(np.ascontiguousarray(nodes, dtype="<i8").tobytes()).digest()


class EmbeddingCodec(ABC):
    """Client side: turns a (rows x cols) float matrix into bytes for the service and a summed
    payload back into a float matrix."""

    encoding: str

    @abstractmethod
    def encode(self, matrix: np.ndarray, *, slot: ShareSlot | None = None) -> bytes: ...

    @abstractmethod
    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray: ...

    def value_bound(self, *, shares: int) -> float:
        """The largest |value| a share may hold so that a sum of ``shares`` decodes."""
        return math.inf

    def fewest_shares(self, clients: int) -> int:
        """The fewest of ``clients`` shares a sum must hold to decode: any number (masked
        shares decode only in the sum of the pass's participants)."""
        return 1

    def most_shares(self, clients: int) -> int:
        """The most of ``clients`` shares a sum may hold: all of them (masked shares: exactly
        the pass's participants)."""
        return clients

    def begin_pass(self, pass_index: int, participants: Sequence[int] | None) -> None:
        """Pass ``pass_index`` begins over the ``participants`` the service stated (None: it
        stated none). Codecs that do not mask ignore it."""
        del pass_index, participants

    def for_split_noise(self, *, clip: float, noise_std: float) -> EmbeddingCodec:
        """The codec for shares of rows clipped to ``clip`` plus a party's split noise of std
        ``noise_std`` (docs/privacy.md section 11.2): this one, which bounds them as any
        share; the masked codec wraps them modulo t instead."""
        return self


class RunningSum(ABC, Generic[S]):
    """A sum formed share by share as the shares arrive, each client's share at most once."""

    @property
    @abstractmethod
    def clients(self) -> frozenset[int]:
        """The clients whose share is in the sum."""

    @abstractmethod
    def add(self, client: int, share: S) -> None:
        """Add ``client``'s share (from :meth:`SumAggregator.read_share`); ValueError if that
        client's share is already in, or for more shares than the encoding can sum."""

    @abstractmethod
    def payload(self) -> bytes:
        """The sum so far, in the session's encoding, as if the shares had been added in client
        order 0..M-1."""


class SumAggregator(ABC, Generic[S]):
    """Service side: validates shares and adds them without needing to read them. A share is
    validated and parsed once (:meth:`read_share`) and then added into a :class:`RunningSum`."""

    encoding: str

    @abstractmethod
    def read_share(self, payload: bytes, *, rows: int, cols: int) -> S:
        """The share parsed for adding; :class:`PayloadError` with a message saying what is
        wrong."""

    @abstractmethod
    def new_sum(self, *, rows: int, cols: int) -> RunningSum[S]:
        """An empty sum of (rows x cols) shares."""

    def validate(self, payload: bytes, *, rows: int, cols: int) -> None:
        """Raise :class:`PayloadError` with a message saying what is wrong."""
        self.read_share(payload, rows=rows, cols=cols)

    def add(self, payloads: Sequence[bytes], *, rows: int, cols: int) -> bytes:
        """The sum of the shares, in the same encoding, in the order given."""
        if not payloads:
            raise ValueError("nothing to add")
        total = self.new_sum(rows=rows, cols=cols)
        for index, payload in enumerate(payloads):
            try:
                share = self.read_share(payload, rows=rows, cols=cols)
            except PayloadError as error:
                raise PayloadError(f"share {index}: {error}") from None
            total.add(index, share)
        return total.payload()


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

    def encode(self, matrix: np.ndarray, *, slot: ShareSlot | None = None) -> bytes:
        if matrix.ndim != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {matrix.shape}")
        return np.ascontiguousarray(to_grid(matrix), dtype=FLOAT32_LE).tobytes()

    def decode_sum(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        return to_grid(decode_float32(payload, rows=rows, cols=cols)).astype(np.float32)


class PlainSumAggregator(SumAggregator[np.ndarray]):
    encoding = "float32"

    def read_share(self, payload: bytes, *, rows: int, cols: int) -> np.ndarray:
        expected = rows * cols * FLOAT32_LE.itemsize
        if len(payload) != expected:
            raise PayloadError(
                f"float32 body of {len(payload)} bytes does not match shape ({rows}, {cols}):"
                f" expected {expected} bytes"
            )
        share = decode_float32(payload, rows=rows, cols=cols)
        if not np.isfinite(share).all():
            raise PayloadError("float32 body contains NaN or infinite values")
        if share.size and float(np.abs(share).max()) > PLAIN_VALUE_BOUND:
            raise PayloadError(
                f"float32 body holds values beyond +-{PLAIN_VALUE_BOUND:.3g} (2^100): the sum of"
                " the shares could overflow float32"
            )
        return share

    def new_sum(self, *, rows: int, cols: int) -> RunningSum[np.ndarray]:
        return PlainRunningSum(rows=rows, cols=cols)


class PlainRunningSum(RunningSum[np.ndarray]):
    """Keeps the shares and adds them in client order when the sum is asked for: float32
    addition is not associative, and plaintext runs must match in-process runs bit for bit."""

    def __init__(self, *, rows: int, cols: int) -> None:
        self._shape = (rows, cols)
        self._shares: dict[int, np.ndarray] = {}

    @property
    def clients(self) -> frozenset[int]:
        return frozenset(self._shares)

    def add(self, client: int, share: np.ndarray) -> None:
        if client in self._shares:
            raise ValueError(f"the share of client {client} is already in the sum")
        if share.shape != self._shape:
            raise ValueError(f"share of shape {share.shape} added to a sum of {self._shape}")
        self._shares[client] = share

    def payload(self) -> bytes:
        total = np.zeros(self._shape, dtype=FLOAT32_LE)
        for client in sorted(self._shares):
            total += self._shares[client]
        return total.tobytes()


def decode_float32(payload: bytes, *, rows: int, cols: int) -> np.ndarray:
    expected = rows * cols * FLOAT32_LE.itemsize
    if len(payload) != expected:
        raise PayloadError(f"expected {expected} bytes for ({rows}, {cols}), got {len(payload)}")
    return np.frombuffer(payload, dtype=FLOAT32_LE).reshape(rows, cols).astype(np.float32)
