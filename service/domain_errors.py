"""What can go wrong in a session, in the service's own terms, without HTTP.

The rule: the code that decides (the round engine, session management, payload and header
parsing, the choice of aggregator) raises a :class:`DomainError`; only the HTTP layer
(``service/api/``, ``service/limits.py``, ``service/app.py``) raises
:class:`service.errors.ProblemError` directly, for what only HTTP knows (bearer tokens, media
types, body sizes, the database behind ``/healthz``). ``service.errors.DOMAIN_PROBLEMS`` pairs
each class below with its HTTP status and problem slug, and the app's one handler renders them.

Each error carries the values its message names; ``str(error)`` (also ``error.detail``) is the
complete explanation a client is shown. Where one kind has several messages, classmethods (or
a ``reason``) name them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

from secure.wire.headers import SHAPE_HEADER


class DomainError(Exception):
    """Base class; ``detail`` is the message for the caller."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# Sessions


class SessionNotFound(DomainError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session with id {session_id!r}")
        self.session_id = session_id


class SessionClosed(DomainError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} has been closed")
        self.session_id = session_id


class SessionRefused(DomainError):
    """A client refused the session at join (``ready_gate``): the service closed it."""

    def __init__(self, session_id: str, client: int, reason: str) -> None:
        self.session_id, self.client, self.reason = session_id, client, reason
        super().__init__(
            f"session {session_id!r} was closed before its first pass: client {client} "
            f"refused it ({reason})"
        )


class ClientsNotReady(DomainError):
    """An upload to a session with ``ready_gate`` before every client said it is ready."""

    def __init__(self, session_id: str, missing: list[int]) -> None:
        super().__init__(
            f"session {session_id!r}: clients {missing} have not said they are ready (PUT "
            ".../readiness); no share is accepted before every client did"
        )
        self.session_id = session_id
        self.missing = missing


class BudgetExhausted(DomainError):
    """The release of ``pass_index`` would exceed the session's privacy budget."""

    def __init__(self, session_id: str, pass_index: int) -> None:
        super().__init__(
            f"session {session_id!r}: the release of pass {pass_index} would exceed the session's"
            " privacy budget; the session stops here (see GET /v1/sessions/{sid}/privacy)"
        )
        self.session_id = session_id
        self.pass_index = pass_index


class MetricsRefused(DomainError):
    """Metrics posted in a session with differential privacy: a loss or an accuracy computed on
    clean features would be a release the privacy ledger does not count."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} runs with differential privacy, so it takes no metrics: a"
            " loss or an accuracy computed on clean features would be a release the privacy"
            " ledger does not count (docs/privacy.md section 9); keep them in the worker's own"
            " results"
        )
        self.session_id = session_id


class InvalidSessionRequest(DomainError):
    """A session configuration the service cannot run (beyond what the schema checks)."""


class EncryptionUnavailable(DomainError):
    """A CKKS session without the right public context loaded."""

    @classmethod
    def no_context(cls) -> EncryptionUnavailable:
        return cls(
            "this service has no CKKS public context (GLASU_PUBLIC_CONTEXT), so it cannot"
            " run sessions with encryption 'ckks'; use encryption 'none' only for testing"
        )

    @classmethod
    def other_context(cls) -> EncryptionUnavailable:
        return cls(
            "the session was created under a different CKKS public context than the one"
            " this service has loaded now; restart the service with the session's context"
        )


# Passes and layers


class UnknownPass(DomainError):
    """A pass index outside the session's schedule."""

    def __init__(self, detail: str, *, pass_index: int, passes_total: int) -> None:
        super().__init__(detail)
        self.pass_index = pass_index
        self.passes_total = passes_total

    @classmethod
    def not_in_schedule(cls, pass_index: int, passes_total: int) -> UnknownPass:
        return cls(
            f"pass {pass_index} is not in this session's schedule (passes 0..{passes_total - 1})",
            pass_index=pass_index,
            passes_total=passes_total,
        )

    @classmethod
    def past_end(cls, pass_index: int, passes_total: int) -> UnknownPass:
        return cls(
            f"pass {pass_index} is past the end of the schedule ({passes_total} passes;"
            f" pass {passes_total} means 'done')",
            pass_index=pass_index,
            passes_total=passes_total,
        )


WrongPassReason = Literal[
    "session-finished",
    "not-current",
    "not-started",
    "metrics-too-early",
    "too-old",
    "discarded",
    "voided",
]


class WrongPass(DomainError):
    """A pass of the schedule that the service is not on (or no longer keeps), for a reason."""

    MESSAGES: ClassVar[dict[str, str]] = {
        "session-finished": "the session has finished all its passes",
        "not-current": "uploads go to the current pass {current_pass}, not pass {pass_index}",
        "not-started": "pass {pass_index} has not started; the current pass is {current_pass}",
        "metrics-too-early": "pass {pass_index} has not started (current pass {current_pass})",
        "too-old": "the payloads of pass {pass_index} were discarded: the service keeps the"
        " current pass ({current_pass}) and the previous one",
        "discarded": "the payloads of pass {pass_index} have been discarded",
        "voided": "pass {pass_index} went on without a sum: a participant's masked share did not"
        " arrive within the session's straggler_wait_seconds, and the masks cancel only in the"
        " sum of every participant's; go on with the current pass {current_pass}",
    }

    def __init__(self, reason: WrongPassReason, pass_index: int, current_pass: int) -> None:
        super().__init__(
            self.MESSAGES[reason].format(pass_index=pass_index, current_pass=current_pass)
        )
        self.reason = reason
        self.pass_index = pass_index
        self.current_pass = current_pass


class WrongLayer(DomainError):
    """A layer where the requested exchange does not happen."""

    def __init__(self, detail: str, *, layer: int) -> None:
        super().__init__(detail)
        self.layer = layer

    @classmethod
    def not_aggregation(cls, layer: int, aggregation_layers: Iterable[int]) -> WrongLayer:
        return cls(
            f"layer {layer} is not an aggregation layer of this session"
            f" (aggregation layers: {sorted(aggregation_layers)})",
            layer=layer,
        )

    @classmethod
    def gradient_on_evaluation(cls, layer: int, pass_index: int) -> WrongLayer:
        return cls(
            f"layer {layer} carries the label holder's gradient, sent in training passes only;"
            f" pass {pass_index} is an evaluation pass",
            layer=layer,
        )

    @classmethod
    def nodes_in_evaluation(cls, layer: int, pass_index: int) -> WrongLayer:
        return cls(
            f"pass {pass_index} is an evaluation pass: it exchanges no node sets (layer"
            f" {layer}); every layer's rows are all num_nodes aligned nodes, in id order",
            layer=layer,
        )

    @classmethod
    def top_layer(cls, layer: int) -> WrongLayer:
        return cls(
            f"layer {layer} is the top layer: its rows are the pass's output nodes, so node"
            " sets are exchanged only for aggregation layers below it",
            layer=layer,
        )


class NotReady(DomainError):
    """An upload that needs a result the other clients have not completed yet."""

    def __init__(self, detail: str, *, pass_index: int, layer: int) -> None:
        super().__init__(detail)
        self.pass_index = pass_index
        self.layer = layer

    @classmethod
    def lower_sum(cls, pass_index: int, lower_layer: int) -> NotReady:
        return cls(
            f"the sum of layer {lower_layer} of pass {pass_index} is not complete yet;"
            " embeddings go up the aggregation layers in ascending order",
            pass_index=pass_index,
            layer=lower_layer,
        )

    @classmethod
    def union(cls, pass_index: int, layer: int, missing: list[int]) -> NotReady:
        return cls(
            f"the node union of pass {pass_index} layer {layer} is not complete (missing node"
            f" sets from clients {missing}); its rows are the union",
            pass_index=pass_index,
            layer=layer,
        )


class Excluded(DomainError):
    """Straggler policy "continue": the pass went on without this client."""

    def __init__(self, client: int, pass_index: int, layer: int, kind: str) -> None:
        super().__init__(
            f"pass {pass_index} went on without client {client}: its layer {layer} {kind}"
            " were aggregated over the clients that arrived within the session's"
            " straggler_wait_seconds (stragglers 'continue'); this client rejoins at the next pass"
        )
        self.client = client
        self.pass_index = pass_index
        self.layer = layer


class Conflict(DomainError):
    """A client's upload slot already holds a different body."""

    def __init__(self, client: int, kind: str, pass_index: int, layer: int) -> None:
        super().__init__(
            f"client {client} already uploaded a different {kind} body for pass"
            f" {pass_index} layer {layer}; a slot is written once"
        )
        self.client = client
        self.kind = kind
        self.pass_index = pass_index
        self.layer = layer


# Payloads and their headers


class BadHeader(DomainError):
    """A missing or malformed X-Glasu-Shape / X-Glasu-Encoding header."""


class BadPayload(DomainError):
    """A body that does not decode as its headers say."""


class WrongShape(DomainError):
    """A body whose declared shape does not fit its slot."""

    @classmethod
    def node_set_too_large(cls, declared: int, num_nodes: int) -> WrongShape:
        return cls(
            f"a node set has at most num_nodes={num_nodes} distinct ids,"
            f" {SHAPE_HEADER} says {declared}"
        )

    @classmethod
    def embedding(
        cls,
        pass_index: int,
        layer: int,
        *,
        expected: tuple[int, int],
        declared: tuple[int, int],
        rows_are: str,
    ) -> WrongShape:
        rows, cols = expected
        return cls(
            f"pass {pass_index} layer {layer} expects shape {rows},{cols}"
            f" ({rows} rows: {rows_are}; {cols} columns: the layer's width),"
            f" {SHAPE_HEADER} says {declared[0]},{declared[1]}"
        )


class WrongPart(DomainError):
    """A share's or a sum's part that does not fit its layer (``secure.protocol.part_span``)."""

    @classmethod
    def count(cls, pass_index: int, layer: int, *, expected: int, declared: int) -> WrongPart:
        return cls(
            f"pass {pass_index} layer {layer} travels in {expected} part(s) (its rows in parts"
            f" of part_rows(cols) rows, see docs/protocol.md), the upload says parts={declared}"
        )

    @classmethod
    def out_of_range(cls, pass_index: int, layer: int, *, part: int, parts: int) -> WrongPart:
        return cls(f"pass {pass_index} layer {layer} has parts 0..{parts - 1}, not part {part}")


class WrongEncoding(DomainError):
    def __init__(self, expected: str, declared: str) -> None:
        super().__init__(
            f"this session's embeddings are {expected!r}, the upload says {declared!r}"
        )
        self.expected = expected
        self.declared = declared


# Alignments (service/alignment/)


class AlignmentNotFound(DomainError):
    def __init__(self, alignment_id: str) -> None:
        super().__init__(f"no alignment with id {alignment_id!r}")
        self.alignment_id = alignment_id


class AlignmentSlotForbidden(DomainError):
    """A party posting or fetching a set that the ring assigns to another party."""


class AlignmentNotReady(DomainError):
    """A set posted before the set it blinds further is in."""


class AlignmentConflict(DomainError):
    """A set slot already holds a different body."""
