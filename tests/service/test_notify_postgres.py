"""Long-poll wake-ups across replicas (service/notify_postgres.py) on a real PostgreSQL: a waiter
of one replica is woken by a change another replica commits and notifies, and a lost LISTEN
connection wakes every waiter once it is back. The clock is a :class:`ManualClock` that nobody
advances, so nothing but a notification ends a wait; each wait is bounded only to fail a
broken test instead of hanging it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from service.clock import ManualClock
from service.notify import Pending, long_poll
from service.notify_postgres import PostgresNotifier
from tests.support.postgres import PostgresCluster

pytestmark = pytest.mark.anyio

FAIL_AFTER = 20.0  # seconds: a broken wake-up fails here, a working one takes milliseconds
SESSION = "session-a"


@pytest.fixture
def database_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    with postgres_cluster.scratch_database() as url:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE TABLE flags (session_id TEXT PRIMARY KEY, value INTEGER)")
        yield url


@pytest.fixture
def make_notifier(database_url: str) -> Iterator[Callable[[], PostgresNotifier]]:
    notifiers: list[PostgresNotifier] = []

    def make() -> PostgresNotifier:
        notifiers.append(PostgresNotifier(ManualClock(), database_url))
        return notifiers[-1]

    yield make
    for notifier in notifiers:
        notifier.close()


class FlagCheck:
    """A long poll's check: the committed flag of ``SESSION``, or Pending; counts its runs and
    sets an event at each Pending answer."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.runs = 0
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Queue[int] = asyncio.Queue()

    def __call__(self) -> int | Pending:
        with psycopg.connect(self._url) as connection:
            row = connection.execute(
                "SELECT value FROM flags WHERE session_id = %s", (SESSION,)
            ).fetchone()
        self.runs += 1
        if row is None:
            self._loop.call_soon_threadsafe(self._waiting.put_nowait, self.runs)
            return Pending(missing=[1])
        return int(row[0])

    async def waited(self) -> int:
        """The number of the next check that answered Pending."""
        return await asyncio.wait_for(self._waiting.get(), FAIL_AFTER)


async def waiting_on_a(
    make_notifier: Callable[[], PostgresNotifier], url: str
) -> tuple[PostgresNotifier, PostgresNotifier, FlagCheck, asyncio.Task[int | Pending]]:
    """Replicas A and B, and a long poll of ``SESSION`` on A that has checked once and waits."""
    replica_a, replica_b = make_notifier(), make_notifier()
    check = FlagCheck(url)
    poll = asyncio.create_task(long_poll(replica_a, SESSION, check, timeout=60))
    assert await check.waited() == 1
    return replica_a, replica_b, check, poll


def commit_flag(url: str, value: int) -> None:
    with psycopg.connect(url) as connection:
        connection.execute("INSERT INTO flags VALUES (%s, %s)", (SESSION, value))


async def test_a_change_committed_through_another_replica_wakes_the_waiter(
    make_notifier: Callable[[], PostgresNotifier], database_url: str
) -> None:
    replica_a, replica_b, check, poll = await waiting_on_a(make_notifier, database_url)
    await asyncio.to_thread(commit_flag, database_url, 7)  # replica B's request commits...
    replica_b.notify(SESSION)  # ...then notifies
    assert await asyncio.wait_for(poll, FAIL_AFTER) == 7
    assert check.runs == 2  # woken once, by the notification
    assert replica_a.waiters(SESSION) == 0


async def test_a_notification_of_another_session_does_not_wake_the_waiter(
    make_notifier: Callable[[], PostgresNotifier], database_url: str
) -> None:
    replica_a, replica_b, check, poll = await waiting_on_a(make_notifier, database_url)
    # Notifications are delivered in order: once the other session's reaches replica A (a
    # waiter of A on it wakes), the one of SESSION comes after it.
    other = FlagCheck(database_url)
    other_poll = asyncio.create_task(long_poll(replica_a, "session-b", other, timeout=60))
    await other.waited()
    replica_b.notify("session-b")
    await other.waited()  # session-b's waiter was woken and checked again
    assert check.runs == 1
    await asyncio.to_thread(commit_flag, database_url, 3)
    replica_b.notify(SESSION)
    assert await asyncio.wait_for(poll, FAIL_AFTER) == 3
    other_poll.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await other_poll


async def test_a_lost_listen_connection_wakes_every_waiter_once_it_is_back(
    make_notifier: Callable[[], PostgresNotifier], database_url: str
) -> None:
    replica_a, replica_b, check, poll = await waiting_on_a(make_notifier, database_url)
    lost_pid = replica_a.listener_pid
    # A notification sent while A does not listen is lost: the reconnection wakes A's waiters.
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (lost_pid,))
    assert await check.waited() == 2  # woken without any notification, and still waiting
    assert replica_a.listening.is_set() and replica_a.listener_pid != lost_pid
    # ...and listens again.
    await asyncio.to_thread(commit_flag, database_url, 5)
    replica_b.notify(SESSION)
    assert await asyncio.wait_for(poll, FAIL_AFTER) == 5


async def test_a_notification_from_a_worker_thread_reaches_the_other_replica(
    make_notifier: Callable[[], PostgresNotifier], database_url: str
) -> None:
    """The round engine notifies from its worker threads (``notify_threadsafe``)."""
    _replica_a, replica_b, _check, poll = await waiting_on_a(make_notifier, database_url)

    def engine_request() -> None:
        commit_flag(database_url, 9)
        replica_b.notify_threadsafe(SESSION)

    worker = threading.Thread(target=engine_request)
    worker.start()
    assert await asyncio.wait_for(poll, FAIL_AFTER) == 9
    worker.join()


def test_a_wrong_url_stops_start_up(postgres_cluster: PostgresCluster) -> None:
    with pytest.raises(psycopg.OperationalError):
        PostgresNotifier(ManualClock(), postgres_cluster.url_of("no_such_database"))
