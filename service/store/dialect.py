"""The thin layer between the store's one set of queries and its two databases.

Every query is written once, in SQL both SQLite and PostgreSQL run (``ON CONFLICT`` upserts,
``?`` placeholders), and every schema once, in SQLite's words (``BLOB``, ``REAL``,
``INTEGER``). :class:`Dialect` rewrites them for PostgreSQL: placeholders become psycopg's
``%s``, ``BLOB`` becomes ``BYTEA``, ``REAL`` ``DOUBLE PRECISION`` and ``INTEGER`` ``BIGINT``
(traffic counters pass 2**31 bytes). :class:`Connection` is what the queries call: the same
``execute`` / ``executemany`` on both.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

Backend = Literal["sqlite", "postgresql"]

_POSTGRES_TYPES = (
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
)


class Rows(Protocol):
    """A cursor after ``execute``: what the queries read from it."""

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Dialect:
    def __init__(self, backend: Backend) -> None:
        self.backend: Backend = backend

    def query(self, sql: str) -> str:
        if self.backend == "sqlite":
            return sql
        return sql.replace("%", "%%").replace("?", "%s")

    def schema(self, ddl: str) -> list[str]:
        """The statements of a schema written for SQLite, in this database's words."""
        if self.backend == "postgresql":
            for pattern, replacement in _POSTGRES_TYPES:
                ddl = pattern.sub(replacement, ddl)
        return [statement.strip() for statement in ddl.split(";") if statement.strip()]


class Connection:
    """A connection of either database, inside one of the store's transactions."""

    def __init__(self, raw: Any, dialect: Dialect) -> None:
        self._raw = raw
        self.dialect = dialect

    @property
    def backend(self) -> Backend:
        return self.dialect.backend

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        if self.backend == "sqlite":
            return self._raw.execute(sql, tuple(params))  # type: ignore[no-any-return]
        # binary results: a bytea body arrives as its bytes, not as text twice its size
        return self._raw.execute(self.dialect.query(sql), tuple(params), binary=True)  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        if isinstance(self._raw, sqlite3.Connection):
            self._raw.executemany(sql, rows)
            return
        with self._raw.cursor() as cursor:
            cursor.executemany(self.dialect.query(sql), [tuple(r) for r in rows])

    def copy_in(self, sql: str, data: Iterable[bytes | memoryview]) -> None:
        """PostgreSQL: run ``COPY ... FROM STDIN`` with ``data``, sent block by block as it is
        produced (psycopg hands libpq at most 128 KiB at a time and waits for it to be sent)."""
        if self.backend != "postgresql":
            raise NotImplementedError("COPY is PostgreSQL's")
        with self._raw.cursor() as cursor, cursor.copy(sql) as copy:
            for block in data:
                copy.write(block)

    def run_schema(self, ddl: str) -> None:
        for statement in self.dialect.schema(ddl):
            self._raw.execute(statement)

    def columns(self, table: str) -> set[str]:
        if self.backend == "sqlite":
            return {row[1] for row in self._raw.execute(f"PRAGMA table_info({table})")}
        rows = self.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        ).fetchall()
        return {str(row[0]) for row in rows}

    def add_column(self, table: str, column: str, declaration: str) -> None:
        """Add the column unless the table has it (a database already written with it)."""
        if column not in self.columns(table):
            (statement,) = self.dialect.schema(
                f"ALTER TABLE {table} ADD COLUMN {column} {declaration}"
            )
            self._raw.execute(statement)
