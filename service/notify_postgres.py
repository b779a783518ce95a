"""Long-poll wake-ups across replicas: :class:`PostgresNotifier`, PostgreSQL LISTEN/NOTIFY.

Every ``glasu serve`` replica on one PostgreSQL database keeps two connections of its own, opened
from the database URL with psycopg directly (not from the store's pool: one is always busy
listening):

- the listener, in a thread, LISTENs on channel :data:`CHANNEL` and wakes this process's waiters
  of the session each notification names (the payload is the session id, or an alignment's
  notification key), exactly as a local :meth:`~service.notify.SessionNotifier.notify` does;
- the sender, in a thread, runs ``pg_notify`` for every :meth:`PostgresNotifier.notify`. A
  notification is queued by the request after the transaction that changed the session has
  committed (the routes notify once the engine returns; the engine notifies after its commit),
  and sent in its own autocommit statement: the other replicas' checks see the change.

A waiter subscribes before it checks the database, so a change committed before its check is
seen by the check and one committed after reaches it by notification, as long as the listener
listens. A lost listening connection is reconnected (at once, then backing off up to
:data:`MAX_RECONNECT_SECONDS`); notifications sent meanwhile are lost, so on reconnecting every
waiter of the process is woken to check again. A notification the sender fails to send twice
(its connection lost and not back) is logged and lost: the other replicas' waiters then answer at
their deadline, as a client that polls again would.

A replica ignores the echo of its own notifications (same sender backend pid): its waiters were
woken locally already.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid

import psycopg

from service.clock import Clock
from service.notify import SessionNotifier

logger = logging.getLogger("glasu.service")

#: The NOTIFY channel of the replicas; the payload is a session id (or an alignment's key).
CHANNEL = "glasu_sessions"
MAX_RECONNECT_SECONDS = 5.0
_STOP_JOIN_SECONDS = 5.0
_STOP = ""  # the sender's queue: stop after sending what came before


class PostgresNotifier(SessionNotifier):
    """:class:`~service.notify.SessionNotifier` whose notifications also reach the other
    replicas. Opens its listening connection before returning, so a wrong URL stops start-up."""

    def __init__(self, clock: Clock, database_url: str) -> None:
        super().__init__(clock)
        self._url = database_url
        self._stop_channel = f"glasu_stop_{uuid.uuid4().hex}"  # LISTENed by this process only
        self._stopping = threading.Event()
        self._outbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._sender_pid: int | None = None
        #: Set while the listener LISTENs (cleared when its connection is lost).
        self.listening = threading.Event()
        #: The listening connection's backend process id (for operators and tests).
        self.listener_pid: int | None = None
        connection = self._connect_listener()
        self._listener = threading.Thread(
            target=self._listen, args=(connection,), name="glasu-listen", daemon=True
        )
        self._sender = threading.Thread(target=self._send, name="glasu-notify", daemon=True)
        self._listener.start()
        self._sender.start()

    def notify(self, session_id: str) -> None:
        super().notify(session_id)
        self._outbox.put(session_id)

    def notify_threadsafe(self, session_id: str) -> None:
        self._call_on_loop(self._wake_local, session_id)
        self._outbox.put(session_id)

    def close(self) -> None:
        """Send what is queued, stop both threads and close their connections."""
        self._stopping.set()
        self._outbox.put(_STOP)
        self._sender.join(_STOP_JOIN_SECONDS)
        self._listener.join(_STOP_JOIN_SECONDS)

    def _connect_listener(self) -> psycopg.Connection:
        connection = psycopg.connect(self._url, autocommit=True)
        try:
            connection.execute(f"LISTEN {CHANNEL}")
            connection.execute(f"LISTEN {self._stop_channel}")
        except BaseException:
            connection.close()
            raise
        self.listener_pid = connection.info.backend_pid
        self.listening.set()
        return connection

    def _listen(self, connection: psycopg.Connection | None) -> None:
        while connection is not None:
            try:
                with connection:
                    for note in connection.notifies():
                        if note.channel != CHANNEL:  # our stop channel
                            return
                        if note.pid != self._sender_pid:
                            self._call_on_loop(self._wake_local, note.payload)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stopping.is_set():
                    return
                logger.warning("lost the LISTEN connection (%s); reconnecting", exc)
            connection = self._reconnect_listener()
            if connection is not None:
                # Whatever was notified while we were not listening is lost: check again.
                self._call_on_loop(self._wake_everybody)

    def _reconnect_listener(self) -> psycopg.Connection | None:
        """A listening connection, or None once stopping."""
        delay = 0.0
        while not self._stopping.wait(delay):
            try:
                return self._connect_listener()
            except psycopg.Error as exc:
                delay = min(max(2 * delay, 0.05), MAX_RECONNECT_SECONDS)
                logger.warning("cannot LISTEN (%s); retrying in %.2f s", exc, delay)
        return None

    def _send(self) -> None:
        connection: psycopg.Connection | None = None
        stopping = False
        while not stopping:
            keys = {self._outbox.get()}
            while True:  # one statement for everything queued meanwhile
                try:
                    keys.add(self._outbox.get_nowait())
                except queue.Empty:
                    break
            stopping = _STOP in keys
            keys.discard(_STOP)
            notes = [(CHANNEL, key) for key in sorted(keys)]
            if stopping:
                notes.append((self._stop_channel, ""))
            connection = self._send_notes(connection, notes)
        if connection is not None:
            connection.close()

    def _send_notes(
        self, connection: psycopg.Connection | None, notes: list[tuple[str, str]]
    ) -> psycopg.Connection | None:
        """Send ``notes`` (channel, payload), reconnecting once if the connection was lost; the
        connection to use next (None: reconnect next time)."""
        for attempt in (1, 2):
            try:
                if connection is None or connection.closed:
                    connection = psycopg.connect(self._url, autocommit=True)
                    self._sender_pid = connection.info.backend_pid
                connection.execute(
                    "SELECT pg_notify(channel, payload)"
                    " FROM unnest(%s::text[], %s::text[]) AS n(channel, payload)",
                    ([c for c, _ in notes], [p for _, p in notes]),
                )
                return connection
            except psycopg.Error as exc:
                if connection is not None:
                    connection.close()
                connection = None
                if attempt == 2:
                    logger.error("could not send %d notifications: %s", len(notes), exc)
        return None
