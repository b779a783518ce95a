"""The JSON bodies of a client's pass routes (``/v1/sessions/{id}/clients/{m}/passes/...``);
node sets, shares and sums travel as binary bodies (``secure/protocol.py``)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from secure.wire.common import ResponseModel, StrictModel, Waiting

PassKindOrDone = Literal["train", "eval", "done"]
DoneReason = Literal["finished", "budget-exhausted", "closed"]


class PassInfo(ResponseModel):
    pass_index: int = Field(alias="pass")
    kind: PassKindOrDone
    round: int | None
    output_nodes: list[int] = Field(description="S[L], sorted; empty when kind is 'done'.")
    reason: DoneReason | None = None
    participants: list[int] | None = Field(
        None,
        exclude_if=lambda members: members is None,  # sessions without masks: as before
        description="Masked sessions: the clients every share of this pass is masked over "
        "(each worker checks it includes itself and holds 3 at least). Null without masks, and "
        "while they may still change (a pass after the current one, or one waiting for a "
        "rejoin to have 3): a masked worker asks again.",
    )


class UploadReceipt(ResponseModel):
    pass_index: int = Field(alias="pass")
    layer: int
    client: int
    status: Literal["created", "duplicate"]
    received: list[int]
    missing: list[int]


class RejoinReceipt(ResponseModel):
    pass_index: int = Field(
        alias="pass",
        description="The pass from which this client takes part again (the current one, or the"
        " next if the current one went on without it).",
    )


class WaitingStatus(Waiting):
    """A pass's 202 answer: which clients' node sets or shares of (pass, layer) are in."""

    pass_index: int = Field(alias="pass")
    layer: int
    received: list[int]


class Metrics(StrictModel):
    """What a client reports after a pass, for the status page only. An empty report is
    accepted and ignored."""

    loss: float | None = None
    val_accuracy: float | None = Field(None, ge=0, le=1)
    test_accuracy: float | None = Field(None, ge=0, le=1)
    train_accuracy: float | None = Field(None, ge=0, le=1)

    @field_validator("loss")
    @classmethod
    def _finite(cls, loss: float | None) -> float | None:
        if loss is not None and not math.isfinite(loss):
            raise ValueError("loss must be a finite number")
        return loss

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


#: The longest reason a refusal at join may give
MAX_REFUSAL_REASON = 2000


class ReadinessReport(StrictModel):
    """A worker's answer at join (sessions with ``ready_gate``): it can take part, or it
    refuses the session (its checks failed: its data, its model, its owner's policy), saying
    why in one sentence that the other clients are shown."""

    ready: bool
    reason: str | None = Field(None, min_length=1, max_length=MAX_REFUSAL_REASON)

    @model_validator(mode="after")
    def _refusal_says_why(self) -> ReadinessReport:
        if not self.ready and self.reason is None:
            raise ValueError("a refusal says why (reason)")
        return self


class ReadinessStatus(ResponseModel):
    """Every client of the session said it is ready: the first pass may start."""

    status: Literal["ready"] = "ready"
    ready: list[int]
