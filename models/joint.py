"""A client's share of an aggregation layer, sent in parts (``secure.protocol.part_span``), and
what it gets back: H_{-m}, the others' part of the sum (``models.workset.Extracted``).

Every share, of any pass and layer, travels as ``part_count(rows, cols)`` parts, one after the
other (upload part k, take its sum, then part k + 1), so no body and no encoding grows with the
number of nodes. How a share is released is the :class:`models.release.ReleasePolicy` the
aggregation is built with: a private client's release is one release in all its parts (its
digest covers the whole clean matrix and goes with every part, each part's noise keyed by the
digest and the part). Every part's request carries the digest of its plaintext too (what a
worker's upload journal records).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator

import numpy as np
import torch

from models.node_arrays import host_rows, node_array
from models.release import PassContext, PlainRelease, ReleasePolicy, ReleaseScope
from models.workset import Extracted
from secure.aggregation import EmbeddingCodec, ShareSlot, rows_digest
from secure.protocol import (
    ProtocolViolation,
    Request,
    Response,
    ShareRequest,
    SharesSum,
    part_count,
    part_rows,
    part_span,
    plaintext_digest,
)


class JointAggregation:
    """The exchange of one client's shares and sums with the others (``clients`` in all),
    layer by layer, in parts of at most ``part_values`` values, encoded by ``codec`` and
    released by ``release``."""

    def __init__(
        self,
        codec: EmbeddingCodec,
        release: ReleasePolicy | None = None,
        *,
        clients: int,
        part_values: int | None,
        device: torch.device,
    ) -> None:
        self.codec = codec
        self.release = release or PlainRelease()
        self.clients = clients
        self.part_values = part_values
        self.device = device

    def aggregate(
        self,
        context: PassContext,
        layer: int,
        own: torch.Tensor,
        *,
        rows: np.ndarray,
        presence: torch.Tensor | None = None,
    ) -> Generator[Request, Response, Extracted]:
        """Send this client's share ``own`` of layer ``layer`` (its rows the nodes ``rows``),
        part by part; return H_{-m} = Extract(H, share) = H - share / M, where ``share`` is what
        was actually sent (noise included).

        With ``presence`` (a count-aware session), rows of nodes this client lacks are sent as
        zeros, a last column carries the presence itself, and the sum's last column is the
        number of holders of each row, the divisor of the count-aware mean (Feras)."""
        count_rows, width = own.shape
        clean = host_rows(own, chunk=part_rows(width, self.part_values))
        column = None if presence is None else presence.cpu().numpy().astype(np.float32)
        cols = width + (column is not None)
        scope = ReleaseScope(
            context, layer, rows, part_rows=part_rows(cols, self.part_values), presence=column
        )
        release = self.release.begin(scope, clean)
        others = node_array(count_rows, width, device=torch.device("cpu")).numpy()
        count = np.empty((count_rows, 1), dtype=np.float32)

        def share_of(part: int, start: int, stop: int) -> np.ndarray:
            share = self.within_bound(release.part(part, clean[start:stop]))
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

        yield from self.exchange_parts(
            layer, pass_index=context.pass_index, rows=count_rows, cols=cols, share_of=share_of,
            on_sum=on_sum, release=release.digest, nodes=rows,
        )  # fmt: skip
        if column is None and (count == count[0, 0]).all():
            return Extracted(torch.from_numpy(others).to(self.device), int(count[0, 0]))
        return Extracted(
            torch.from_numpy(others).to(self.device),
            torch.from_numpy(count).to(self.device),
            presence,
        )

    def sum_of(
        self, layer: int, share: np.ndarray, *, pass_index: int, disclosure: bool = False
    ) -> Generator[Request, Response, np.ndarray]:
        """The sum of every client's ``share`` of wire layer ``layer`` (one above the model's
        layers: the broadcast gradient, the shared answer), in its parts."""
        rows, cols = share.shape
        total = np.empty_like(share)

        def on_sum(start: int, stop: int, _: np.ndarray, part: np.ndarray, __: int) -> None:
            total[start:stop] = part

        yield from self.exchange_parts(
            layer, pass_index=pass_index, rows=rows, cols=cols,
            share_of=lambda _, start, stop: share[start:stop], on_sum=on_sum,
            disclosure=disclosure,
        )  # fmt: skip
        return total

    def within_bound(self, share: np.ndarray) -> np.ndarray:
        """``share`` clipped to what keeps the encrypted sum decodable (post-processing)."""
        bound = self.codec.value_bound(shares=self.clients)
        share = share.astype(np.float32, copy=False)
        return np.clip(share, -bound, bound) if math.isfinite(bound) else share

    def exchange_parts(
        self,
        layer: int,
        *,
        pass_index: int,
        rows: int,
        cols: int,
        share_of: Callable[[int, int, int], np.ndarray],
        on_sum: Callable[[int, int, np.ndarray, np.ndarray, int], None],
        release: str | None = None,
        nodes: np.ndarray | None = None,
        disclosure: bool = False,
    ) -> Generator[Request, Response, None]:
        """Send a share of ``rows`` x ``cols`` in its parts (``secure.protocol.part_span``), one
        after the other: ``share_of(part, start, stop)`` makes a part as it is sent, and
        ``on_sum(start, stop, sent, total, count)`` takes its sum, so no more than one part's
        encoding is held at a time. ``nodes``: the node ids of the rows, whose digest goes with
        each part's slot; ``disclosure``: the shares are a scoring session's answer
        (``secure.protocol.ShareRequest.disclosure``)."""
        parts = part_count(rows, cols, self.part_values)
        for part in range(parts):
            start, stop = part_span(part, rows=rows, cols=cols, part_values=self.part_values)
            share = share_of(part, start, stop)
            digest = b"" if nodes is None else rows_digest(nodes[start:stop])
            slot = ShareSlot(pass_index=pass_index, layer=layer, part=part, rows=digest)
            total, shares = yield from self._exchange(
                slot, share, release=release, parts=parts, disclosure=disclosure
            )
            on_sum(start, stop, share, total, shares)

    def _exchange(
        self,
        slot: ShareSlot,
        share: np.ndarray,
        *,
        release: str | None,
        parts: int,
        disclosure: bool = False,
    ) -> Generator[Request, Response, tuple[np.ndarray, int]]:
        """Upload ``share`` (part ``slot.part`` of ``parts`` of wire layer ``slot.layer``);
        return the decoded sum and how many shares it holds: every client's, or (a pass that
        went on without a straggler) the fewest the release policy and the codec take; a masked
        sum exactly the pass's participants'."""
        rows, cols = share.shape
        layer = slot.layer
        answer = yield ShareRequest(
            layer=layer, payload=self.codec.encode(share, slot=slot), rows=rows, cols=cols,
            release=release, part=slot.part, parts=parts,
            plaintext_digest=plaintext_digest(share), disclosure=disclosure,
        )  # fmt: skip
        if not isinstance(answer, SharesSum):
            raise TypeError(f"expected a SharesSum for layer {layer}, got {type(answer).__name__}")
        fewest = max(
            self.release.fewest_shares(self.clients), self.codec.fewest_shares(self.clients)
        )
        most = self.codec.most_shares(self.clients)
        if not fewest <= answer.count <= most:
            raise ProtocolViolation(
                f"layer {layer}: the sum holds {answer.count} shares, expected at most "
                f"{most} and at least {fewest}"
            )
        return self.codec.decode_sum(answer.payload, rows=rows, cols=cols), answer.count
