"""The alignment of ``glasu train --party``: every party's side of the private set intersection
(``clients/alignment.py``), one thread each, through the service's own routes running in this
process on a temporary database (no sockets). The same messages as a deployed ``glasu align``,
signed: each party gets a fresh Ed25519 key and its peers' public keys, so it blinds only sets its
peer posted.
Every alignment orders the shared nodes anew (by fully blinded values, which depend on fresh
keys and on the alignment's id), so two runs with one seed draw different splits."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clients.admin import AdminClient
from clients.alignment import AlignmentClient, AlignmentOutcome, align
from clients.alignment_signing import SetSigning
from clients.local.asgi import InProcessTransport
from clients.service_http import ConnectionOptions

BASE_URL = "http://glasu.inprocess"
PEER_WAIT_SECONDS = 120.0  # the parties are threads of this process: none is ever far behind


def align_in_process(
    party_ids: Sequence[Sequence[str]],
    *,
    seed: int,
    nodes: str = "intersection",
    progress: bool = False,
) -> list[AlignmentOutcome]:
    """Align the parties' ids (one sequence per party, in its row order); the outcome of each
    party, in order. Raises :class:`clients.alignment.AlignmentFailed` (e.g. no shared id)."""
    from service.app import create_app
    from service.settings import ServiceSettings

    admin_token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="glasu-align-") as tmp:
        app = create_app(
            ServiceSettings(database=Path(tmp) / "alignment.sqlite3", admin_token=admin_token)
        )
        transport = InProcessTransport(app)
        try:
            with AdminClient(base_url=BASE_URL, token=admin_token, transport=transport) as admin:
                created = admin.create_alignment(
                    {
                        "parties": len(party_ids),
                        "seed": seed,
                        "nodes": nodes,
                        "label": "glasu train --party",
                    }
                )
            signing = SetSigning.generate(len(party_ids))
            with ThreadPoolExecutor(max_workers=len(party_ids)) as pool:
                futures = [
                    pool.submit(
                        _party,
                        transport,
                        created["alignment_id"],
                        m,
                        created["party_tokens"][m],
                        ids,
                        signing[m],
                        progress and m == 0,
                    )
                    for m, ids in enumerate(party_ids)
                ]
                return [future.result() for future in futures]
        finally:
            transport.shutdown()
            app.state.glasu.close()


def _party(
    transport: InProcessTransport,
    alignment_id: str,
    party: int,
    token: str,
    ids: Sequence[str],
    signing: SetSigning,
    progress: bool,
) -> AlignmentOutcome:
    with AlignmentClient(
        base_url=BASE_URL,
        alignment_id=alignment_id,
        party=party,
        token=token,
        options=ConnectionOptions(
            transport=transport, poll_seconds=5.0, peer_wait_seconds=PEER_WAIT_SECONDS
        ),
    ) as client:
        return align(client, ids, signing=signing, progress=progress)
