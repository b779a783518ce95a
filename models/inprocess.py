"""The in-process transport: all clients in one process, their requests answered by function calls
through the same aggregation interface the service uses: a node set's union (training passes
only: an evaluation pass exchanges none), and the sum of one part of a layer's shares."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TypeVar

import numpy as np

from models.federated import GlasuClient
from models.outcome import PassOutcome
from secure.aggregation import SumAggregator
from secure.protocol import (
    NodesRequest,
    Request,
    Response,
    ShareRequest,
    SharesSum,
    sorted_union,
)
from secure.schedule import SessionSchedule

Result = TypeVar("Result")


def run_pass_inprocess(
    clients: Sequence[GlasuClient],
    aggregator: SumAggregator,
    *,
    pass_index: int,
    kind: str,
    output_nodes: np.ndarray,
) -> list[PassOutcome]:
    """Drive every client's pass in lock-step (:func:`answer_in_step`)."""
    passes = [
        client.run_pass(pass_index=pass_index, kind=kind, output_nodes=output_nodes)
        for client in clients
    ]
    return answer_in_step(passes, aggregator, node_sets=kind != "eval")


def answer_in_step(
    steps: Sequence[Generator[Request, Response, Result]],
    aggregator: SumAggregator,
    *,
    node_sets: bool = True,
) -> list[Result]:
    """Drive every client's generator (a pass, or its sampling walk) in lock-step: all clients
    make the same request at the same time (same layer), so each is answered once all have
    asked; their results in order. ``node_sets=False``: a node-set request is out of step (an
    evaluation pass exchanges none)."""
    results: list[Result | None] = [None] * len(steps)
    requests: list[Request | None] = [_advance(g, None, results, i) for i, g in enumerate(steps)]
    while any(r is not None for r in requests):
        if any(r is None for r in requests):
            raise RuntimeError("clients went out of step: some finished while others still ask")
        if not node_sets and any(isinstance(r, NodesRequest) for r in requests):
            raise RuntimeError("an evaluation pass exchanges no node set")
        answer = _answer(requests, aggregator)  # type: ignore[arg-type]
        requests = [_advance(g, answer, results, i) for i, g in enumerate(steps)]
    return [r for r in results if r is not None]


def _advance(
    generator: Generator[Request, Response, Result],
    answer: Response | None,
    results: list[Result | None],
    index: int,
) -> Request | None:
    try:
        return next(generator) if answer is None else generator.send(answer)
    except StopIteration as finished:
        results[index] = finished.value
        return None


def _answer(requests: Sequence[Request], aggregator: SumAggregator) -> Response:
    asked = {(type(r), r.layer, getattr(r, "part", 0), getattr(r, "parts", 1)) for r in requests}
    if len(asked) != 1:  # the same layer and, of a share, the same part
        raise RuntimeError(f"clients went out of step: {requests}")
    first = requests[0]
    if isinstance(first, NodesRequest):
        return sorted_union([r.nodes for r in requests])  # type: ignore[union-attr]
    assert isinstance(first, ShareRequest)
    shares = [r.payload for r in requests]  # type: ignore[union-attr]
    total = aggregator.add(shares, rows=first.rows, cols=first.cols)  # validates each share once
    return SharesSum(payload=total, count=len(shares))


def score_inprocess(
    clients: Sequence[GlasuClient],
    aggregator: SumAggregator,
    *,
    nodes: np.ndarray,
) -> tuple[np.ndarray, list[PassOutcome]]:
    """A scoring session in this process: the schedule of the service's scoring sessions
    (``secure.schedule.SessionSchedule.scoring_passes``, one evaluation pass); the scored
    nodes (sorted) and every client's outcome (its class probabilities where it has a head)."""
    schedule = SessionSchedule.scoring_passes(score_nodes=nodes, seed=0)
    [spec] = schedule.passes
    output_nodes = schedule.output_nodes(spec.index)
    outcomes = run_pass_inprocess(
        clients, aggregator, pass_index=spec.index, kind="eval", output_nodes=output_nodes
    )
    return output_nodes, outcomes
