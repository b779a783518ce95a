"""An update of a kept alignment, one party's side (docs/protocol.md, "Alignment updates"; the
service's side is ``service/alignment/updates.py``).

The alignment names its base, the last alignment this party kept (``clients/alignment_keeping.py``).
The party first checks the service's statement of the base against what it recorded (the base's
id and the digest of what the service keeps of it): a service that lost or altered its kept sets,
or names another base, is refused before anything leaves. It then posts the positions of its kept
set whose ids it removed, and its added ids blinded under its kept key and domain, shuffled (hop
0); the ring blinds only these delta sets, each checked as in a fresh alignment. Last it fetches
what changed (the base's aligned nodes removed, the new ones inserted with its position for each),
applies it to its per-position map, and keeps the result. Its rows' aligned indices are those a
fresh alignment of the same tables under the same keys gives.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from clients.alignment import (
    AlignmentClient,
    AlignmentOutcome,
    answered,
    blind_own_ids,
    checked_outcome,
    progress_bar,
)
from clients.alignment_keeping import KeptAlignment
from clients.alignment_ring import AlignmentFailed, checked_signing, run_ring
from clients.alignment_signing import SetSigning
from clients.cores import available_cores
from secure.wire.alignment import AlignmentStatus


def update_alignment(
    client: AlignmentClient,
    ids: Sequence[str],
    kept: KeptAlignment,
    *,
    signing: SetSigning | None = None,
    progress: bool = False,
    workers: int | None = None,
) -> AlignmentOutcome:
    """Take part in the update ``client``'s alignment makes of ``kept``'s alignment, over the
    party's current ``ids`` (distinct, in row order); the outcome, its ``kept`` the kept
    alignment after it. Raises :class:`AlignmentFailed` before posting anything when the
    service's base is not the one kept."""
    workers = available_cores() if workers is None else workers
    status = client.status()
    parties, m = status.parties, client.party
    try:
        kept.check_fits(parties=parties, party=m, where="the kept alignment given")
    except ValueError as exc:
        raise AlignmentFailed(str(exc)) from None
    check_base(status, kept)
    signing = checked_signing(signing, parties, m)
    delta = kept.delta(ids)  # checks that the ids are distinct
    shuffled = delta.added_rows.tolist()
    random.SystemRandom().shuffle(shuffled)  # the added ids' positions reveal nothing about them
    order = np.asarray(shuffled, dtype=np.int64)
    added_positions = kept.aligned.size + np.arange(order.size)
    bar = progress_bar(order.size * parties, m, progress)
    try:
        client.post_removed(delta.removed_positions)
        own = blind_own_ids(kept.key, kept.domain, [ids[row] for row in order], workers, bar)
        blinded = order.size + run_ring(
            client, signing, kept.key, own, parties, workers, bar.update
        )
        changes = answered(client.fetch_changes, "changes")
    finally:
        bar.close()
    status = client.status()
    if status.aligned_nodes is None or status.kept_digest is None:
        raise AlignmentFailed("the service answered the changes before the update was done")
    # ``delta`` lists the added rows in row order: their positions follow ``order``
    row_positions = delta.row_positions.copy()
    row_positions[order] = added_positions
    try:
        aligned = kept.applied(delta, added_positions, changes, status.aligned_nodes)
    except ValueError as exc:
        raise AlignmentFailed(f"the service's changes do not fit this party's: {exc}") from None
    rows = aligned[row_positions]
    outcome = checked_outcome(client, status, rows, own_size=order.size)
    updated = kept.placed(
        client.alignment_id, status.kept_digest, outcome.aligned_nodes,
        keys=delta.keys, positions=row_positions, aligned=aligned, updated=True,
        blinded=blinded, order=delta.order,
    )  # fmt: skip
    return dataclasses.replace(outcome, kept=updated)


def check_base(status: AlignmentStatus, kept: KeptAlignment) -> None:
    """The update's base is the alignment ``kept`` records, as the service kept it."""
    if status.base is None:
        raise AlignmentFailed(
            f"alignment {status.alignment_id} is a fresh alignment, not an update of the kept "
            f"alignment {kept.alignment_id}: align afresh (new keys) instead"
        )
    if status.base != kept.alignment_id:
        raise AlignmentFailed(
            f"the service's update names alignment {status.base} as its base, but this party "
            f"kept alignment {kept.alignment_id}: not taking part"
        )
    if status.base_kept_digest != kept.kept_digest:
        raise AlignmentFailed(
            f"the service's kept sets of alignment {kept.alignment_id} are not those this party "
            f"recorded (digest {str(status.base_kept_digest)[:16]}..., recorded "
            f"{kept.kept_digest[:16]}...): the service lost or altered them; align afresh"
        )
