"""Copying an SQLite database into an empty PostgreSQL one (``glasu serve --migrate-to``):
:func:`copy_into_postgres`.

The target must hold no table at all: the copy never merges. Both stores are opened first, with
the alignments' tables (``service/alignment/tables.py``), so both are migrated to the same
schema; then every table of the source is copied, in the order its tables were created (hence
each after the tables it references), and every share and sum body kept in files beside it goes
into the target's table, all in one transaction of the target (all or nothing).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from service.alignment.tables import create_alignment_tables
from service.store.bodies import FileBodies
from service.store.database import Store, Transaction
from service.store.engines import is_database_url

# never copied: each database records its own migrations
_SKIPPED = {"schema_migrations"}


class TargetNotEmpty(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Copied:
    """What a copy moved: the rows of each table (in the order copied) and the bodies."""

    rows: dict[str, int]
    bodies: int


def copy_into_postgres(source: Path, url: str) -> Copied:
    """Copy the SQLite database ``source`` and the bodies kept beside it into the empty
    PostgreSQL database ``url``, in one transaction."""
    if not is_database_url(url):
        raise ValueError(f"--migrate-to takes a postgresql:// URL, not {url!r}")
    if not source.is_file():
        raise FileNotFoundError(f"no SQLite database at {source}")
    _check_empty(url)
    with (
        closing(_open_store(source)) as sqlite,
        closing(_open_store(url)) as postgres,
        postgres.transaction() as tx,
    ):
        rows = _copy_rows(sqlite, tx)
        bodies = 0
        for stored in FileBodies.beside(source).stored():
            tx.put_body(stored.key, stored.path.read_bytes())
            bodies += 1
    return Copied(rows, bodies)


def _open_store(database: Path | str) -> Store:
    """A store with its alignment tables, both migrated to this release's schema."""
    store = Store(database)
    try:
        create_alignment_tables(store)
    except BaseException:
        store.close()
        raise
    return store


def _check_empty(url: str) -> None:
    """Refuse a PostgreSQL database that holds any table (before a store migrates it)."""
    import psycopg

    with psycopg.connect(url) as pg:
        rows = pg.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() ORDER BY 1"
        ).fetchall()
    if rows:
        names = ", ".join(str(name) for (name,) in rows[:5]) + (", ..." if len(rows) > 5 else "")
        raise TargetNotEmpty(
            f"the target database is not empty (it has tables: {names}): --migrate-to copies"
            " only into a new, empty database"
        )


def _copy_rows(source: Store, target: Transaction) -> dict[str, int]:
    """Copy every row of the SQLite ``source`` into ``target``'s database; rows per table."""
    if source.backend != "sqlite":
        raise ValueError("the source of a copy is an SQLite database")
    copied: dict[str, int] = {}
    with source.transaction() as tx:
        tables = [
            str(name)
            for (name,) in tx.connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
            ).fetchall()
            if name not in _SKIPPED
        ]
        for table in tables:
            columns = sorted(tx.connection.columns(table))
            names = ", ".join(columns)
            # rowid: the sessions' order, which the target's identity column keeps
            rows = tx.connection.execute(f"SELECT {names} FROM {table} ORDER BY rowid").fetchall()
            target.connection.executemany(
                f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})", rows
            )
            copied[table] = len(rows)
    return copied
