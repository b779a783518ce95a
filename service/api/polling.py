"""The long-poll downloads' ``?wait=`` and the poll itself (:func:`service.notify.long_poll`),
answered 202 while still pending (:func:`poll_or_waiting`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Query
from fastapi.responses import JSONResponse

from secure.wire.common import Waiting
from service.context import ServiceContext
from service.notify import Pending, long_poll
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


async def poll_or_waiting(
    context: ServiceContext, key: str, check: Callable[[], T | Pending], wait: float | None
) -> T | JSONResponse:
    """:func:`poll`, its answer as it is, or 202 naming who still owes it once the wait is over
    (the wire's :class:`secure.wire.common.Waiting`)."""
    result = await poll(context, key, check, wait)
    if isinstance(result, Pending):
        waiting = Waiting(missing=result.missing)
        return JSONResponse(waiting.model_dump(mode="json"), status_code=202)
    return result


def long_poll_responses(*, waiting: str, refused: str) -> dict[int | str, dict[str, object]]:
    """A long poll's documented answers besides 200: 202 ``waiting`` and 409 ``refused``."""
    return {202: {"model": Waiting, "description": waiting}, 409: {"description": refused}}
