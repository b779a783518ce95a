"""What a worker says when it joins a session with ``ready_gate`` (service/rounds/readiness.py):
ready once its checks passed, or refused with the reason, before anything is released; and the
one check of its owner's that is about the answer rather than privacy budget (whether its
predictions may go to its partners)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from clients.owner_ledger import OwnerLedger
from clients.policy import PolicyRefusal, PrivacyPolicy
from clients.service_http import ServiceError, ServiceUnavailable
from clients.session_client import SessionClient
from clients.session_fit import SessionMismatch
from models.artefact import ModelError
from secure.noise import NotPrivateNoiseError
from secure.protocol import ShareRequest, answering_party
from secure.wire.passes import MAX_REFUSAL_REASON
from secure.wire.sessions import SessionConfigView

log = logging.getLogger(__name__)

#: What makes a worker refuse a session at join (its data, its model, its owner's policy)
REFUSALS = (SessionMismatch, ModelError, PolicyRefusal, NotPrivateNoiseError)


@contextmanager
def refusal_reported(service: SessionClient, config: SessionConfigView) -> Iterator[None]:
    """Around a worker's checks of a session with ``ready_gate``: when it refuses the session
    (one of :data:`REFUSALS`), it says so to the service, which closes the session, so that no
    partner releases into it or waits on it; the refusal then goes on up."""
    try:
        yield
    except REFUSALS as exc:
        if config.ready_gate:
            try:
                service.refuse(str(exc)[:MAX_REFUSAL_REASON])
            except (ServiceError, ServiceUnavailable) as failed:
                log.warning("could not tell the service of the refusal: %s", failed)
        raise


def join(service: SessionClient, config: SessionConfigView) -> None:
    """A session with ``ready_gate``: say this worker is ready, and wait until every client
    did, before anything is released (a partner's refusal ends the wait: ``ServiceError`` 409
    ``session-refused``)."""
    if config.ready_gate:
        service.say_ready()
        service.wait_until_ready()


def admit_prediction_sharing(
    policy: PrivacyPolicy, config: SessionConfigView, *, client: int
) -> None:
    """:class:`PolicyRefusal` when the session would send this party's predictions to its
    partners (it is the answering party) and its owner did not agree."""
    if config.share_predictions == "none" or policy.share_predictions:
        return
    if client == answering_party(config.label_holder):
        raise PolicyRefusal(
            "the scoring session sends this party's predictions to its partners "
            f"(share_predictions {config.share_predictions}), and this organisation has not "
            "agreed to (its owner passes --share-predictions)"
        )


def disclosure_counter(
    ledger: OwnerLedger | None, config: SessionConfigView, *, client: int, session_id: str
) -> Callable[[ShareRequest], None] | None:
    """The answering party of a scoring session that shares its answer: what counts each part
    of it in its owner's ledger before the part leaves (None for everyone else)."""
    if ledger is None or config.share_predictions == "none":
        return None
    if client != answering_party(config.label_holder):
        return None
    return lambda request: ledger.note_predictions_shared(session_id, request.rows)
