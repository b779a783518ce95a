"""A worker's side of keeping its model (``models/keeper.py``): the round's common choice read
from what the label holders reported to the service, and the privacy spent read from the
owner's own ledger."""

from __future__ import annotations

import time
from typing import Any

from clients.owner_ledger import OwnerLedger
from clients.policy import PrivacyPolicy
from clients.session_client import SessionClient
from models.keeper import privacy_spent
from secure.privacy import SessionPrivacy

REPORT_POLL_SECONDS = 0.5


def reported_val_accuracy(
    service: SessionClient, passes: set[int], *, holders: int
) -> dict[int, float]:
    """The mean validation accuracy of each evaluation pass in ``passes``, as the label holders
    reported it to the service (``GET /v1/sessions/{id}``'s metrics), waiting within the peer
    wait until every holder has reported every pass."""
    deadline = time.monotonic() + service.options.peer_wait_seconds
    while True:
        reported = {
            m.pass_index: m.val_accuracy
            for m in service.session().metrics
            if m.pass_index in passes and m.val_accuracy is not None and m.reports >= holders
        }
        if set(reported) == passes:
            return reported
        if time.monotonic() >= deadline:
            missing = sorted(passes - set(reported))
            raise RuntimeError(
                f"the label holders never reported evaluation passes {missing}: the round to "
                "keep cannot be chosen in common"
            )
        time.sleep(REPORT_POLL_SECONDS)


def ledger_spent(
    privacy: SessionPrivacy | None,
    policy: PrivacyPolicy,
    ledger: OwnerLedger | None,
    session_id: str,
) -> dict[str, Any] | None:
    """What the session spent of this party's data, from its owner's ledger."""
    if privacy is None or ledger is None:
        return None
    return privacy_spent(
        privacy,
        epsilon=ledger.epsilon(
            delta=policy.delta, accountant=policy.accountant, session_id=session_id
        ),
        delta=policy.delta,
        accountant=policy.accountant,
        releases=ledger.releases(session_id=session_id),
        source=f"this party's own privacy ledger, {ledger.path.resolve()}",
    )
