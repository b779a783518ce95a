"""Where the bodies of a round's shares and sums live: one interface, :class:`Bodies`
(:mod:`.interface`), two places, chosen by :func:`bodies_for`.

- SQLite (one process): files beside the database, :class:`~.files.FileBodies`.
- PostgreSQL (replicas): rows of table ``payloads`` of the same database,
  :class:`~.table.TableBodies`, which every replica reads, and which needs no shared volume.

Node sets and their unions (kilobytes) keep their bodies in the store's own rows; shares and
sums (0.1 to 10 MB each) come here. Measured on the development VM (2 cores shared with other
work, so medians of 10, rough; loopback PostgreSQL 15 with fsync on), a 4 MB share: written as a
file (no sync, as shares are) 6 to 11 ms, as a ``bytea`` row 72 ms (31 at best: the body goes
through the WAL and TOAST); a synced sum 13 to 28 ms vs 46; read back 0.6 ms vs 17 ms (binary
results; 98 ms in text, which hex-encodes it). The database is several times slower, but it is
the only one that every replica reads without a shared file system (NFS, a ReadWriteMany
volume), that commits a body and its row atomically, and that drops a pass's bodies in the
transaction that discards them; and the cost stays off the session's lock (a share is written
before its row's transaction), a share is read back at most once (by whichever replica forms the
sum), and a sum once per replica (then from the recent-sums cache). Hence: files on SQLite, the
database on PostgreSQL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.store.bodies.files import FileBodies
from service.store.bodies.interface import Bodies, BodyKey, BodyMissing
from service.store.bodies.table import TableBodies

if TYPE_CHECKING:
    from service.store import Store


def bodies_for(store: Store) -> Bodies:
    """Files beside an SQLite database; the PostgreSQL database itself."""
    if store.path is not None:
        return FileBodies.beside(store.path)
    return TableBodies(store)


__all__ = [
    "Bodies",
    "BodyKey",
    "BodyMissing",
    "FileBodies",
    "TableBodies",
    "bodies_for",
]
