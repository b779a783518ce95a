"""The service's store, on SQLite or PostgreSQL (see :mod:`.database`)."""

from service.store.accounts import LedgerRow, MetricsRow
from service.store.database import Store, Transaction
from service.store.rounds import KIND_NAME, ResultKind, ResultRow, Slot, UploadKind, UploadRow
from service.store.sessions import SessionRow

__all__ = [
    "KIND_NAME",
    "LedgerRow",
    "MetricsRow",
    "ResultKind",
    "ResultRow",
    "SessionRow",
    "Slot",
    "Store",
    "Transaction",
    "UploadKind",
    "UploadRow",
]
