"""Summing a layer's shares as they arrive, part by part, recording the pass's release in the
privacy ledger, and advancing the session to the next pass.

A layer's shares travel in parts (``secure.protocol.part_span``) and each part is a slot of its
own: its sum is formed and stored as soon as every expected client's part is in, so the service
never holds more of a layer than the parts in flight. Each share's part is validated and parsed
once, when it is uploaded, and added into the running sum of its (pass, layer, part) under the
slot's lock, together with the commit that acknowledges it (see :meth:`ShareSums.forming`); the
upload that brings the M-th part stores the part's sum. A download that finds every part in but
no sum never computes it while another request holds the slot: it waits for the notification
that the sum is stored. The pass advances once every part of its last layer is summed.

Crash safety: acknowledged shares are durable, running sums are not. A share's file is written
before the transaction that acknowledges it commits (service/store/bodies/). After a
restart (or if storing a sum failed) the first download or repeated upload that finds all M
shares committed and no sum adds the shares missing from the running sum from their files and
stores the sum (:meth:`ShareSums.complete`).

With DP on, storing the first aggregation layer's sum of a pass is its release: the sum's file is
synced to disk, then the ledger row and the sum's row are written in one durable transaction (on
disk before ``COMMIT`` returns, see service/store/); a sum is served only once its row exists.
The first part of the layer stored appends the ledger row; its other parts belong to the same
release (one row per pass) and are stored durably too.

Replicas (a shared store, PostgreSQL): the shares of one slot arrive at different processes, so
no running sum or slot lock in memory is trusted. The request that commits the last share, on
whichever replica, or a later download that finds all shares in and no sum, takes the slot's
database lock (``tx.lock_slot``) and, in that one transaction, checks that no sum is stored,
reads every share's body from the payload table, sums them and stores the sum's body and row: a
replica that gets the lock after finds the row and does nothing. A replica that dies mid-sum
leaves nothing (its transaction rolls back); the next download or repeated upload redoes it.
The recent-sums cache of each process holds only sums whose row is committed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from secure.aggregation import RunningSum
from service.plan import SessionPlan
from service.rounds.gate import (
    layer_summed,
    leave_out,
    load_session,
    part_rows_of,
    participants,
    slot_progress,
)
from service.rounds.parts import RoundPart, RoundParts
from service.rounds.recent_sums import RecentSums
from service.session_state import SessionState
from service.store import SessionRow, Transaction
from service.store.bodies import BodySlot

# Sums are served from memory while they fit (one part's sum is 0.1 to 10 MB; every client
# downloads it); older ones are read from their files. Replicas (a shared store) each keep a
# smaller cache: every replica would otherwise hold its own copy of the same sums, and a replica
# keeps those of a session that another replica closed until newer ones push them out; a sum
# not in the cache is read from the database, in pieces.
RECENT_SUM_BYTES = 256 * 2**20
RECENT_SUM_BYTES_PER_REPLICA = 64 * 2**20

_PartSlot = tuple[int, int, int]  # pass, layer, part


@dataclass
class _Slot:
    """The sum of one (pass, layer, part) while its shares arrive."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    running: RunningSum[Any] | None = None


class ShareSums(RoundPart):
    def __init__(self, parts: RoundParts) -> None:
        super().__init__(parts)
        self._slots: dict[BodySlot, _Slot] = {}
        self._slots_lock = threading.Lock()
        self._recent = RecentSums(
            RECENT_SUM_BYTES_PER_REPLICA if self.store.shared else RECENT_SUM_BYTES
        )

    @contextmanager
    def forming(
        self,
        plan: SessionPlan,
        pass_index: int,
        layer: int,
        *,
        part: int = 0,
        rows: int,
        cols: int,
    ) -> Iterator[RunningSum[Any] | None]:
        """The running sum of a slot, its lock held: commit a share's upload and add the share
        inside, so that nobody sees the share committed but not yet added. None with a shared
        store: the sum is formed from the shares' bodies when the slot closes."""
        if self.store.shared:
            yield None
            return
        slot = self._slot(BodySlot(plan.session_id, pass_index, layer, part))
        with slot.lock:
            if slot.running is None:
                slot.running = self.aggregators.for_session(plan).new_sum(rows=rows, cols=cols)
            yield slot.running

    def complete(
        self, session_id: str, pass_index: int, layer: int, *, part: int = 0, wait: bool
    ) -> bool:
        """Store the slot's sum if it closes (all the pass's participants' shares are committed,
        or under stragglers "continue" the wait is over) and no sum is stored, adding first any
        committed share the running sum lacks (after a restart: all of them) from its file.
        Without ``wait``, returns at once while another request holds the slot (a shared
        store waits for the slot's database lock). Whether it changed the session (stored the
        sum, or stopped the session at its budget)."""
        if self.store.shared:
            return self._complete_from_bodies(session_id, pass_index, layer, part)
        key = BodySlot(session_id, pass_index, layer, part)
        slot = self._slot(key)
        if not slot.lock.acquire(blocking=wait):
            return False
        try:
            with self.store.transaction() as tx:
                row, plan = load_session(tx, self.plans, session_id)
                if not _sum_pending(tx, row, pass_index, layer, part):
                    self._forget(key, slot)
                    return False
                committed = tx.uploads(session_id, pass_index, layer, "embedding", part)
                if not slot_progress(tx, plan, pass_index, layer, "embedding", part).closes:
                    return False
                rows = part_rows_of(tx, plan, pass_index, layer, part)
            aggregator = self.aggregators.for_session(plan)
            if slot.running is None:
                slot.running = aggregator.new_sum(rows=rows, cols=plan.widths[layer])
            for upload in committed:
                if upload.client_index in slot.running.clients:
                    continue
                body = self.bodies.read_share(key, upload.client_index, upload.sha256)
                share = aggregator.read_share(body, rows=rows, cols=plan.widths[layer])
                slot.running.add(upload.client_index, share)
            changed = self._store(
                plan,
                (pass_index, layer, part),
                rows,
                slot.running.payload(),
                sorted(slot.running.clients),
            )
            self._forget(key, slot)
            return changed
        finally:
            slot.lock.release()

    def sum_body(self, session_id: str, pass_index: int, layer: int, part: int = 0) -> bytes | None:
        """A stored sum's body (of one part); None once discarded."""
        key = BodySlot(session_id, pass_index, layer, part)
        body = self._recent.get(key)
        if body is None:
            body = self.bodies.read_sum(key)
            if body is not None:
                self._recent.put(key, body)
        return body

    @property
    def recent(self) -> RecentSums:
        """The sums kept in memory."""
        return self._recent

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        """Forget the running sums, sums and files of passes < ``before_pass`` (all if None)."""
        limit = before_pass if before_pass is not None else 2**62
        with self._slots_lock:
            for key in [k for k in self._slots if k[0] == session_id and k[1] < limit]:
                del self._slots[key]
        self._recent.drop(session_id, before_pass=limit)
        self.bodies.discard(session_id, before_pass=before_pass)

    def _complete_from_bodies(
        self, session_id: str, pass_index: int, layer: int, part: int
    ) -> bool:
        """:meth:`complete` on a shared store: sum every committed share's body and store the
        sum, in one transaction that holds the slot's database lock."""
        plan = self._due_sum_plan(session_id, pass_index, layer, part)
        if plan is None:  # most calls end here, without taking the lock
            return False
        is_release = _is_release(plan, layer)
        body_slot = BodySlot(session_id, pass_index, layer, part)
        with self.store.transaction(durable=is_release) as tx:
            tx.lock_slot(session_id, pass_index, layer, part)
            row, plan = load_session(tx, self.plans, session_id)
            if not _sum_closes(tx, row, plan, (pass_index, layer, part)):
                return False  # another request stored it while we waited for the lock
            rows = part_rows_of(tx, plan, pass_index, layer, part)
            aggregator = self.aggregators.for_session(plan)
            running = aggregator.new_sum(rows=rows, cols=plan.widths[layer])
            for upload in tx.uploads(session_id, pass_index, layer, "embedding", part):
                body = self.bodies.read_share(body_slot, upload.client_index, upload.sha256, tx=tx)
                share = aggregator.read_share(body, rows=rows, cols=plan.widths[layer])
                running.add(upload.client_index, share)
            body = running.payload()
            self.bodies.write_sum(body_slot, body, sync=is_release, tx=tx)
            slot = (pass_index, layer, part)
            stored = self._insert_sum(tx, plan, slot, rows, sorted(running.clients))
        self._after_store(plan, slot, body, stored)
        return True

    def _due_sum_plan(
        self, session_id: str, pass_index: int, layer: int, part: int
    ) -> SessionPlan | None:
        """The session's plan if the slot closes and has no sum yet (its own transaction)."""
        with self.store.transaction() as tx:
            row, plan = load_session(tx, self.plans, session_id)
            return plan if _sum_closes(tx, row, plan, (pass_index, layer, part)) else None

    def _store(
        self, plan: SessionPlan, slot: _PartSlot, rows: int, body: bytes, clients: list[int]
    ) -> bool:
        """Write the sum of ``clients``' shares of one part to its file, then its row (with the
        ledger row if it is a release); whether the session changed (False: another request
        stored it)."""
        # A release's ledger row must be on disk before its sum can be served, and the sum with
        # it: a durable transaction's COMMIT returns only once the WAL is synced
        # (service/store/database.py), and the sum's file is synced before.
        pass_index, layer, part = slot
        is_release = _is_release(plan, layer)
        body_slot = BodySlot(plan.session_id, pass_index, layer, part)
        self.bodies.write_sum(body_slot, body, sync=is_release)
        with self.store.transaction(durable=is_release) as tx:
            row, _ = load_session(tx, self.plans, plan.session_id)
            if not _sum_pending(tx, row, pass_index, layer, part):
                return False
            stored = self._insert_sum(tx, plan, slot, rows, clients)
        self._after_store(plan, slot, body, stored)
        return True

    def _insert_sum(
        self, tx: Transaction, plan: SessionPlan, slot: _PartSlot, rows: int, clients: list[int]
    ) -> _Stored:
        """The rows of a pending sum of ``clients``' shares of one part: the absences of the
        others, the ledger row of a release (with the layer's first part stored), the part's
        sum's row and, with the last part of the pass's last layer, the next pass."""
        pass_index, layer, part = slot
        leave_out(
            tx,
            plan,
            pass_index,
            [m for m in participants(tx, plan, pass_index) if m not in clients],
        )
        released_at = None
        if _is_release(plan, layer):
            released_at = _record_release(tx, plan, pass_index, clients)
            if released_at is None:
                return _Stored(sum_stored=False)  # the session stopped at its budget
        tx.insert_result(
            plan.session_id,
            pass_index,
            layer,
            "aggregate",
            rows=rows,
            cols=plan.widths[layer],
            count=len(clients),
            body=None,
            released_at=released_at,
            part=part,
        )
        if layer != plan.last_layer(pass_index) or not layer_summed(tx, plan, pass_index, layer):
            return _Stored(sum_stored=True)
        _advance(tx, plan, pass_index)
        return _Stored(sum_stored=True, completed_kind=plan.passes[pass_index].kind)

    def _after_store(
        self, plan: SessionPlan, slot: _PartSlot, body: bytes, stored: _Stored
    ) -> None:
        """Once the sum's transaction committed: cache the sum, count a completed pass and drop
        the payloads the store no longer keeps."""
        if not stored.sum_stored:
            return
        pass_index = slot[0]
        self._recent.put(BodySlot(plan.session_id, *slot), body)
        if stored.completed_kind is not None:
            self.telemetry.passes_completed.labels(kind=stored.completed_kind).inc()
            # the store keeps the payloads of this pass and the one before (_advance)
            self.discard(plan.session_id, before_pass=pass_index)

    def _slot(self, key: BodySlot) -> _Slot:
        with self._slots_lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._slots[key] = _Slot()
            return slot

    def _forget(self, key: BodySlot, slot: _Slot) -> None:
        with self._slots_lock:
            if self._slots.get(key) is slot:
                del self._slots[key]


@dataclass(frozen=True, slots=True)
class _Stored:
    """What storing a pending sum did."""

    sum_stored: bool  # False: the release did not fit the budget and the session stopped
    completed_kind: str | None = None  # the kind of the pass the sum completed, if it did


def _sum_pending(tx: Transaction, row: SessionRow, pass_index: int, layer: int, part: int) -> bool:
    """The session still runs this pass and the layer's part has no sum yet."""
    return (
        row.state == SessionState.RUNNING
        and row.current_pass == pass_index
        and tx.result(row.id, pass_index, layer, "aggregate", part) is None
    )


def _sum_closes(tx: Transaction, row: SessionRow, plan: SessionPlan, slot: _PartSlot) -> bool:
    """The part's sum is pending and its slot closes now."""
    return (
        _sum_pending(tx, row, *slot)
        and slot_progress(tx, plan, *slot[:2], "embedding", slot[2]).closes
    )


def _is_release(plan: SessionPlan, layer: int) -> bool:
    """Storing this layer's sum releases the pass (differential privacy)."""
    return plan.privacy is not None and layer == plan.first_agg_layer


def _record_release(
    tx: Transaction, plan: SessionPlan, pass_index: int, clients: list[int]
) -> float | None:
    """Append the ledger row of this pass's release of ``clients``' shares (the time of the row
    already there when another part of the layer appended it); None (and the session stops) if
    it does not fit. Normally the check at the start of the pass already stopped it."""
    privacy = plan.privacy
    assert privacy is not None
    ledger = tx.ledger(plan.session_id)
    for entry in ledger:
        if entry.pass_index == pass_index:
            return entry.released_at
    releases = len(ledger)
    if not privacy.release_allowed(releases):
        tx.set_session_state(plan.session_id, SessionState.BUDGET_EXHAUSTED)
        return None
    now = tx.now()
    tx.append_ledger(
        plan.session_id,
        release_index=releases + 1,
        pass_index=pass_index,
        epsilon=privacy.epsilon_after(releases + 1),
        at=now,
        clients=clients,
    )
    return now


def _advance(tx: Transaction, plan: SessionPlan, finished_pass: int) -> None:
    next_pass = finished_pass + 1
    tx.set_current_pass(plan.session_id, next_pass)
    tx.discard_payloads(plan.session_id, before_pass=finished_pass)
    if next_pass == plan.passes_total:
        tx.set_session_state(plan.session_id, SessionState.FINISHED)
    elif plan.privacy is not None and not plan.privacy.release_allowed(
        len(tx.ledger(plan.session_id))
    ):
        # Stop before the clients compute a pass whose release would be refused.
        tx.set_session_state(plan.session_id, SessionState.BUDGET_EXHAUSTED)
