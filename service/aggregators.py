"""The service's aggregators: which :class:`SumAggregator` adds a session's shares (plaintext
float32, CKKS under the service's public context, or masked BFV shares under the parameters
alone), and loading that public context.

Not to be confused with ``secure/ckks.py``, the CKKS arithmetic itself: this module only chooses
and guards it. Refusals are domain errors (:mod:`service.domain_errors`). ``secure.ckks`` is
imported only when a public context is configured, so a plaintext-only service (and its tests)
does not need TenSEAL.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from secure.aggregation import PlainSumAggregator, RunningSum, SumAggregator
from service.domain_errors import EncryptionUnavailable, InvalidSessionRequest

if TYPE_CHECKING:
    from service.plan import SessionPlan


@dataclass(frozen=True, slots=True)
class PublicContext:
    """The service's CKKS public context: its bytes as the clients fetch them, and their hash."""

    data: bytes
    sha256: str

    @classmethod
    def read(cls, path: Path) -> PublicContext:
        """Read and check the context file (``secure.ckks.load_public_context``); a context
        with a secret key raises ``secure.ckks.KeyMaterialError`` and the service must not
        start."""
        from secure import ckks

        data = path.read_bytes()
        ckks.load_public_context(data)
        return cls(data=data, sha256=hashlib.sha256(data).hexdigest())


class _SerializedAggregator(SumAggregator[Any]):
    """One shared CKKS aggregator; TenSEAL does not document that a context may be used from
    several threads at once, so every call into it (parsing a share, adding it, serializing a
    sum) takes one lock."""

    def __init__(self, inner: SumAggregator[Any]) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.encoding = inner.encoding

    def read_share(self, payload: bytes, *, rows: int, cols: int) -> Any:
        with self._lock:
            return self._inner.read_share(payload, rows=rows, cols=cols)

    def new_sum(self, *, rows: int, cols: int) -> RunningSum[Any]:
        with self._lock:
            return _SerializedSum(self._inner.new_sum(rows=rows, cols=cols), self._lock)


class _SerializedSum(RunningSum[Any]):
    def __init__(self, inner: RunningSum[Any], lock: threading.Lock) -> None:
        self._inner = inner
        self._lock = lock

    @property
    def clients(self) -> frozenset[int]:
        return self._inner.clients

    def add(self, client: int, share: Any) -> None:
        with self._lock:
            self._inner.add(client, share)

    def payload(self) -> bytes:
        with self._lock:
            return self._inner.payload()


class Aggregators:
    """The service's aggregators: one plaintext, one CKKS and one of masked BFV shares (each
    built on first use)."""

    def __init__(self, context: PublicContext | None) -> None:
        self.context = context
        self._plain = PlainSumAggregator()
        self._ckks: SumAggregator[Any] | None = None
        self._masked: SumAggregator[Any] | None = None
        self._lock = threading.Lock()

    def require_ckks(self) -> PublicContext:
        if self.context is None:
            raise EncryptionUnavailable.no_context()
        return self.context

    def check_ckks_session(self, clients: int) -> PublicContext:
        """The context a new ckks session will use; refuses more shares than CKKS is sized for."""
        context = self.require_ckks()
        from secure import ckks

        if clients > ckks.MAX_SHARES:
            raise InvalidSessionRequest(
                f"clients: encryption 'ckks' supports at most {ckks.MAX_SHARES} clients (the CKKS"
                f" parameters bound the sum of that many shares), got {clients}",
            )
        return context

    def for_session(self, plan: SessionPlan) -> SumAggregator[Any]:
        """The aggregator of a session's embeddings."""
        return self.for_encoding(plan.encoding, context_sha256=plan.public_context_sha256)

    def check_masked_session(self, clients: int) -> None:
        """Refuses more shares than BFV is sized for; a masked session needs no key here."""
        from secure import ckks

        if clients > ckks.MAX_SHARES:
            raise InvalidSessionRequest(
                f"clients: secure aggregation 'masks' supports at most {ckks.MAX_SHARES} clients"
                f" (the BFV parameters' noise budget is sized for that many shares), got {clients}",
            )

    def for_encoding(self, encoding: str, *, context_sha256: str | None) -> SumAggregator[Any]:
        if encoding == "float32":
            return self._plain
        if encoding == "bfv-masked":
            with self._lock:
                if self._masked is None:
                    from secure.masking.codec import BfvSumAggregator

                    self._masked = _SerializedAggregator(BfvSumAggregator())
                return self._masked
        context = self.require_ckks()
        if context_sha256 != context.sha256:
            raise EncryptionUnavailable.other_context()
        with self._lock:
            if self._ckks is None:
                from secure import ckks

                self._ckks = _SerializedAggregator(ckks.make_sum_aggregator("ckks", context.data))
            return self._ckks
