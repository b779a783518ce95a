"""What the service accounts for per session: the clients' metrics, the traffic and the privacy
ledger."""

from __future__ import annotations

from dataclasses import dataclass

from service.store.queries import SESSION_ID_COLUMN, Queries

# as first released; migration 2 adds privacy_ledger.clients (ADDED_COLUMNS)
ACCOUNT_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS pass_metrics (
    {SESSION_ID_COLUMN},
    pass_index INTEGER NOT NULL,
    client_index INTEGER NOT NULL,
    loss REAL,
    val_accuracy REAL,
    test_accuracy REAL,
    train_accuracy REAL,
    reported_at REAL NOT NULL,
    PRIMARY KEY (session_id, pass_index, client_index)
);
CREATE TABLE IF NOT EXISTS traffic (
    {SESSION_ID_COLUMN},
    client_index INTEGER NOT NULL,
    bytes_up INTEGER NOT NULL DEFAULT 0,
    bytes_down INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, client_index)
);
CREATE TABLE IF NOT EXISTS privacy_ledger (
    {SESSION_ID_COLUMN},
    release_index INTEGER NOT NULL,
    pass_index INTEGER NOT NULL,
    epsilon REAL NOT NULL,
    released_at REAL NOT NULL,
    PRIMARY KEY (session_id, release_index),
    UNIQUE (session_id, pass_index)
);
"""


@dataclass(frozen=True, slots=True)
class MetricsRow:
    pass_index: int
    reports: int
    loss: float | None
    val_accuracy: float | None
    test_accuracy: float | None
    train_accuracy: float | None


@dataclass(frozen=True, slots=True)
class LedgerRow:
    release_index: int
    pass_index: int
    epsilon: float
    released_at: float
    clients: list[int] | None  # whose shares it holds; None: all (written before the column)


class AccountQueries(Queries):
    durable: bool

    def upsert_metrics(
        self,
        session_id: str,
        pass_index: int,
        client_index: int,
        *,
        loss: float | None,
        val_accuracy: float | None,
        test_accuracy: float | None,
        train_accuracy: float | None,
    ) -> None:
        self._db.execute(
            "INSERT INTO pass_metrics (session_id, pass_index, client_index, loss,"
            " val_accuracy, test_accuracy, train_accuracy, reported_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (session_id, pass_index, client_index) DO UPDATE SET"
            " loss = excluded.loss, val_accuracy = excluded.val_accuracy,"
            " test_accuracy = excluded.test_accuracy, train_accuracy = excluded.train_accuracy,"
            " reported_at = excluded.reported_at",
            (
                session_id,
                pass_index,
                client_index,
                loss,
                val_accuracy,
                test_accuracy,
                train_accuracy,
                self.now(),
            ),
        )

    def metrics(self, session_id: str) -> list[MetricsRow]:
        """Per pass: the mean of each value over the clients that reported it (AVG skips NULL)."""
        rows = self._db.execute(
            "SELECT pass_index, COUNT(*), AVG(loss), AVG(val_accuracy), AVG(test_accuracy),"
            " AVG(train_accuracy) FROM pass_metrics WHERE session_id = ?"
            " GROUP BY pass_index ORDER BY pass_index",
            (session_id,),
        ).fetchall()
        return [MetricsRow(*row) for row in rows]

    def add_traffic(
        self, session_id: str, client_index: int, *, up: int = 0, down: int = 0
    ) -> None:
        self._db.execute(
            "INSERT INTO traffic (session_id, client_index, bytes_up, bytes_down)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (session_id, client_index) DO UPDATE SET"
            " bytes_up = traffic.bytes_up + excluded.bytes_up,"
            " bytes_down = traffic.bytes_down + excluded.bytes_down",
            (session_id, client_index, up, down),
        )

    def traffic(self, session_id: str) -> dict[int, tuple[int, int]]:
        rows = self._db.execute(
            "SELECT client_index, bytes_up, bytes_down FROM traffic WHERE session_id = ?",
            (session_id,),
        ).fetchall()
        return {int(m): (int(up), int(down)) for m, up, down in rows}

    def ledger(self, session_id: str) -> list[LedgerRow]:
        rows = self._db.execute(
            "SELECT release_index, pass_index, epsilon, released_at, clients FROM privacy_ledger"
            " WHERE session_id = ? ORDER BY release_index",
            (session_id,),
        ).fetchall()
        return [
            LedgerRow(
                *row[:4], clients=None if row[4] is None else [int(m) for m in row[4].split(",")]
            )
            for row in rows
        ]

    def append_ledger(
        self,
        session_id: str,
        *,
        release_index: int,
        pass_index: int,
        epsilon: float,
        at: float,
        clients: list[int],
    ) -> None:
        """Only in a ``durable`` transaction: a ledger row must survive a power loss once the
        release it counts has been served."""
        if not self.durable:
            raise RuntimeError("the privacy ledger is appended only in a durable transaction")
        self._db.execute(
            "INSERT INTO privacy_ledger (session_id, release_index, pass_index, epsilon,"
            " released_at, clients) VALUES (?, ?, ?, ?, ?, ?)",
            (session_id, release_index, pass_index, epsilon, at, ",".join(map(str, clients))),
        )
