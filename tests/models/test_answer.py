"""One answer per customer (models/answer.py), in process: the answering party's prediction is
the model's; where a scoring pass shares it, every partner gets exactly that answer (its
predicted class exactly, its probabilities to the share grid), never its own head's; and a sum
that holds no answer is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from models.answer import Answer, decode_answer, encode_answer
from models.config import TrainConfig
from models.federated import GlasuClient
from models.inprocess import score_inprocess
from models.layout import client_config, layout_federation
from secure.aggregation import SHARE_GRID, PlainSumAggregator
from secure.protocol import ProtocolViolation

CONFIG = TrainConfig(
    clients=3, hidden=16, encryption="none", dp=False, seed=0, device="cpu", label_holder=1
)
SCORED = np.arange(0, 400, 7)


def _clients(cora, *, shared: bool) -> list[GlasuClient]:
    layout = layout_federation(CONFIG, cora)
    settings = client_config(CONFIG)
    if shared:
        settings = dataclasses.replace(settings, shared_answer_width=CONFIG.hidden)
    return [GlasuClient(part, settings) for part in layout.partitions]


def test_only_the_label_holder_answers_unless_the_pass_shares_its_answer(cora) -> None:
    torch.set_num_threads(1)
    _, kept = score_inprocess(_clients(cora, shared=False), PlainSumAggregator(), nodes=SCORED)
    holder = kept[1].answer
    assert holder is not None and kept[0].answer is None and kept[2].answer is None
    np.testing.assert_array_equal(holder.probabilities, kept[1].probabilities)

    _, shared = score_inprocess(_clients(cora, shared=True), PlainSumAggregator(), nodes=SCORED)
    answer = shared[1].answer
    assert answer is not None
    np.testing.assert_array_equal(answer.probabilities, holder.probabilities)
    for partner in (shared[0], shared[2]):
        assert partner.answer is not None
        np.testing.assert_array_equal(partner.answer.predicted, answer.predicted)
        np.testing.assert_allclose(
            partner.answer.probabilities, answer.probabilities, rtol=0, atol=SHARE_GRID / 2
        )


def test_the_answer_keeps_its_class_exactly_and_a_sum_without_one_is_refused() -> None:
    probabilities = np.array([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    answer = Answer(probabilities, np.array([1, 2]))  # a tie broken as the holder broke it
    decoded = decode_answer(encode_answer(answer, rows=2, width=8))
    assert decoded.predicted.tolist() == [1, 2]
    assert decoded.probabilities.argmax(axis=1).tolist() == [1, 2]  # read as the holder read it
    with pytest.raises(ValueError, match="needs 5 columns"):
        encode_answer(answer, rows=2, width=4)
    with pytest.raises(ProtocolViolation, match="classes"):
        decode_answer(encode_answer(None, rows=2, width=8))  # zeros only: no answer in it
    lying = encode_answer(answer, rows=2, width=8)
    lying[0, 3] = 9  # a predicted class out of range
    with pytest.raises(ProtocolViolation, match="out of range"):
        decode_answer(lying)
