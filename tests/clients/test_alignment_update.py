"""Updates of a kept alignment against a service that lies (clients/alignment_update.py): one
that names a base the parties did not keep, that lost or altered its kept sets, or that relays a
delta set its poster did not sign, is refused before any party's kept alignment changes. The
service's routes run in this process, on a database kept between alignments (no sockets)."""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from clients.admin import AdminClient
from clients.alignment import AlignmentClient, AlignmentFailed, AlignmentOutcome
from clients.alignment_keeping import KeptAlignment
from clients.alignment_signing import SetSigning
from clients.alignment_update import update_alignment
from clients.local.alignment import align_in_process
from clients.local.asgi import InProcessTransport
from clients.service_http import ConnectionOptions, ServiceError
from service.app import create_app, service_context
from service.settings import ServiceSettings

BASE_URL = "http://glasu.test"
TABLES = [[f"c{i}" for i in range(start, start + 30)] for start in (0, 5, 3)]
UPDATED = [[*ids[1:], "new"] for ids in TABLES]


def kept_alignment(database: Path) -> list[KeptAlignment]:
    outcomes = align_in_process(TABLES, seed=1, keep=True, database=database)
    return [o.kept for o in outcomes if o.kept is not None]


def run_update(
    database: Path,
    base: str,
    kept: Sequence[KeptAlignment],
    *,
    signing: Sequence[SetSigning] | None = None,
) -> tuple[list[AlignmentOutcome | BaseException], dict]:
    """Every party's side of an update of ``base`` the service creates, one thread each; each
    party's outcome or error, and the update's status afterwards."""
    token = secrets.token_urlsafe(24)
    app = create_app(ServiceSettings(database=database, admin_token=token))
    transport = InProcessTransport(app)
    outcomes: list[AlignmentOutcome | BaseException] = [RuntimeError("not run")] * len(kept)
    try:
        with AdminClient(base_url=BASE_URL, token=token, transport=transport) as admin:
            created = admin.create_alignment({"parties": len(kept), "seed": 1, "base": base})

            def party(m: int) -> None:
                with AlignmentClient(
                    base_url=BASE_URL,
                    alignment_id=created["alignment_id"],
                    party=m,
                    token=created["party_tokens"][m],
                    options=ConnectionOptions(
                        transport=transport, poll_seconds=0.5, peer_wait_seconds=2
                    ),
                ) as client:
                    try:
                        outcomes[m] = update_alignment(
                            client,
                            UPDATED[m],
                            kept[m],
                            signing=None if signing is None else signing[m],
                            workers=1,
                        )
                    except BaseException as exc:  # surfaced by the tests
                        outcomes[m] = exc

            threads = [threading.Thread(target=party, args=(m,)) for m in range(len(kept))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            status = admin.alignment(created["alignment_id"])
    finally:
        transport.shutdown()
        service_context(app).close()
    return outcomes, status


def refused(outcomes: list, match: str) -> None:
    for outcome in outcomes:
        assert isinstance(outcome, AlignmentFailed), outcome
        assert match in str(outcome)


def nothing_posted(status: dict) -> None:
    assert status["state"] == "running"
    assert all(s["hops"] == 0 and s["removed"] is None for s in status["sets"])


def test_an_honest_update_goes_through(tmp_path: Path) -> None:
    database = tmp_path / "service.sqlite3"
    kept = kept_alignment(database)
    outcomes, status = run_update(database, kept[0].alignment_id, kept)
    assert status["state"] == "done" and status["aligned_nodes"] == len(
        set.intersection(*map(set, UPDATED))
    )
    assert all(isinstance(o, AlignmentOutcome) and o.kept.updates == 1 for o in outcomes)


def test_an_update_that_names_a_base_the_parties_did_not_keep_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "service.sqlite3"
    kept = kept_alignment(database)
    other = kept_alignment(database)  # another kept alignment the service holds
    outcomes, status = run_update(database, other[0].alignment_id, kept)
    refused(outcomes, f"names alignment {other[0].alignment_id} as its base, but this party")
    nothing_posted(status)


def test_a_service_that_altered_its_kept_sets_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "service.sqlite3"
    kept = kept_alignment(database)
    with sqlite3.connect(database) as db:
        (elements,) = db.execute("SELECT elements FROM alignment_kept WHERE owner = 1").fetchone()
        forged = bytes(elements[32:64]) + bytes(elements[:32]) + bytes(elements[64:])
        db.execute("UPDATE alignment_kept SET elements = ? WHERE owner = 1", (forged,))
    outcomes, status = run_update(database, kept[0].alignment_id, kept)
    refused(outcomes, "the service lost or altered them")
    nothing_posted(status)


def test_a_service_that_lost_its_kept_sets_cannot_open_an_update(tmp_path: Path) -> None:
    database = tmp_path / "service.sqlite3"
    kept = kept_alignment(database)
    with sqlite3.connect(database) as db:
        db.execute("DELETE FROM alignment_kept")
    with pytest.raises(ServiceError, match="no longer keeps the sets"):
        run_update(database, kept[0].alignment_id, kept)


def test_a_delta_set_its_poster_did_not_sign_is_not_blinded(tmp_path: Path) -> None:
    database = tmp_path / "service.sqlite3"
    kept = kept_alignment(database)
    signing = SetSigning.generate(3)
    # party 0 posts its added ids unsigned (as a service that strips signatures relays them)
    signing[0] = SetSigning(peer_keys=signing[0].peer_keys)
    outcomes, status = run_update(database, kept[0].alignment_id, kept, signing=signing)
    assert isinstance(outcomes[1], AlignmentFailed)
    assert "hop 0 of party 0's set" in str(outcomes[1]) and "it is unsigned" in str(outcomes[1])
    assert not any(isinstance(o, AlignmentOutcome) for o in outcomes)
    assert status["state"] == "running"
