"""``glasu worker --online``: an online scoring session's worker (docs/data.md, "Online
scoring"). It loads its partition and model once, then takes part in each request session of
its online session as it opens (``service/online.py``: ``<online id>-1``, ``-2``, ...), each
exactly as a batch scoring worker would (the join gate, the owner's policy and ledger, one
release), until the operator closes the online session. A request this worker refuses (its
owner's caps) is refused at join, before any party releases; the worker goes on with the next.
Between requests it waits in a long poll that the next request's opening wakes
(``GET /v1/sessions/{id}/requests/{n}``), not by polling."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from clients.cli.errors import EXIT_POLICY, EXIT_REFUSED, CliError
from clients.settings import WorkerSettings

if TYPE_CHECKING:
    from clients.cli.worker_cmd import LoadedWorker


def serve_requests(
    settings: WorkerSettings,
    loaded: LoadedWorker,
    run_session: Callable[[WorkerSettings], int],
) -> int:
    """Run ``run_session`` for every request session of ``settings.session`` as it opens; 0
    once the online session is closed, or the exit code of a request that failed otherwise
    than by this owner's refusal."""
    from clients.service_http import ConnectionOptions, ServiceError
    from clients.session_client import SessionClient
    from secure.wire.sessions import request_session_id

    if settings.masking_key is not None:
        raise CliError("--online scores under CKKS or in plaintext: masked shares are per session")
    if settings.predictions is not None and settings.predictions.suffix:
        raise CliError("--predictions with --online is a folder: one file per request")
    if settings.predictions is not None:
        settings.predictions.mkdir(parents=True, exist_ok=True)
    with SessionClient(
        base_url=settings.server,
        session_id=settings.session,
        client_index=settings.client,
        token=loaded.token,
        options=ConnectionOptions(
            transport=loaded.transport, verify=loaded.verify, poll_seconds=settings.poll_seconds
        ),
    ) as online:
        if not online.session().config.online:
            raise CliError(f"--online: session {settings.session} is not an online session")
        number = 1
        while True:
            try:
                request = online.next_request(number)  # a long poll, woken by the request
            except ServiceError as exc:
                if exc.status != 409 or exc.slug != "session-closed":
                    raise
                print(f"glasu worker {settings.client}: online session closed", file=sys.stderr)
                return 0
            if request is None:
                continue
            request_id = request_session_id(settings.session, number)  # the id this owner keys
            number += 1
            if request.state != "running":  # answered or refused before this worker started
                continue
            code = run_session(_for_request(settings, request_id))
            if code not in (0, EXIT_POLICY, EXIT_REFUSED):  # a request refused: the next
                return code


def _for_request(settings: WorkerSettings, request_id: str) -> WorkerSettings:
    """The worker's settings in one request session: no checkpoint (a request is one pass),
    its predictions in a file of their own."""
    predictions = (
        None if settings.predictions is None else settings.predictions / f"{request_id}.csv"
    )
    return settings.model_copy(
        update={
            "session": request_id,
            "predictions": predictions,
            "no_checkpoint": True,
            "result": None,
        }
    )
