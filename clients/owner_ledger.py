"""The data owner's ledger: every release of this organisation's data, across sessions, kept by
its own worker (the service keeps its own privacy ledger of each session's releases, in
``service.store``; neither is ``secure.accounting.PrivacyBudget``, a session's count in memory).

One SQLite file per organisation, wherever its data is (mode 0600; :func:`ledger_location`).
A row is written, and synced to disk, *before* the release it records leaves the worker,
so a crash can only over-count. A release is identified by (session, pass, layer, release
digest, mechanism digest): the session id is the one the owner configured; the release digest
(``secure.release_noise.release_digest``) changes with anything the release depends on and with
every parameter of the mechanism that noised it (``secure.release_noise.ReleaseMechanism``: z,
noise std, clip, sensitivity, occurrence cap, shared noise, M, layer, width, encoding), whose
own digest the row keeps too. The noise is derived from the release digest, so a recomputed
pass is either the byte-identical release (same inputs, same mechanism, same noise: one row,
:meth:`OwnerLedger.recorded` says so only when both digests match) or another release (another
row), never a second release under one row. Rows of ledgers from before the mechanism was part
of a release's identity (no mechanism digest) never match a new release.

Each session record keeps the mechanism the worker admitted the session with
(:meth:`OwnerLedger.session_mechanism`): a session id comes back only with the same mechanism,
and only to a worker that resumes it from its checkpoint (``clients.policy.admit_session_id``).
The ledger also keeps the worker's noise secret (``secure.release_noise.ReleaseSecret``), so
that the noise and the record of the releases it masked live and die together.

Each row keeps the noise multiplier the release was accounted with; the releases compose
exactly as one Gaussian release with ``z = 1 / sqrt(sum 1 / z_i^2)`` (at sample rate 1 the
Gaussian mechanisms' privacy loss distributions compose to a Gaussian one: RDP alpha / (2 z_i^2)
adds up, and so does mu^2 = 1 / z_i^2 in Gaussian DP), so sessions with
different noise add up without approximation (``secure.accounting.composed_epsilon``).

Where it lives: the file ``--ledger`` names, or by default
``$XDG_DATA_HOME/glasu/ledgers/<organisation>.sqlite3``, the organisation being the name
``glasu prepare`` wrote into the data folder, so that every copy of its data (its tables
prepared again) counts in one ledger; a folder without one (a benchmark partition's synthetic
party, a folder of an older ``glasu prepare``) keeps it beside the data
(``<data>/privacy-ledger.sqlite3``), as before. Several workers of one organisation may write
it at once: every write is one ``BEGIN IMMEDIATE`` transaction (waiting out the others within
the busy timeout), and :meth:`OwnerLedger.exclusive` makes a release's budget check and its
row one transaction.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from secure.accounting import AccountantName, composed_epsilon
from secure.release_noise import ReleaseSecret

LEDGER_FILENAME = "privacy-ledger.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    pass_index INTEGER NOT NULL,
    noise_multiplier REAL NOT NULL CHECK (noise_multiplier > 0),
    released_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    label TEXT,
    partners TEXT,
    operator TEXT,
    kind TEXT,
    created_at REAL,
    admitted_at REAL NOT NULL,
    clients INTEGER,
    adversaries TEXT,
    test_accuracy REAL,
    reference_test_accuracy REAL
);
CREATE TABLE IF NOT EXISTS noise_secret (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS request_nonces (
    nonce TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    used_at REAL NOT NULL
);
"""
# Ledgers from before release digests (and release kinds, and mechanisms) gain the columns
# (their rows keep NULL, and read as before); the unique index makes "one row per release" a
# constraint, not a convention.
_RELEASE_COLUMNS = {
    "layer": "INTEGER",
    "release_digest": "TEXT",
    "kind": "TEXT",
    "mechanism": "TEXT",
    "adversaries": "TEXT",
}
_SESSION_COLUMNS = {
    "mechanism": "TEXT",
    "encoding": "TEXT",
    "predictions_shared": "INTEGER",
    "post_processes": "TEXT",
}
#: What a release was for: a training pass, an evaluation pass, or a scoring session's pass.
ReleaseKind = Literal["training", "evaluation", "scoring"]
#: The columns of a release as reports and the ledger digest see them (never the noise secret).
RELEASE_FIELDS = (
    "session_id",
    "pass_index",
    "layer",
    "release_digest",
    "noise_multiplier",
    "released_at",
    "kind",
    "mechanism",
)
#: Written only for releases of split noise (a JSON object: adversary key -> the z it faced in
#: that release, null where it sees none); a snapshot shows it only where it is set, so the
#: digest of every ledger without split noise is the one it had before.
RELEASE_ADVERSARIES = "adversaries"
#: How the session's shares travelled (``secure.protocol.ShareEncoding``: who could read a
#: share); a snapshot shows it only where it is set, so older ledgers keep their digest.
SESSION_ENCODING = "encoding"
#: How many of the organisation's predictions went to its partners in the session (a scoring
#: session that shares its answer); shown, like the encoding, only where it is set.
SESSION_PREDICTIONS_SHARED = "predictions_shared"
#: A scoring session of a kept private sign model: the training session whose release it
#: post-processes (it releases nothing itself); shown only where it is set.
SESSION_POST_PROCESSES = "post_processes"
SESSION_FIELDS = (
    "session_id",
    "label",
    "partners",
    "operator",
    "kind",
    "created_at",
    "admitted_at",
    "clients",
    "adversaries",
    "test_accuracy",
    "reference_test_accuracy",
    "mechanism",
)
#: Shown by a snapshot only where set, so that older ledgers keep their digest.
OPTIONAL_SESSION_FIELDS = (SESSION_ENCODING, SESSION_PREDICTIONS_SHARED, SESSION_POST_PROCESSES)
# the index of ledgers from before the mechanism was part of a release's identity is replaced
_OLD_RELEASE_INDEX = "DROP INDEX IF EXISTS one_row_per_release"
_RELEASE_INDEX = (
    "CREATE UNIQUE INDEX IF NOT EXISTS one_row_per_release_v2"
    " ON releases (session_id, pass_index, layer, release_digest, mechanism)"
)


@dataclass(frozen=True)
class SessionSpend:
    session_id: str
    releases: int
    inverse_square_sum: float  # sum of 1 / z_i^2 over the session's releases
    first_at: float
    last_at: float


@dataclass(frozen=True)
class SessionAbout:
    """What the owner's worker learnt of a session when it admitted it: who created it (the
    operator), with whom (the partners' labels), what for (label, kind), and how each adversary's
    noise relates to the one the ledger composes (``adversaries``: key, name, note and ``factor``
    = (z_ledger / z_adversary)^2, null when it sees no release)."""

    label: str | None = None
    partners: Sequence[str] | None = None
    operator: str | None = None
    kind: str | None = None
    created_at: float | None = None
    clients: int | None = None
    adversaries: Sequence[dict[str, Any]] | None = None
    encoding: str | None = None  # the session's share encoding ("bfv-masked": masked shares)
    # a scoring of a kept release: the training session whose release it post-processes
    post_processes: str | None = None


@dataclass(frozen=True)
class LedgerSnapshot:
    """Every release row and session record of a ledger, read in one transaction."""

    path: Path
    releases: list[dict[str, Any]]  # RELEASE_FIELDS, in the order they were written
    sessions: dict[str, dict[str, Any]]  # SESSION_FIELDS by session id (partners, adversaries
    # decoded)

    @property
    def digest(self) -> str:
        """SHA-256 over a canonical dump of the rows (the noise secret is not in it)."""
        dump = {
            "releases": self.releases,
            "sessions": [self.sessions[k] for k in sorted(self.sessions)],
        }
        text = json.dumps(dump, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


class OwnerLedger:
    """The durable record of what this organisation has released (one SQLite file)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0600 from the start: the ledger holds the noise secret (and so do its -wal/-shm files)
        old_umask = os.umask(0o077)
        try:
            self._connection = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
            self._connection.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old_umask)
        with suppress(OSError):  # a ledger written by an earlier version may be 0644
            os.chmod(self.path, 0o600)
        # FULL: a committed row survives power loss before the release it records is sent.
        self._connection.execute("PRAGMA synchronous=FULL")
        self._connection.executescript(_SCHEMA)
        # one writer at a time: two workers of the organisation may open an older ledger at once
        with self._transaction() as tx:
            for table, added in (("releases", _RELEASE_COLUMNS), ("sessions", _SESSION_COLUMNS)):
                columns = {row[1] for row in tx.execute(f"PRAGMA table_info({table})")}
                for name, kind in added.items():
                    if name not in columns:
                        tx.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            tx.execute(_OLD_RELEASE_INDEX)
            tx.execute(_RELEASE_INDEX)

    @classmethod
    def beside(cls, data_dir: Path) -> OwnerLedger:
        return cls(Path(data_dir) / LEDGER_FILENAME)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> OwnerLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the ledger's write lock: what is read and written inside (a release's budget
        check and its row) is one transaction, which no other worker of this organisation can
        interleave with (it waits up to the busy timeout)."""
        with self._transaction():
            yield

    @contextmanager
    def _transaction(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        if self._connection.in_transaction:  # inside exclusive(): part of its transaction
            yield self._connection
            return
        self._connection.execute(f"BEGIN {mode}")
        try:
            yield self._connection
        except BaseException:
            self._connection.execute("ROLLBACK")
            raise
        self._connection.execute("COMMIT")

    def noise_secret(self) -> ReleaseSecret:
        """The worker's noise secret, created with the ledger (it never leaves this file)."""
        with self._transaction() as tx:
            row = tx.execute("SELECT secret FROM noise_secret WHERE id = 1").fetchone()
            if row is None:
                secret = ReleaseSecret.generate()
                tx.execute(
                    "INSERT INTO noise_secret (id, secret) VALUES (1, ?)", (secret.to_bytes(),)
                )
                return secret
        return ReleaseSecret(bytes(row[0]))

    def record(
        self,
        *,
        session_id: str,
        pass_index: int,
        noise_multiplier: float,
        layer: int | None = None,
        release_digest: str | None = None,
        kind: ReleaseKind | None = None,
        mechanism: str | None = None,
        adversaries: Mapping[str, float | None] | None = None,
    ) -> bool:
        """Record one release; False (and nothing written) if this very release, the same
        (session, pass, layer, release digest, ``mechanism`` digest), is already recorded:
        sending it again reveals nothing new. Any other release counts, even of a pass seen
        before. ``adversaries`` (split noise): the z each adversary faces in this release."""
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier}")
        with self._transaction() as tx:
            inserted = tx.execute(
                "INSERT INTO releases (session_id, pass_index, layer, release_digest,"
                " noise_multiplier, released_at, kind, mechanism, adversaries)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    session_id,
                    pass_index,
                    layer,
                    release_digest,
                    float(noise_multiplier),
                    time.time(),
                    kind,
                    mechanism,
                    _adversaries_json(adversaries),
                ),
            ).rowcount
        return inserted == 1

    def recorded(
        self, *, session_id: str, pass_index: int, layer: int, release_digest: str, mechanism: str
    ) -> bool:
        """Whether this very release is in the ledger: the same session, pass, layer, release
        digest and mechanism digest (a row without a mechanism, from an earlier version, never
        matches), so that only a byte-identical upload is "already recorded"."""
        row = self._connection.execute(
            "SELECT 1 FROM releases WHERE session_id = ? AND pass_index = ? AND layer = ?"
            " AND release_digest = ? AND mechanism = ?",
            (session_id, pass_index, layer, release_digest, mechanism),
        ).fetchone()
        return row is not None

    def inverse_square_sum(self, *, session_id: str | None = None) -> float:
        """Sum of 1 / z_i^2 over all releases (or one session's)."""
        query = "SELECT COALESCE(SUM(1.0 / (noise_multiplier * noise_multiplier)), 0) FROM releases"
        args: tuple[str, ...] = ()
        if session_id is not None:
            query += " WHERE session_id = ?"
            args = (session_id,)
        return float(self._connection.execute(query, args).fetchone()[0])

    def releases(self, *, session_id: str | None = None) -> int:
        query, args = "SELECT COUNT(*) FROM releases", ()
        if session_id is not None:
            query, args = query + " WHERE session_id = ?", (session_id,)
        return int(self._connection.execute(query, args).fetchone()[0])

    def sessions(self) -> list[SessionSpend]:
        rows = self._connection.execute(
            "SELECT session_id, COUNT(*), SUM(1.0 / (noise_multiplier * noise_multiplier)),"
            " MIN(released_at), MAX(released_at) FROM releases GROUP BY session_id"
            " ORDER BY MIN(id)"
        ).fetchall()
        return [SessionSpend(r[0], int(r[1]), float(r[2]), float(r[3]), float(r[4])) for r in rows]

    def epsilon(
        self, *, delta: float, accountant: AccountantName, session_id: str | None = None
    ) -> float:
        return composed_epsilon(
            inverse_square_sum=self.inverse_square_sum(session_id=session_id),
            delta=delta,
            accountant=accountant,
        )

    def note_session(
        self, session_id: str, about: SessionAbout, *, mechanism: str | None = None
    ) -> None:
        """Keep what the worker learnt of the session when it admitted it, and the canonical
        description of its release ``mechanism`` (``ReleaseMechanism.canonical``); a session
        admitted again (a resumed worker) keeps its first record (a record from an earlier
        version, without a mechanism, gains this one)."""
        partners = None if about.partners is None else json.dumps(list(about.partners))
        adversaries = None if about.adversaries is None else json.dumps(list(about.adversaries))
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO sessions (session_id, label, partners, operator, kind, created_at,"
                " admitted_at, clients, adversaries, mechanism, encoding, post_processes)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    session_id,
                    about.label,
                    partners,
                    about.operator,
                    about.kind,
                    about.created_at,
                    time.time(),
                    about.clients,
                    adversaries,
                    mechanism,
                    about.encoding,
                    about.post_processes,
                ),
            )
            if mechanism is not None:
                tx.execute(
                    "UPDATE sessions SET mechanism = ? WHERE session_id = ? AND mechanism IS NULL",
                    (mechanism, session_id),
                )

    def session_mechanism(self, session_id: str) -> str | None:
        """The release mechanism the session was admitted with (None: never admitted, or
        admitted by an earlier version)."""
        row = self._connection.execute(
            "SELECT mechanism FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return None if row is None else row[0]

    def note_predictions_shared(self, session_id: str, rows: int) -> None:
        """Count ``rows`` more of this organisation's predictions sent to its partners in the
        session (a scoring session that shares its answer), before they leave: a disclosure its
        owner agreed to, not a noisy release (no epsilon)."""
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO sessions (session_id, admitted_at, predictions_shared)"
                " VALUES (?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET predictions_shared ="
                " COALESCE(sessions.predictions_shared, 0) + excluded.predictions_shared",
                (session_id, time.time(), rows),
            )

    def claim_request_nonce(self, nonce: str, session_id: str) -> str | None:
        """Keep ``nonce`` (of a signed online request, ``clients/request_signing.py``) as
        request session ``session_id``'s: None when it is new or already that session's (a
        restarted worker), else the request session that used it first (a replay)."""
        with self._transaction() as tx:
            row = tx.execute(
                "SELECT session_id FROM request_nonces WHERE nonce = ?", (nonce,)
            ).fetchone()
            if row is None:
                tx.execute(
                    "INSERT INTO request_nonces (nonce, session_id, used_at) VALUES (?, ?, ?)",
                    (nonce, session_id, time.time()),
                )
                return None
        return None if row[0] == session_id else str(row[0])

    def predictions_shared(self, session_id: str) -> int:
        """How many of this organisation's predictions went to its partners in the session."""
        row = self._connection.execute(
            "SELECT predictions_shared FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def note_accuracy(
        self, session_id: str, *, test_accuracy: float, reference_test_accuracy: float | None
    ) -> None:
        """The session's last evaluation, here and alone (the party without federation): they
        stay in this file, like the worker's result file."""
        with self._transaction() as tx:
            tx.execute(
                "UPDATE sessions SET test_accuracy = ?, reference_test_accuracy = ?"
                " WHERE session_id = ?",
                (test_accuracy, reference_test_accuracy, session_id),
            )

    def snapshot(self) -> LedgerSnapshot:
        """Every release and session record, consistent with each other (one transaction: a
        worker writing meanwhile adds its rows before or after, never between two reads)."""
        with self._transaction("DEFERRED") as tx:
            releases = tx.execute(
                f"SELECT {', '.join(RELEASE_FIELDS)}, {RELEASE_ADVERSARIES} FROM releases"
                " ORDER BY id"
            ).fetchall()
            sessions = tx.execute(
                f"SELECT {', '.join(SESSION_FIELDS)}, {', '.join(OPTIONAL_SESSION_FIELDS)}"
                " FROM sessions ORDER BY admitted_at"
            ).fetchall()
        records = {}
        for row in sessions:
            record = dict(zip(SESSION_FIELDS, row[: len(SESSION_FIELDS)], strict=True))
            for name in ("partners", "adversaries"):
                if record[name] is not None:
                    record[name] = json.loads(record[name])
            optional = zip(OPTIONAL_SESSION_FIELDS, row[len(SESSION_FIELDS) :], strict=True)
            record.update({name: value for name, value in optional if value is not None})
            records[record["session_id"]] = record
        return LedgerSnapshot(
            path=self.path, releases=[_release_row(row) for row in releases], sessions=records
        )


def _adversaries_json(adversaries: Mapping[str, float | None] | None) -> str | None:
    if adversaries is None:
        return None
    return json.dumps(dict(adversaries), sort_keys=True, allow_nan=False)


def _release_row(row: Sequence[Any]) -> dict[str, Any]:
    """A release row as a snapshot shows it: :data:`RELEASE_FIELDS`, and the adversaries' z
    (decoded) where the row has them."""
    record = dict(zip(RELEASE_FIELDS, row[: len(RELEASE_FIELDS)], strict=True))
    if row[-1] is not None:
        record[RELEASE_ADVERSARIES] = json.loads(row[-1])
    return record


# -- where an organisation's ledger lives -------------------------------------------------------

#: The key of ``meta.json`` under which ``glasu prepare`` writes whose data the folder holds.
ORGANISATION_KEY = "organisation"
_ORGANISATION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class LedgerLocationError(ValueError):
    """The ledger a flow would write is not the one this data's earlier releases are in."""


def check_organisation_name(name: str) -> str:
    """``name`` if it can name an organisation (and its ledger file); ValueError otherwise."""
    if not _ORGANISATION_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} cannot name an organisation: use 1 to 100 letters, digits, '.', '_' or "
            "'-', starting with a letter or a digit"
        )
    return name


def organisations_folder() -> Path:
    """Where glasu keeps what an organisation keeps across copies of its data:
    ``$XDG_DATA_HOME/glasu`` (``~/.local/share/glasu`` where ``XDG_DATA_HOME`` is unset)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "glasu"


def ledgers_folder() -> Path:
    """Where the organisations' ledgers live by default: ``$XDG_DATA_HOME/glasu/ledgers``."""
    return organisations_folder() / "ledgers"


def organisation_ledger(organisation: str) -> Path:
    """The default ledger of ``organisation``."""
    return ledgers_folder() / f"{check_organisation_name(organisation)}.sqlite3"


def folder_organisation(folder: Path) -> str | None:
    """The organisation ``glasu prepare`` wrote into ``folder``, or None (a benchmark
    partition's folder, a folder of an older ``glasu prepare``, no folder at all)."""
    from models.data.party import META

    try:
        meta = json.loads((Path(folder) / META).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    name = meta.get(ORGANISATION_KEY) if isinstance(meta, dict) else None
    return None if name is None else check_organisation_name(str(name))


def ledger_location(data: Path | None, *, ledger: Path | None = None) -> Path:
    """The owner's ledger of a flow on the data folder ``data``: ``ledger`` (``--ledger``) when
    given; else the default ledger of the organisation the folder names, whichever copy of the
    organisation's data it is (``prepared/bank`` and ``current/bank`` alike); else, in a folder
    without an organisation, ``<data>/privacy-ledger.sqlite3``.

    :class:`LedgerLocationError` when ``data`` holds a ledger beside it (written there by an
    older glasu) that is not the chosen one: its releases would silently stop counting. The
    message says how to move it."""
    beside = None if data is None else Path(data) / LEDGER_FILENAME
    organisation = None if data is None else folder_organisation(Path(data))
    if ledger is None and organisation is None:
        if beside is None:
            raise ValueError("give a data folder or a ledger")
        return beside
    chosen = Path(ledger) if ledger is not None else organisation_ledger(str(organisation))
    if beside is not None and beside.exists() and not _same_file(beside, chosen):
        whose = f"organisation {organisation!r}" if ledger is None else "--ledger"
        if chosen.exists():
            raise LedgerLocationError(
                f"{beside} holds earlier releases of this data (an older glasu kept the ledger "
                f"beside the data), and {chosen}, the ledger of {whose}, holds others: glasu "
                f"does not merge two ledgers; give --ledger {beside} to go on with the first"
            )
        raise LedgerLocationError(
            f"{beside} holds earlier releases of this data (an older glasu kept the ledger "
            f"beside the data); the ledger of {whose} is now {chosen}: with no worker running, "
            f"move it there (mkdir -p {chosen.parent} && mv {beside} {chosen}) so that they "
            f"keep counting, or give --ledger {beside}"
        )
    return chosen


@dataclass(frozen=True)
class PartyLedgers:
    """Each party's privacy ledger, its organisation's own (it outlives the run: every run on
    any copy of the organisation's data counts in it), and the lifetime cap every worker of the
    run applies to its ledger (the run's per-session cap is the run's own budget)."""

    paths: list[Path]
    max_lifetime_epsilon: float


def party_ledgers(folders: Sequence[Path], chosen: Sequence[Path] | None = None) -> list[Path]:
    """The ledger of each party's organisation (``clients.owner_ledger.ledger_location``), or
    ``chosen`` (``--ledger``, one per party in the same order: the command checks that);
    ValueError when two parties would write one ledger (two folders of one organisation are one
    party, not two)."""
    ledgers = [None] * len(folders) if chosen is None else chosen
    paths = [
        ledger_location(Path(folder), ledger=ledger)
        for folder, ledger in zip(folders, ledgers, strict=True)
    ]
    seen: dict[Path, int] = {}
    for m, path in enumerate(paths):
        first = seen.setdefault(path.resolve(), m)
        if first != m:
            raise ValueError(
                f"--party {folders[first]} and --party {folders[m]} would count their releases "
                f"in one privacy ledger ({path}): they are folders of one organisation; give "
                "each organisation's `glasu prepare` its own --organisation"
            )
    return paths


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and a.samefile(b))
    except OSError:
        return False
