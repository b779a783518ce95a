"""Request bodies: nothing is read before the caller is authenticated, every body is bounded by
its route, a large one waits for room in the service's byte budget, and JSON is parsed off the
event loop after a check of its depth.

Binary routes read their body themselves (:func:`binary_body`), after FastAPI has solved their
dependencies (authentication among them). FastAPI reads a JSON body *before* it solves the
dependencies, so the JSON routes use :class:`AuthFirstRoute`, which solves them first.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, TypeVar

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import solve_dependencies
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope

from service.api.deps import get_context
from service.api.routes.docs import OCTET_STREAM, PROBLEM_RESPONSES
from service.errors import ProblemError
from service.limits import MAX_BODY_SETTING, content_length, too_large

#: JSON bodies of the control routes (metrics, alignments); a session's, which holds its node id
#: lists, may take GLASU_MAX_JSON_BYTES (:func:`takes_large_json`).
CONTROL_JSON_BYTES = 64 * 1024
#: The deepest nesting of a JSON body (a session's is 3: agg_layers holds objects).
MAX_JSON_DEPTH = 8

_LARGE_JSON = "glasu_large_json"
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_QUOTE = ord('"')
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1
_DEPTH_BLOCK = 1 << 20

Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def takes_large_json(endpoint: Endpoint) -> Endpoint:
    """Mark a route whose JSON body may take up to GLASU_MAX_JSON_BYTES."""
    setattr(endpoint, _LARGE_JSON, True)
    return endpoint


class AuthFirstRoute(APIRoute):
    """A route whose dependencies are solved before FastAPI reads its JSON body: an
    unauthenticated request (or one refused by any other dependency) is answered before a byte
    of its body is read. The body is then read within the route's limit and the byte budget,
    and parsed in a worker thread. Its dependencies are solved again with the body (they are
    cheap: a token lookup)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler
        before_body = Dependant(dependencies=self.dependant.dependencies, path=self.path)
        large = getattr(self.endpoint, _LARGE_JSON, False)

        async def authenticate_then_read(request: Request) -> Response:
            await _solve(before_body, request)
            context = get_context(request)
            limit, setting = CONTROL_JSON_BYTES, "for the JSON of this route"
            if large:
                limit, setting = context.settings.max_json_bytes, "GLASU_MAX_JSON_BYTES"
            bounded = _BoundedJsonRequest(request.scope, request.receive, limit, setting)
            async with context.body_budget.reserve(_expected_size(request, limit, setting)):
                return await handler(bounded)

        return authenticate_then_read


def api_router(prefix: str, tag: str) -> APIRouter:
    """A router of the API: its routes authenticate before reading a body
    (:class:`AuthFirstRoute`) and document their problem responses."""
    return APIRouter(
        prefix=prefix, tags=[tag], responses=PROBLEM_RESPONSES, route_class=AuthFirstRoute
    )


def media_type(request: Request) -> str:
    """The request's Content-Type without its parameters, lower case ('' if none)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


@asynccontextmanager
async def binary_body(request: Request) -> AsyncIterator[bytes]:
    """The route's octet-stream body, held within the byte budget until the block ends (the
    route processes it inside)."""
    content_type = request.headers.get("content-type")
    if content_type and media_type(request) != OCTET_STREAM:
        raise ProblemError(
            415,
            "unsupported-media-type",
            f"send the body as {OCTET_STREAM}, not {content_type!r}",
        )
    context = get_context(request)
    limit = context.settings.max_body_bytes  # enforced while streaming, by the middleware
    async with context.body_budget.reserve(_expected_size(request, limit, MAX_BODY_SETTING)):
        yield await read_body(request)


async def read_body(
    request: Request, limit: int | None = None, setting: str = MAX_BODY_SETTING
) -> bytes:
    """The whole body (413 beyond ``limit`` bytes). Each chunk is copied into one buffer as it
    arrives and dropped: chunks kept in a list until the end doubled the memory of a body, and
    their many small blocks fragmented the heap so that the process kept the memory of large
    uploads after they were gone."""
    buffer = bytearray()
    async for chunk in request.stream():
        buffer += chunk
        if limit is not None and len(buffer) > limit:
            raise ProblemError(413, "payload-too-large", too_large(limit, setting))
    return bytes(buffer)


def json_depth(text: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, outside its strings, without parsing it
    (a few numpy passes over blocks of the text)."""
    if b"\\" in text:
        text = _ESCAPE.sub(b"__", text)  # an escaped quote or backslash: not a delimiter
    raw = np.frombuffer(text, dtype=np.uint8)
    in_string, depth, deepest = False, 0, 0
    for start in range(0, raw.size, _DEPTH_BLOCK):
        block = raw[start : start + _DEPTH_BLOCK]
        # true from a string's opening quote to the byte before its closing one
        strings = np.logical_xor.accumulate(block == _QUOTE) ^ in_string
        levels = depth + np.cumsum(np.where(strings, 0, _NESTING[block]), dtype=np.int64)
        deepest = max(deepest, int(levels.max()))
        depth, in_string = int(levels[-1]), bool(strings[-1])
    return deepest


def parse_json(text: bytes) -> Any:
    """``json.loads`` after refusing (413) a text nested deeper than ``MAX_JSON_DEPTH``."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ProblemError(
            413,
            "payload-too-large",
            f"the JSON body nests {depth} levels deep; the service takes at most {MAX_JSON_DEPTH}",
        )
    return json.loads(text)


class _BoundedJsonRequest(Request):
    """The request FastAPI reads a JSON route's body from: at most ``limit`` bytes, parsed by
    :func:`parse_json` in a worker thread."""

    def __init__(self, scope: Scope, receive: Receive, limit: int, setting: str) -> None:
        super().__init__(scope, receive)
        self._limit = limit
        self._setting = setting
        self._bounded_body: bytes | None = None
        self._parsed: tuple[Any] | None = None

    async def body(self) -> bytes:
        if self._bounded_body is None:
            self._bounded_body = await read_body(self, self._limit, self._setting)
        return self._bounded_body

    async def json(self) -> Any:
        if self._parsed is None:
            self._parsed = (await run_in_threadpool(parse_json, await self.body()),)
        return self._parsed[0]


def _expected_size(request: Request, limit: int, setting: str) -> int:
    """The declared length (413 at once beyond ``limit``), or ``limit`` when none is declared
    (a chunked body)."""
    declared = content_length(request.scope)
    if declared is None:
        return limit
    if declared > limit:
        raise ProblemError(413, "payload-too-large", too_large(limit, setting))
    return declared


async def _solve(dependant: Dependant, request: Request) -> None:
    async with AsyncExitStack() as stack:
        solved = await solve_dependencies(
            request=request, dependant=dependant, async_exit_stack=stack, embed_body_fields=False
        )
    if solved.errors:
        raise RequestValidationError(solved.errors)
