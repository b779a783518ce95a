"""Who a masked pass is over: the participants every masked share of the pass is masked over,
as the service states them (``PassInfo.participants``), and the worker's check of that statement.

Under stragglers "continue" a pass whose slot closes without a participant is void (no sum is
formed: the masks would not cancel) and the next pass is masked over the clients still in the
session (docs/secure-aggregation.md, "Dropouts"). A worker takes the set from the service, so
it checks it before anything leaves: a lying service must not get a share masked over a set
that leaves the worker alone with one other party, or one that is not the worker's at all.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The sum of two shares tells each of their owners the other's share: masks protect from three.
MIN_SHARES_IN_SUM = 3


def participants_refusal(stated: Sequence[int] | None, *, party: int, parties: int) -> str | None:
    """Why ``party`` of ``parties`` must not mask a share over the ``stated`` participants of a
    pass, or None if it may: they must be stated, distinct, include ``party``, lie within the
    session's clients and number at least :data:`MIN_SHARES_IN_SUM`."""
    if stated is None:
        return "the service did not state the pass's participants"
    members = set(stated)
    if len(members) != len(stated):
        return f"the stated participants {list(stated)} repeat a client"
    if party not in members:
        return f"the stated participants {sorted(members)} leave this client {party} out"
    strangers = sorted(m for m in members if not 0 <= m < parties)
    if strangers:
        return f"the stated participants name {strangers}, not clients of this {parties}"
    if len(members) < MIN_SHARES_IN_SUM:
        return (
            f"a sum over the stated participants {sorted(members)} would tell each the other's "
            f"share: masks need {MIN_SHARES_IN_SUM} at least"
        )
    return None
