"""A client's share of an aggregation layer, sent in parts (``secure.protocol.part_span``), and
what it gets back: H_{-m}, the others' part of the sum (``models.workset.Extracted``).

Every share, of any pass and layer, travels as ``part_count(rows, cols)`` parts, one after the
other (upload part k, take its sum, then part k + 1), so no body and no encoding grows with the
number of nodes. A private client's release is one release in all its parts: its digest covers
the whole clean matrix and goes with every part, and each part's noise is keyed by the digest
and the part (``models/private.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator

import numpy as np
import torch

from models.data.partition import ClientPartition
from models.node_arrays import host_rows, node_array
from models.workset import Extracted
from secure.aggregation import EmbeddingCodec
from secure.protocol import (
    MIN_CONTRIBUTORS,
    Aggregate,
    EmbeddingRequest,
    ProtocolViolation,
    Request,
    Response,
    part_count,
    part_rows,
    part_span,
)


class JointAggregation:
    """The joint aggregation of a client (``models.federated.GlasuClient``)."""

    partition: ClientPartition
    codec: EmbeddingCodec
    device: torch.device
    pending_release: str | None

    def _joint_aggregate(
        self, depth: int, own: torch.Tensor, *, presence: torch.Tensor | None = None
    ) -> Generator[Request, Response, Extracted]:
        """Send this client's share of layer ``depth``, part by part; return H_{-m} =
        Extract(H, share) = H - share / M, where ``share`` is what was actually sent (noise
        included).

        With ``presence`` (a count-aware session), rows of nodes this client lacks are sent as
        zeros, a last column carries the presence itself, and the sum's last column is the
        number of holders of each row, the divisor of the count-aware mean (Feras)."""
        rows, width = own.shape
        clean = host_rows(own, chunk=part_rows(width))
        column = None if presence is None else presence.cpu().numpy().astype(np.float32)
        cols = width + (column is not None)
        self._begin_release(depth, clean, part_rows=part_rows(cols), presence=column)
        release = self.pending_release
        others = node_array(rows, width, device=torch.device("cpu")).numpy()
        count = np.empty((rows, 1), dtype=np.float32)

        def share_of(part: int, start: int, stop: int) -> np.ndarray:
            share = self._within_bound(self._release_part(depth, part, clean[start:stop]))
            if column is None:
                return share
            return np.concatenate([share * column[start:stop], column[start:stop]], axis=1)

        def on_sum(
            start: int, stop: int, share: np.ndarray, total: np.ndarray, shares: int
        ) -> None:
            if column is None:
                others[start:stop] = total / shares - share / shares
                count[start:stop] = shares
                return
            # the holder counts are small integers: round away the encryption's error; every
            # node was sampled or is held by a party that holds it, so count >= 1
            held = np.clip(np.rint(total[:, -1:]), 1, shares)
            others[start:stop] = (total[:, :-1] - share[:, :-1]) / held
            count[start:stop] = held

        yield from self._exchange_parts(
            depth, rows=rows, cols=cols, share_of=share_of,
            on_sum=on_sum, release=release,
        )  # fmt: skip
        self.pending_release = None
        if column is None and (count == count[0, 0]).all():
            return Extracted(torch.from_numpy(others).to(self.device), int(count[0, 0]))
        return Extracted(
            torch.from_numpy(others).to(self.device),
            torch.from_numpy(count).to(self.device),
            presence,
        )

    def _begin_release(
        self, depth: int, clean: np.ndarray, *, part_rows: int, presence: np.ndarray | None
    ) -> None:
        """Called with the whole clean share of layer ``depth`` before its first part is sent
        (in parts of ``part_rows`` rows, with the ``presence`` column of a count-aware session):
        a private client sets :attr:`pending_release` (the digest all its parts carry)."""

    def _release_part(self, depth: int, part: int, clean: np.ndarray) -> np.ndarray:
        """Part ``part`` of the share of layer ``depth`` as it is sent (the DP release hook)."""
        return clean

    def _fewest_shares(self) -> int:
        """The fewest shares a sum may hold: ``MIN_CONTRIBUTORS`` (a pass that went on without
        a straggler), or every client's where that matters (a private client's shared noise)."""
        return min(MIN_CONTRIBUTORS, self.partition.clients)

    def _within_bound(self, share: np.ndarray) -> np.ndarray:
        """``share`` clipped to what keeps the encrypted sum decodable (post-processing)."""
        bound = self.codec.value_bound(shares=self.partition.clients)
        share = share.astype(np.float32, copy=False)
        return np.clip(share, -bound, bound) if math.isfinite(bound) else share

    def _exchange_parts(
        self,
        layer: int,
        *,
        rows: int,
        cols: int,
        share_of: Callable[[int, int, int], np.ndarray],
        on_sum: Callable[[int, int, np.ndarray, np.ndarray, int], None],
        release: str | None = None,
    ) -> Generator[Request, Response, None]:
        """Send a share of ``rows`` x ``cols`` in its parts (``secure.protocol.part_span``), one
        after the other: ``share_of(part, start, stop)`` makes a part as it is sent, and
        ``on_sum(start, stop, sent, total, count)`` takes its sum, so no more than one part's
        encoding is held at a time."""
        parts = part_count(rows, cols)
        for part in range(parts):
            start, stop = part_span(part, rows=rows, cols=cols)
            share = share_of(part, start, stop)
            total, shares = yield from self._exchange(
                layer, share, release=release, part=part, parts=parts
            )
            on_sum(start, stop, share, total, shares)

    def _exchange(
        self,
        layer: int,
        share: np.ndarray,
        *,
        release: str | None = None,
        part: int = 0,
        parts: int = 1,
    ) -> Generator[Request, Response, tuple[np.ndarray, int]]:
        """Upload ``share`` (part ``part`` of ``parts`` of wire layer ``layer``); return the
        decoded sum and how many shares it holds: every client's, or (a pass that went on
        without a straggler) ``MIN_CONTRIBUTORS`` at least."""
        rows, cols = share.shape
        answer = yield EmbeddingRequest(
            layer=layer, payload=self.codec.encode(share), rows=rows, cols=cols, release=release,
            part=part, parts=parts,
        )  # fmt: skip
        if not isinstance(answer, Aggregate):
            raise TypeError(f"expected an Aggregate for layer {layer}, got {type(answer).__name__}")
        clients = self.partition.clients
        fewest = self._fewest_shares()
        if not fewest <= answer.count <= clients:
            raise ProtocolViolation(
                f"layer {layer}: the sum holds {answer.count} shares, expected at most "
                f"{clients} and at least {fewest}"
            )
        return self.codec.decode_sum(answer.payload, rows=rows, cols=cols), answer.count
