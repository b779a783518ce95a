"""Summing a layer's shares as they arrive, part by part, recording the pass's release in the
privacy ledger, and advancing the session to the next pass.

A layer's shares travel in parts (``secure.protocol.part_span``) and each part is a slot of its
own: its sum is formed and stored as soon as every expected client's part is in, so the service
never holds more of a layer than the parts in flight. Each share's part is validated and parsed
once, when it is uploaded, and added into the running sum of its slot under the slot's lock,
together with the commit that acknowledges it (see :meth:`ShareSums.forming`); the upload that
brings the M-th part stores the part's sum. A download that finds every part in but
no sum never computes it while another request holds the slot: it waits for the notification
that the sum is stored. The pass advances once every part of its last layer is summed.

Crash safety: acknowledged shares are durable, running sums are not. A share's body is written
before the transaction that acknowledges it commits (service/store/bodies/). After a
restart (or if storing a sum failed) the first download or repeated upload that finds all M
shares committed and no sum adds the shares missing from the running sum from their bodies and
stores the sum (:meth:`ShareSums.complete`).

Which slot closes, who it leaves out, what a release does to the ledger and where the session
goes once a pass completed are decided by :mod:`service.session_state`; this module applies it.
A masked session's slot that closes without a participant voids its pass (:func:`void_pass`):
no sum, the missing left out, the pass ended; a void release slot is still a release in the
ledger (the shares that arrived were released by their owners, whose ledgers count them).

With DP on, storing the first aggregation layer's sum of a pass is its release: the sum's body is
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
from service.rounds.gate import load_session
from service.rounds.recent_sums import RecentSums
from service.rounds.services import RoundComponent, RoundServices
from service.rounds.slots import (
    layer_summed,
    mark_left_out,
    masked,
    part_rows_of,
    slot_progress,
    sum_pending,
)
from service.session_state import SlotProgress, pass_end, release_of_pass, voids_pass
from service.store import SessionRow, Slot, Transaction

# Sums are served from memory while they fit (one part's sum is 0.1 to 10 MB; every client
# downloads it); older ones are read from the bodies (files beside an SQLite database, a table
# of a PostgreSQL one). Replicas (a shared store) each keep a smaller cache: every replica
# would otherwise hold its own copy of the same sums, and a replica keeps those of a session
# that another replica closed until newer ones push them out; a sum not in the cache is read
# from the database, in pieces.
RECENT_SUM_BYTES = 256 * 2**20
RECENT_SUM_BYTES_PER_REPLICA = 64 * 2**20


@dataclass
class _SlotRunningSum:
    """The running sum of one slot while its shares arrive, and the slot's lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    running: RunningSum[Any] | None = None


class ShareSums(RoundComponent):
    def __init__(self, services: RoundServices) -> None:
        super().__init__(services)
        self._running: dict[Slot, _SlotRunningSum] = {}
        self._running_lock = threading.Lock()
        self._recent = RecentSums(
            RECENT_SUM_BYTES_PER_REPLICA if self.store.shared else RECENT_SUM_BYTES
        )

    @contextmanager
    def forming(
        self, plan: SessionPlan, slot: Slot, *, rows: int, cols: int
    ) -> Iterator[RunningSum[Any] | None]:
        """The running sum of a slot, its lock held: commit a share's upload and add the share
        inside, so that nobody sees the share committed but not yet added. None with a shared
        store: the sum is formed from the shares' bodies when the slot closes."""
        if self.store.shared:
            yield None
            return
        in_memory = self._running_sum(slot)
        with in_memory.lock:
            if in_memory.running is None:
                in_memory.running = self.aggregators.for_session(plan).new_sum(rows=rows, cols=cols)
            yield in_memory.running

    def complete(self, slot: Slot, *, wait: bool) -> bool:
        """Store the slot's sum if it closes (all the pass's participants' shares are committed,
        or under stragglers "continue" the wait is over) and no sum is stored, adding first any
        committed share the running sum lacks (after a restart: all of them) from its body.
        Without ``wait``, returns at once while another request holds the slot (a shared
        store waits for the slot's database lock). Whether it changed the session (stored the
        sum, or stopped the session at its budget)."""
        if self.store.shared:
            return self._complete_from_bodies(slot)
        in_memory = self._running_sum(slot)
        if not in_memory.lock.acquire(blocking=wait):
            return False
        try:
            with self.store.transaction() as tx:
                row, plan = load_session(tx, self.plans, slot.session_id)
                if not sum_pending(tx, row, slot):
                    self._forget(slot, in_memory)
                    return False
                committed = tx.uploads(*slot[:3], "share", slot.part)
                progress = slot_progress(tx, plan, slot, "share")
                if not progress.closes:
                    return False
                voids = voids_pass(progress, masked=masked(plan))
                rows = part_rows_of(tx, plan, slot)
            if voids:
                self._void(slot)
                self._forget(slot, in_memory)
                return True
            aggregator = self.aggregators.for_session(plan)
            if in_memory.running is None:
                in_memory.running = aggregator.new_sum(rows=rows, cols=plan.widths[slot.layer])
            running = in_memory.running
            for upload in committed:
                if upload.client_index in running.clients:
                    continue
                body = self.bodies.read_share(slot, upload.client_index, upload.sha256)
                share = aggregator.read_share(body, rows=rows, cols=plan.widths[slot.layer])
                running.add(upload.client_index, share)
            changed = self._store(plan, slot, rows, running.payload(), sorted(running.clients))
            self._forget(slot, in_memory)
            return changed
        finally:
            in_memory.lock.release()

    def sum_body(self, slot: Slot) -> bytes | None:
        """A stored sum's body (of one part); None once discarded."""
        body = self._recent.get(slot)
        if body is None:
            body = self.bodies.read_sum(slot)
            if body is not None:
                self._recent.put(slot, body)
        return body

    @property
    def recent(self) -> RecentSums:
        """The sums kept in memory."""
        return self._recent

    def discard(self, session_id: str, *, before_pass: int | None = None) -> None:
        """Forget the running sums, sums and bodies of passes < ``before_pass`` (all if None)."""
        limit = before_pass if before_pass is not None else 2**62
        with self._running_lock:
            for slot in [
                s for s in self._running if s.session_id == session_id and s.pass_index < limit
            ]:
                del self._running[slot]
        self._recent.drop(session_id, before_pass=limit)
        self.bodies.discard(session_id, before_pass=before_pass)

    def _complete_from_bodies(self, slot: Slot) -> bool:
        """:meth:`complete` on a shared store: sum every committed share's body and store the
        sum, in one transaction that holds the slot's database lock."""
        plan = self._due_sum_plan(slot)
        if plan is None:  # most calls end here, without taking the lock
            return False
        is_release = _is_release(plan, slot.layer)
        with self.store.transaction(durable=is_release) as tx:
            tx.lock_slot(*slot)
            row, plan = load_session(tx, self.plans, slot.session_id)
            if not _sum_closes(tx, row, plan, slot):
                return False  # another request stored it while we waited for the lock
            progress = slot_progress(tx, plan, slot, "share")
            if voids_pass(progress, masked=masked(plan)):
                void_pass(tx, row, plan, slot.pass_index, progress, release=is_release)
                return True
            rows = part_rows_of(tx, plan, slot)
            aggregator = self.aggregators.for_session(plan)
            running = aggregator.new_sum(rows=rows, cols=plan.widths[slot.layer])
            for upload in tx.uploads(*slot[:3], "share", slot.part):
                body = self.bodies.read_share(slot, upload.client_index, upload.sha256, tx=tx)
                share = aggregator.read_share(body, rows=rows, cols=plan.widths[slot.layer])
                running.add(upload.client_index, share)
            body = running.payload()
            self.bodies.write_sum(slot, body, sync=is_release, tx=tx)
            stored = self._insert_sum(tx, row, plan, slot, rows, sorted(running.clients))
        self._after_store(plan, slot, body, stored)
        return True

    def _void(self, slot: Slot) -> None:
        """:func:`void_pass` for a slot whose pass it voids, in a durable transaction (a void
        release slot appends the pass's ledger row)."""
        with self.store.transaction(durable=True) as tx:
            row, plan = load_session(tx, self.plans, slot.session_id)
            progress = slot_progress(tx, plan, slot, "share")
            if not sum_pending(tx, row, slot) or not voids_pass(progress, masked=masked(plan)):
                return
            release = _is_release(plan, slot.layer)
            void_pass(tx, row, plan, slot.pass_index, progress, release=release)

    def _due_sum_plan(self, slot: Slot) -> SessionPlan | None:
        """The session's plan if the slot closes and has no sum yet (its own transaction)."""
        with self.store.transaction() as tx:
            row, plan = load_session(tx, self.plans, slot.session_id)
            return plan if _sum_closes(tx, row, plan, slot) else None

    def _store(
        self, plan: SessionPlan, slot: Slot, rows: int, body: bytes, clients: list[int]
    ) -> bool:
        """Write the body of the sum of ``clients``' shares of one slot, then its row (with the
        ledger row if it is a release); whether the session changed (False: another request
        stored it)."""
        # A release's ledger row must be on disk before its sum can be served, and the sum with
        # it: a durable transaction's COMMIT returns only once the WAL is synced
        # (service/store/database.py), and the sum's body is synced before.
        is_release = _is_release(plan, slot.layer)
        self.bodies.write_sum(slot, body, sync=is_release)
        with self.store.transaction(durable=is_release) as tx:
            row, _ = load_session(tx, self.plans, plan.session_id)
            if not sum_pending(tx, row, slot):
                return False
            stored = self._insert_sum(tx, row, plan, slot, rows, clients)
        self._after_store(plan, slot, body, stored)
        return True

    def _insert_sum(
        self,
        tx: Transaction,
        row: SessionRow,
        plan: SessionPlan,
        slot: Slot,
        rows: int,
        clients: list[int],
    ) -> _Stored:
        """The rows of a pending sum of ``clients``' shares of one slot: the absences of the
        others, the ledger row of a release (with the layer's first part stored), the part's
        sum's row and, with the last part of the pass's last layer, the next pass."""
        pass_index, layer = slot.pass_index, slot.layer
        mark_left_out(tx, plan, pass_index, clients)
        released_at = None
        if _is_release(plan, layer):
            released_at = _record_release(tx, row, plan, pass_index, clients)
            if released_at is None:
                return _Stored(sum_stored=False)  # the session stopped at its budget
        tx.insert_result(
            plan.session_id,
            pass_index,
            layer,
            "sum",
            rows=rows,
            cols=plan.widths[layer],
            count=len(clients),
            body=None,
            released_at=released_at,
            part=slot.part,
        )
        if layer != plan.last_layer(pass_index) or not layer_summed(tx, plan, pass_index, layer):
            return _Stored(sum_stored=True)
        _end_pass(tx, row, plan, pass_index)
        return _Stored(sum_stored=True, completed_kind=plan.passes[pass_index].kind)

    def _after_store(self, plan: SessionPlan, slot: Slot, body: bytes, stored: _Stored) -> None:
        """Once the sum's transaction committed: cache the sum, count a completed pass and drop
        the payloads the store no longer keeps."""
        if not stored.sum_stored:
            return
        self._recent.put(slot, body)
        if stored.completed_kind is not None:
            self.telemetry.passes_completed.labels(kind=stored.completed_kind).inc()
            # the store keeps the payloads of this pass and the one before (_end_pass)
            self.discard(plan.session_id, before_pass=slot.pass_index)

    def _running_sum(self, slot: Slot) -> _SlotRunningSum:
        with self._running_lock:
            in_memory = self._running.get(slot)
            if in_memory is None:
                in_memory = self._running[slot] = _SlotRunningSum()
            return in_memory

    def _forget(self, slot: Slot, in_memory: _SlotRunningSum) -> None:
        with self._running_lock:
            if self._running.get(slot) is in_memory:
                del self._running[slot]


@dataclass(frozen=True, slots=True)
class _Stored:
    """What storing a pending sum did."""

    sum_stored: bool  # False: the release did not fit the budget and the session stopped
    completed_kind: str | None = None  # the kind of the pass the sum completed, if it did


def void_pass(
    tx: Transaction,
    row: SessionRow,
    plan: SessionPlan,
    pass_index: int,
    progress: SlotProgress,
    *,
    release: bool,
) -> None:
    """Apply :func:`service.session_state.voids_pass`: a masked slot of ``pass_index`` closed
    with ``progress.received`` only, so no sum is formed. The missing are absent from the next
    pass on; a void ``release`` slot (shares of the release layer) is recorded as the pass's
    release (its uploaders released their shares: a service holding them with a colluder's key
    could have summed them); the pass ends, so its other participants are answered that it went
    on without a sum (409 ``wrong-pass``, reason 'voided') and go on with the next, masked over
    the clients still in. Unions void a pass as sums do: a pass's later slots are masked over
    its participants."""
    mark_left_out(tx, plan, pass_index, progress.received)
    if release and _record_release(tx, row, plan, pass_index, progress.received) is None:
        return  # the session stopped at its budget
    _end_pass(tx, row, plan, pass_index)


def _sum_closes(tx: Transaction, row: SessionRow, plan: SessionPlan, slot: Slot) -> bool:
    """The slot's sum is pending and the slot closes now."""
    return sum_pending(tx, row, slot) and slot_progress(tx, plan, slot, "share").closes


def _is_release(plan: SessionPlan, layer: int) -> bool:
    """Storing this layer's sum releases the pass (differential privacy; a scoring session
    of a kept release releases nothing)."""
    return plan.privacy is not None and not plan.post_processing and layer == plan.first_agg_layer


def _record_release(
    tx: Transaction, row: SessionRow, plan: SessionPlan, pass_index: int, clients: list[int]
) -> float | None:
    """Apply :func:`service.session_state.release_of_pass` to the release of ``clients``'
    shares: append the pass's ledger row, or stop the session at its budget (None); the time
    of the pass's row."""
    privacy = plan.privacy
    assert privacy is not None
    ledger = tx.ledger(plan.session_id)
    release = release_of_pass(
        row.state,
        pass_index,
        {entry.pass_index: entry.released_at for entry in ledger},
        allowed=privacy.release_allowed(len(ledger)),
        now=tx.now(),
    )
    if release.state != row.state:
        tx.set_session_state(plan.session_id, release.state)
    elif release.release_index is not None:
        tx.append_ledger(
            plan.session_id,
            release_index=release.release_index,
            pass_index=pass_index,
            epsilon=privacy.epsilon_after(release.release_index),
            at=release.released_at,
            clients=clients,
        )
    return release.released_at


def _end_pass(tx: Transaction, row: SessionRow, plan: SessionPlan, completed_pass: int) -> None:
    """Apply :func:`service.session_state.pass_end`: the next pass, and the state the session
    stops in if it does; the store keeps the payloads of the completed pass and the next."""
    privacy = plan.privacy
    next_release_allowed = (
        None if privacy is None else privacy.release_allowed(len(tx.ledger(plan.session_id)))
    )
    end = pass_end(
        row.state,
        row.current_pass,
        completed_pass,
        passes_total=plan.passes_total,
        next_release_allowed=next_release_allowed,
    )
    tx.set_current_pass(plan.session_id, end.next_pass)
    tx.discard_payloads(plan.session_id, before_pass=completed_pass)
    if end.state != row.state:
        tx.set_session_state(plan.session_id, end.state)
