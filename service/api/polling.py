"""The long-poll downloads' ``?wait=`` and the poll itself (:func:`service.notify.long_poll`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Query

from service.context import ServiceContext
from service.notify import long_poll
from service.settings import MAX_LONG_POLL_SECONDS

T = TypeVar("T")

WaitQuery = Annotated[
    float | None,
    Query(
        ge=0,
        le=MAX_LONG_POLL_SECONDS,
        description="Seconds to wait for completion (default and cap: GLASU_LONG_POLL_SECONDS).",
    ),
]


async def poll(context: ServiceContext, key: str, check: Callable[[], T], wait: float | None) -> T:
    """``check`` until it stops answering ``Pending``, for the ``wait`` the client asked (at
    most, and by default, GLASU_LONG_POLL_SECONDS), woken by the notifications of ``key``."""
    limit = context.settings.long_poll_seconds
    timeout = limit if wait is None else min(wait, limit)
    return await long_poll(context.notifier, key, check, timeout=timeout)
