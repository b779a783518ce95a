"""Where a worker (re)joins its session's passes: after a restart (at its checkpoint's pass, or
the service's current one under stragglers "continue"), after a pass went on without it (or,
masked, without a sum), and when a masked pass's participants are not stated yet."""

from __future__ import annotations

import time
from pathlib import Path

from clients.checkpoint import CheckpointError
from clients.service_http import PeersMissing
from clients.session_client import SessionClient
from secure.wire.passes import PassInfo
from secure.wire.status import SessionStatus

REJOIN_POLL_SECONDS = 0.25


def rejoin_pass(session: SessionStatus, next_pass: int, checkpoint: Path | None) -> int:
    """The pass a worker at ``next_pass`` joins ``session`` at: ``next_pass``, if the service is
    at that pass or at the next one (its share of ``next_pass`` may have completed the pass
    before it stopped); under stragglers "continue" also the service's current pass, however
    far on."""
    current = session.current_pass
    if next_pass <= current <= next_pass + 1:
        return next_pass
    if current > next_pass and session.config.stragglers == "continue":
        return current
    if checkpoint is None:
        raise CheckpointError(
            f"session {session.session_id} is at pass {current} and this worker has no "
            "checkpoint of it, so it cannot rejoin: restart it with the --checkpoint folder of "
            "its first run (and without --no-checkpoint)"
        )
    if current < next_pass:
        raise CheckpointError(
            f"the checkpoint {checkpoint} is at pass {next_pass} but session "
            f"{session.session_id} is at pass {current}: the service lost passes (a "
            "restored database?); a worker cannot go back, start a new session"
        )
    raise CheckpointError(
        f"the checkpoint {checkpoint} is at pass {next_pass} but session "
        f"{session.session_id} is at pass {current}: the service cannot have gone on "
        "without this client, so the checkpoint is older than this worker's last uploads "
        "(restored from a backup?)"
    )


def stated_pass_info(service: SessionClient, pass_index: int) -> PassInfo:
    """Pass ``pass_index``'s descriptor once the service states its participants (a masked
    session's pass waits for the pass before it to end, or for a rejoin to have 3); at once
    when the session is done. :class:`PeersMissing` after the peer wait."""
    wait = service.options.peer_wait_seconds
    deadline = time.monotonic() + wait
    while True:
        info = service.pass_info(pass_index)
        if info.kind == "done" or info.participants is not None:
            return info
        if time.monotonic() >= deadline:
            raise PeersMissing(
                f"the service did not state the participants of masked pass {pass_index} "
                f"within {wait:.0f} s (fewer than 3 clients left, none rejoining?)"
            )
        time.sleep(REJOIN_POLL_SECONDS)


def next_pass_after(service: SessionClient, pass_index: int) -> int:
    """The pass to go on with after ``pass_index`` went on without this client (stragglers
    "continue"): ask the service to wait for it again (from the current pass or the next) and
    wait for that pass."""
    back_at = service.rejoin()
    wait = service.options.peer_wait_seconds
    deadline = time.monotonic() + wait
    while True:
        status = service.session()
        if status.current_pass >= back_at or status.state != "running":
            return max(status.current_pass, pass_index + 1)
        if time.monotonic() >= deadline:
            raise PeersMissing(
                f"pass {pass_index} went on without this client and the session did not "
                f"reach pass {back_at} within {wait:.0f} s"
            )
        time.sleep(REJOIN_POLL_SECONDS)
