"""The alignment of ``glasu train --party``: every party's side of the private set intersection
(``clients/alignment.py``), one thread each, through the service's own routes running in this
process on a temporary database (no sockets). The same messages as a deployed ``glasu align``,
signed: each party gets a fresh Ed25519 key and its peers' public keys, so it blinds only sets its
peer posted.
Every alignment orders the shared nodes anew (by fully blinded values, which depend on fresh
keys and on the alignment's id), so two runs with one seed draw different splits.
``glasu score`` aligns through the alignment each party keeps (:func:`align_keeping`): an
update that moves only the ids added or removed since, through a service database kept for the
federation beside party 0's kept alignment (this machine is the service: it keeps the fully
blinded sets, as a deployed service does)."""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clients.admin import AdminClient
from clients.alignment import AlignmentClient, AlignmentOutcome, align
from clients.alignment_keeping import (
    KeptAlignment,
    KeptAlignmentError,
    check_one_federation,
    kept_location,
    read_kept,
    write_kept,
)
from clients.alignment_signing import SetSigning
from clients.alignment_update import update_alignment
from clients.local.asgi import InProcessTransport
from clients.service_http import ConnectionOptions, ServiceError

BASE_URL = "http://glasu.inprocess"
PEER_WAIT_SECONDS = 120.0  # the parties are threads of this process: none is ever far behind


def align_in_process(
    party_ids: Sequence[Sequence[str]],
    *,
    seed: int,
    nodes: str = "intersection",
    progress: bool = False,
    kept: Sequence[KeptAlignment] | None = None,
    keep: bool = False,
    now: float | None = None,
    database: Path | None = None,
) -> list[AlignmentOutcome]:
    """Align the parties' ids (one sequence per party, in its row order); the outcome of each
    party, in order. ``kept``: each party's kept alignment, updated (an update of their
    alignment, which the service's ``database`` keeps); with it or ``keep`` an outcome's
    ``kept`` is what the party keeps next, dated ``now`` when fresh. ``database``: the
    service's (default: a temporary one). Raises :class:`clients.alignment.AlignmentFailed`
    (e.g. no shared id)."""
    from service.app import create_app
    from service.settings import ServiceSettings

    admin_token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="glasu-align-") as tmp:
        app = create_app(
            ServiceSettings(
                database=database or Path(tmp) / "alignment.sqlite3", admin_token=admin_token
            )
        )
        transport = InProcessTransport(app)
        try:
            with AdminClient(base_url=BASE_URL, token=admin_token, transport=transport) as admin:
                created = admin.create_alignment(
                    {
                        "parties": len(party_ids),
                        "seed": seed,
                        "nodes": nodes,
                        "label": "glasu score" if keep or kept else "glasu train --party",
                        "keep": keep,
                        "base": None if kept is None else kept[0].alignment_id,
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
                        None if kept is None else kept[m],
                        keep,
                        now,
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
    kept: KeptAlignment | None,
    keep: bool,
    now: float | None,
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
        if kept is not None:
            return update_alignment(client, ids, kept, signing=signing, progress=progress)
        return align(client, ids, signing=signing, progress=progress, keep=keep, now=now)


def align_keeping(
    folders: Sequence[Path],
    party_ids: Sequence[Sequence[str]],
    *,
    seed: int,
    nodes: str = "intersection",
    progress: bool = False,
    realign: bool = False,
    now: float | None = None,
) -> tuple[list[AlignmentOutcome], str]:
    """:func:`align_in_process` through the alignment each party keeps
    (``clients/alignment_keeping.py``: with its organisation's ledger, or in its folder):
    updated, or made afresh (none kept yet, ``realign``, or its keys due to rotate at some
    party), then kept again. The outcomes, and a note for people
    on which it was. A kept file that was changed, or is another party's or another
    federation's, is refused with its path (:class:`KeptAlignmentError`)."""
    now = time.time() if now is None else now
    parties = len(folders)
    paths = [kept_location(folders, m) for m in range(parties)]
    found = [read_kept(path, parties=parties, party=m) for m, path in enumerate(paths)]
    kept: list[KeptAlignment] | None = None
    if realign:
        note = "a fresh alignment with new keys (--realign)"
    elif any(one is None for one in found):
        missing = [p for p, one in zip(paths, found, strict=True) if one is None]
        note = (
            f"a fresh alignment with new keys (none kept yet at {len(missing)} of {parties} "
            f"parties, e.g. {missing[0]}); kept for the next"
        )
    else:
        kept = [one for one in found if one is not None]
        check_one_federation(kept, [str(path) for path in paths])
        due = next(
            (f"{p}: {why}" for p, one in zip(paths, kept, strict=True)
             if (why := one.rotation_due(now)) is not None),
            None,
        )  # fmt: skip
        if due is not None:
            kept = None
            note = f"a fresh alignment with new keys, rotated ({due})"
        else:
            note = f"the kept alignment updated (update {kept[0].updates + 1} of its keys)"
    database = service_database(paths[0])
    if nodes != "intersection":
        kept = None  # only an intersection is kept and updated
        note = "a fresh alignment with new keys (the union is aligned afresh every time)"
    if kept is None:
        database.unlink(missing_ok=True)  # a fresh alignment: what the service kept is moot
    try:
        outcomes = align_in_process(
            party_ids,
            seed=seed,
            nodes=nodes,
            progress=progress,
            kept=kept,
            keep=nodes == "intersection",
            now=now,
            database=database,
        )
    except ServiceError as exc:
        if kept is None or exc.status not in (404, 409):
            raise
        raise KeptAlignmentError(
            f"the service's database {database} cannot update the kept alignment "
            f"{kept[0].alignment_id} ({exc.problem.get('detail', exc)}): realign (--realign) to "
            "start afresh"
        ) from None
    for path, outcome in zip(paths, outcomes, strict=True):
        if outcome.kept is not None:
            write_kept(outcome.kept, path)
    blinded = sum(outcome.kept.blinded_last for outcome in outcomes if outcome.kept is not None)
    return outcomes, f"{note}; {blinded} blindings, at all parties and hops"


def service_database(kept_path: Path) -> Path:
    """Where this machine, the federation's service, keeps its alignments: beside party 0's
    kept alignment (its fully blinded sets: docs/threat-model.md, "Entity alignment")."""
    return kept_path.with_name(kept_path.stem + "-service.sqlite3")
