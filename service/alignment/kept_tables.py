"""The tables of kept alignments and their updates (``KEPT_SCHEMA`` in
``service/alignment/tables.py``): each owner's kept set and positions, an update's removed
positions and each owner's changes, inside one store transaction."""

from __future__ import annotations

from service.store import Transaction


class KeptTables:
    def __init__(self, tx: Transaction) -> None:
        self._db = tx.connection

    def insert_kept(self, alignment_id: str, elements: list[bytes], positions: list[bytes]) -> None:
        self._db.executemany(
            "INSERT INTO alignment_kept (alignment_id, owner, elements, positions)"
            " VALUES (?, ?, ?, ?)",
            [
                (alignment_id, owner, body, placed)
                for owner, (body, placed) in enumerate(zip(elements, positions, strict=True))
            ],
        )

    def kept(self, alignment_id: str) -> tuple[list[bytes], list[bytes]] | None:
        """Each owner's kept elements and positions, by owner; None: nothing kept."""
        rows = self._db.execute(
            "SELECT elements, positions FROM alignment_kept WHERE alignment_id = ? ORDER BY owner",
            (alignment_id,),
        ).fetchall()
        if not rows:
            return None
        return [bytes(row[0]) for row in rows], [bytes(row[1]) for row in rows]

    def kept_elements(self, alignment_id: str, owner: int) -> bytes | None:
        return self._owners_blob("alignment_kept", "elements", alignment_id, owner)

    def drop_kept(self, alignment_id: str) -> None:
        self._db.execute("DELETE FROM alignment_kept WHERE alignment_id = ?", (alignment_id,))

    def insert_removed(self, alignment_id: str, owner: int, body: bytes) -> None:
        self._db.execute(
            "INSERT INTO alignment_removed (alignment_id, owner, body) VALUES (?, ?, ?)",
            (alignment_id, owner, body),
        )

    def removed(self, alignment_id: str) -> dict[int, bytes]:
        rows = self._db.execute(
            "SELECT owner, body FROM alignment_removed WHERE alignment_id = ?", (alignment_id,)
        ).fetchall()
        return {int(owner): bytes(body) for owner, body in rows}

    def insert_changes(self, alignment_id: str, bodies: list[bytes]) -> None:
        self._db.executemany(
            "INSERT INTO alignment_changes (alignment_id, owner, body) VALUES (?, ?, ?)",
            [(alignment_id, owner, body) for owner, body in enumerate(bodies)],
        )

    def changes(self, alignment_id: str, owner: int) -> bytes | None:
        return self._owners_blob("alignment_changes", "body", alignment_id, owner)

    def _owners_blob(self, table: str, column: str, alignment_id: str, owner: int) -> bytes | None:
        row = self._db.execute(
            f"SELECT {column} FROM {table} WHERE alignment_id = ? AND owner = ?",
            (alignment_id, owner),
        ).fetchone()
        return bytes(row[0]) if row else None
