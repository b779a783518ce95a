"""Copying an SQLite database into an empty PostgreSQL one (``glasu serve --migrate-to``).

The target must hold no table at all (:func:`check_empty`): the copy never merges. Both stores
are opened first (so both are migrated to the same schema), then every table of the source is
copied, in the order its tables were created (hence each after the tables it references), in
the target transaction the caller commits with the payload bodies (all or nothing).
"""

from __future__ import annotations

from service.store.database import Store, Transaction

# never copied: each database records its own migrations
_SKIPPED = {"schema_migrations"}


class TargetNotEmpty(ValueError):
    pass


def check_empty(url: str) -> None:
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


def copy_rows(source: Store, target: Transaction) -> dict[str, int]:
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
