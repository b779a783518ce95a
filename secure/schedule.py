"""The release schedule of a session: which joint inferences happen, in which order, on which nodes.

Both the aggregation service and the in-process trainer call these functions, so an HTTP run and an
in-process run see the same passes and the same output batches. The schedule lives in ``secure``
because the privacy ledger is defined over it: every pass is one release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

PassKind = Literal["train", "eval"]


@dataclass(frozen=True, slots=True)
class PassSpec:
    """One joint inference: a training round or an evaluation pass."""

    index: int
    kind: PassKind
    round: int  # the training round this pass belongs to (1-based); eval passes follow their round


def pass_schedule(*, rounds: int, eval_every: int) -> list[PassSpec]:
    """Training rounds 1..rounds, with an evaluation pass after every ``eval_every``-th round and
    after the last one. ``eval_every=0`` evaluates only once, at the end."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0, got {eval_every}")
    passes: list[PassSpec] = []
    for r in range(1, rounds + 1):
        passes.append(PassSpec(index=len(passes), kind="train", round=r))
        if r == rounds or (eval_every and r % eval_every == 0):
            passes.append(PassSpec(index=len(passes), kind="eval", round=r))
    return passes


#: The session kinds planned as ONE evaluation pass (:meth:`SessionSchedule.scoring_passes`):
#: scoring, and the private sign design's release (its training is local, with no pass)
ONE_PASS_KINDS = ("scoring", "release")


def passes_total(*, scoring: bool, rounds: int, eval_every: int) -> int:
    """How many passes a session has: a session of :data:`ONE_PASS_KINDS` one evaluation pass
    (:meth:`SessionSchedule.scoring_passes`), a training session its :func:`pass_schedule`."""
    return 1 if scoring else len(pass_schedule(rounds=rounds, eval_every=eval_every))


def draw_output_batch(
    train_nodes: Sequence[int] | np.ndarray, *, batch_size: int, seed: int, pass_index: int
) -> np.ndarray:
    """S[L] of a training pass: ``batch_size`` distinct training nodes drawn uniformly without
    replacement from a generator seeded by (seed, pass_index), returned sorted (int64)."""
    pool = np.asarray(train_nodes, dtype=np.int64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if pool.size == 0:
        raise ValueError("no training nodes to draw a batch from")
    rng = np.random.default_rng([seed, pass_index])
    take = min(batch_size, pool.size)
    return np.sort(rng.choice(pool, size=take, replace=False))


@dataclass(frozen=True)
class SessionSchedule:
    """A session's passes and the output nodes of each: training batches drawn from
    ``train_nodes``, evaluation passes over ``eval_nodes``. The service and the in-process
    trainer both ask this object, so they agree pass by pass."""

    passes: tuple[PassSpec, ...]
    train_nodes: np.ndarray  # int64, in the caller's order (the draw depends on it)
    eval_nodes: np.ndarray  # sorted int64
    batch_size: int
    seed: int

    @classmethod
    def scoring_passes(
        cls, *, score_nodes: Sequence[int] | np.ndarray, seed: int
    ) -> SessionSchedule:
        """A scoring session's schedule: ONE evaluation pass over all the sorted nodes (one
        release). An evaluation pass is computed layer by layer over all nodes, its shares
        travel in parts (``secure.protocol.part_span``), so no request grows with the number of
        nodes scored."""
        nodes = np.sort(np.asarray(score_nodes, dtype=np.int64))
        if nodes.size == 0:
            raise ValueError("no nodes to score")
        return cls(
            passes=(PassSpec(index=0, kind="eval", round=0),),
            train_nodes=np.empty(0, dtype=np.int64),
            eval_nodes=nodes,
            batch_size=1,  # no training batches
            seed=seed,
        )

    @classmethod
    def create(
        cls,
        *,
        rounds: int,
        eval_every: int,
        train_nodes: Sequence[int] | np.ndarray,
        eval_nodes: Sequence[int] | np.ndarray,
        batch_size: int,
        seed: int,
    ) -> SessionSchedule:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return cls(
            passes=tuple(pass_schedule(rounds=rounds, eval_every=eval_every)),
            train_nodes=np.asarray(train_nodes, dtype=np.int64),
            eval_nodes=np.sort(np.asarray(eval_nodes, dtype=np.int64)),
            batch_size=batch_size,
            seed=seed,
        )

    @property
    def passes_total(self) -> int:
        return len(self.passes)

    def output_nodes(self, pass_index: int) -> np.ndarray:
        """S[L] of the pass: sorted int64."""
        if self.passes[pass_index].kind == "eval":
            return self.eval_nodes
        return draw_output_batch(
            self.train_nodes, batch_size=self.batch_size, seed=self.seed, pass_index=pass_index
        )

    def output_rows(self, pass_index: int) -> int:
        """``len(output_nodes(pass_index))`` without drawing the batch."""
        if self.passes[pass_index].kind == "eval":
            return int(self.eval_nodes.size)
        return min(self.batch_size, int(self.train_nodes.size))
