"""One answer per customer: the answering party's prediction is the model's
(``secure.protocol.answering_party``). In a scoring session that shares it
(``share_predictions: label-holder``) the answering party sends it to its partners as a sum
through the service at wire layer L + 1, to which the others add zeros, encrypted like every
share. A row of that share holds the class probabilities, then the predicted class, and in its
last column the number of classes: the two small integers are read exactly after rounding (as
the count-aware mean reads its counts), so a partner's predicted class is the answering party's
even where the encrypted sum's decoding moves the probabilities a little."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from secure.protocol import ProtocolViolation, Request, Response

if TYPE_CHECKING:  # models.joint needs torch; this module's readers of answers do not
    from models.joint import JointAggregation

#: How far a shared answer's predicted class is put above a near tie the share grid turned
TIE_MARGIN = 1e-9


@dataclass(frozen=True)
class Answer:
    """The model's answer for a pass's output nodes: class probabilities and predicted class."""

    probabilities: np.ndarray  # (rows, classes)
    predicted: np.ndarray  # int64 (rows,)

    @classmethod
    def of(cls, probabilities: np.ndarray) -> Answer:
        return cls(probabilities, probabilities.argmax(axis=1).astype(np.int64))


def answer_columns(classes: int) -> int:
    """The columns an answer of ``classes`` classes needs in the shared layer."""
    return classes + 2


def encode_answer(answer: Answer | None, *, rows: int, width: int) -> np.ndarray:
    """The share of the answer layer: the answer (the answering party), or zeros (a partner)."""
    share = np.zeros((rows, width), dtype=np.float32)
    if answer is None:
        return share
    classes = answer.probabilities.shape[1]
    if answer_columns(classes) > width:
        raise ValueError(
            f"an answer of {classes} classes needs {answer_columns(classes)} columns, the "
            f"session's answer layer has {width}"
        )
    share[:, :classes] = answer.probabilities
    share[:, classes] = answer.predicted
    share[:, -1] = classes
    return share


def decode_answer(total: np.ndarray) -> Answer:
    """The answer from the sum of the shares (the answering party's share plus zeros);
    :class:`ProtocolViolation` for a sum that holds no answer."""
    classes = int(np.rint(total[:, -1]).max()) if len(total) else 0
    if not 0 < classes <= total.shape[1] - 2:
        raise ProtocolViolation(
            f"the shared answer names {classes} classes in {total.shape[1]} columns"
        )
    probabilities = np.clip(total[:, :classes].astype(np.float64), 0.0, 1.0)
    predicted = np.rint(total[:, classes]).astype(np.int64)
    if (predicted < 0).any() or (predicted >= classes).any():
        raise ProtocolViolation("the shared answer holds a predicted class out of range")
    # a near tie the grid turned (the classes within 2^-12): the answering party's class wins,
    # by a margin far below what the probabilities can tell, so the most probable class read
    # from them is its predicted one
    turned = np.flatnonzero(probabilities.argmax(axis=1) != predicted)
    probabilities[turned, predicted[turned]] = probabilities[turned].max(axis=1) + TIE_MARGIN
    return Answer(probabilities, predicted)


def share_answer(
    joint: JointAggregation,
    answer: Answer | None,
    *,
    layer: int,
    pass_index: int,
    rows: int,
    width: int,
) -> Generator[Request, Response, Answer]:
    """A scoring session that shares the answer: the answering party sends its ``answer`` as a
    sum at wire ``layer`` (L + 1, ``width`` columns), every other client (``answer`` None)
    zeros; each gets the answering party's. Its parts are disclosures
    (``secure.protocol.ShareRequest.disclosure``), which the answering party's worker counts in
    its owner's ledger before each leaves."""
    share = joint.within_bound(encode_answer(answer, rows=rows, width=width))
    total = yield from joint.sum_of(layer, share, pass_index=pass_index, disclosure=True)
    return answer if answer is not None else decode_answer(total)
