"""Versioned schema migrations, applied when a store opens, for both databases.

Each *component* (the store's own tables: ``store``; the alignments' tables: ``alignments``,
see ``service/alignment/tables.py``) has its numbered migrations. Table ``schema_migrations``
records the ones applied (component, version, when); :func:`migrate` applies the missing ones
in order, in the caller's transaction (PostgreSQL runs DDL in transactions, and its migrations
take an advisory lock first, so replicas starting together migrate once). A database written by
a newer release (a version this code does not know) is refused.

Every migration is idempotent (``CREATE TABLE IF NOT EXISTS``, columns added only when missing):
a database from before this table existed (SQLite, ``PRAGMA user_version = 1``, possibly with
the columns added in place) is migrated from version 0 to the same schema as a new one.

Plain SQL and a few lines instead of alembic: the migrations are few and additive, alembic
would bring SQLAlchemy into the torch-free service image, and its autogeneration needs models
we do not have.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from service.store.dialect import Connection
from service.store.queries import LOCK_SCOPES

MIGRATIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    description TEXT NOT NULL,
    applied_at REAL NOT NULL,
    PRIMARY KEY (component, version)
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def schema(ddl: str) -> Callable[[Connection], None]:
    """A migration that runs a schema (written for SQLite, see :class:`Dialect`)."""
    return lambda connection: connection.run_schema(ddl)


def added_columns(columns: Sequence[tuple[str, str, str]]) -> Callable[[Connection], None]:
    """A migration adding (table, column, declaration)s, each only where missing."""

    def apply(connection: Connection) -> None:
        for table, column, declaration in columns:
            connection.add_column(table, column, declaration)

    return apply


def added_key_column(
    column: str, declaration: str, tables: Mapping[str, tuple[str, str]]
) -> Callable[[Connection], None]:
    """A migration adding ``column`` (``declaration``, with a default) to the primary key of
    each table where it is missing. ``tables``: name -> (its ``CREATE TABLE IF NOT EXISTS``
    statement with the column, the new primary key's columns). PostgreSQL alters the table in
    place; SQLite cannot change a primary key, so it copies the rows into a new table."""

    def apply(connection: Connection) -> None:
        for table, (create, primary_key) in tables.items():
            if column in connection.columns(table):
                continue
            if connection.backend == "postgresql":
                connection.add_column(table, column, declaration)
                connection.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey")
                connection.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({primary_key})")
                continue
            kept = ", ".join(sorted(connection.columns(table)))
            connection.execute(f"ALTER TABLE {table} RENAME TO {table}_before_{column}")
            connection.run_schema(create)
            connection.execute(
                f"INSERT INTO {table} ({kept}) SELECT {kept} FROM {table}_before_{column}"
            )
            connection.execute(f"DROP TABLE {table}_before_{column}")

    return apply


def applied_version(connection: Connection, component: str) -> int:
    (version,) = connection.execute(
        "SELECT MAX(version) FROM schema_migrations WHERE component = ?", (component,)
    ).fetchone()
    return int(version or 0)


def migrate(
    connection: Connection, component: str, migrations: Sequence[Migration], *, now: float
) -> int:
    """Apply ``component``'s missing migrations; its version afterwards."""
    if [m.version for m in migrations] != list(range(1, len(migrations) + 1)):
        raise ValueError(f"the migrations of {component} must be numbered 1, 2, ...")
    if connection.backend == "postgresql":
        connection.execute(
            "SELECT pg_advisory_xact_lock(CAST(? AS INTEGER), 0)", (LOCK_SCOPES["migrations"],)
        ).fetchone()
    connection.run_schema(MIGRATIONS_SCHEMA)
    current = applied_version(connection, component)
    if current > len(migrations):
        raise RuntimeError(
            f"the database's {component} schema is at version {current}, newer than this"
            f" release knows ({len(migrations)}): upgrade glasu"
        )
    for migration in migrations[current:]:
        migration.apply(connection)
        connection.execute(
            "INSERT INTO schema_migrations (component, version, description, applied_at)"
            " VALUES (?, ?, ?, ?)",
            (component, migration.version, migration.description, now),
        )
    return len(migrations)
