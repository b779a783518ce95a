"""Client routes of one pass: pass descriptor, node sets and unions, embeddings and sums, metrics.

Uploads read the body here (:mod:`service.api.body`) and hand everything blocking to the engine
in a worker thread; the downloads long-poll (see :mod:`service.notify`) and answer 202 with a
waiting status on timeout. The node-set and share exchanges differ in their kinds and in the
part that a share and a sum name (query parameters ``part`` and ``parts``; a node set and a
union are part 0 of 1), so each route is a few lines around one upload and one download. The
URL keeps the protocol's names ``{sid}``, ``{m}``, ``{p}``, ``{l}``, and calls a share an
embedding and a sum an aggregate (``service.store.KIND_NAME``); the Python parameters behind
them are named in full.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from secure.wire.common import MAX_COUNT, MAX_LAYERS
from secure.wire.headers import COUNT_HEADER, ENCODING_HEADER, SHAPE_HEADER
from secure.wire.passes import (
    Metrics,
    PassInfo,
    ReadinessReport,
    ReadinessStatus,
    RejoinReceipt,
    UploadReceipt,
    WaitingStatus,
)
from service.api.body import api_router, binary_body
from service.api.deps import ClientDep, ContextDep
from service.api.polling import WaitQuery, long_poll_responses, poll, poll_or_waiting
from service.api.routes.docs import BINARY_REQUEST_BODY, OCTET_STREAM, binary_response
from service.context import ServiceContext
from service.notify import Pending
from service.rounds import Caller, Payload, UploadOutcome
from service.store import KIND_NAME, ResultKind, UploadKind

router = api_router("/v1/sessions/{sid}/clients/{m}", "clients")
_Route = Callable[..., Awaitable[Any]]

PassPath = Annotated[int, Path(alias="p", ge=0, le=MAX_COUNT, description="Pass index (0-based).")]
LayerPath = Annotated[
    int, Path(alias="l", ge=1, le=MAX_LAYERS, description="Aggregation layer (1-based).")
]
ShapeHeader = Annotated[
    str | None, Header(alias=SHAPE_HEADER, description="'n' (node set) or 'rows,cols'.")
]
EncodingHeader = Annotated[
    str | None, Header(alias=ENCODING_HEADER, description="int64, float32 or ckks.")
]

UPLOAD_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"model": UploadReceipt, "description": "Identical duplicate of an earlier upload."},
    201: {"model": UploadReceipt, "description": "Stored."},
}


def _payload_response(result: Payload | Pending, pass_index: int, layer: int) -> Response:
    if isinstance(result, Pending):
        status = WaitingStatus(
            pass_index=pass_index,
            layer=layer,
            received=result.received,
            missing=result.missing,
        )
        return JSONResponse(status.model_dump(mode="json", by_alias=True), status_code=202)
    headers = {SHAPE_HEADER: result.shape, ENCODING_HEADER: result.encoding}
    if result.count is not None:
        headers[COUNT_HEADER] = str(result.count)
    return Response(result.body, media_type=OCTET_STREAM, headers=headers)


def _receipt_response(
    caller: Caller, pass_index: int, layer: int, outcome: UploadOutcome
) -> JSONResponse:
    receipt = UploadReceipt(
        pass_index=pass_index,
        layer=layer,
        client=caller.client_index,
        status="created" if outcome.created else "duplicate",
        received=outcome.received,
        missing=outcome.missing,
    )
    return JSONResponse(
        receipt.model_dump(mode="json", by_alias=True), status_code=201 if outcome.created else 200
    )


@router.put("/readiness", status_code=204, summary="Say at join: ready, or refused")
async def put_readiness(
    caller: ClientDep, context: ContextDep, report: ReadinessReport
) -> Response:
    """A session with `ready_gate`: once its own checks passed, the worker says it is ready;
    a worker that cannot take part refuses, saying why, which closes the session (the others
    are shown the reason)."""
    await run_in_threadpool(context.readiness.report, caller, report)
    context.notifier.notify(caller.session_id)
    return Response(status_code=204)


@router.get(
    "/readiness",
    response_model=ReadinessStatus,
    responses=long_poll_responses(
        waiting="Not every client has said it is ready.",
        refused="`session-refused`: a client refused the session (closed).",
    ),
    summary="Wait until every client is ready (long poll)",
)
async def get_readiness(
    caller: ClientDep, context: ContextDep, wait: WaitQuery = None
) -> ReadinessStatus | JSONResponse:
    """200 once every client said it is ready; 202 naming those that did not yet."""
    check = partial(context.readiness.check, caller)
    return await poll_or_waiting(context, caller.session_id, check, wait)


@router.get("/passes/{p}", response_model=PassInfo, summary="Describe pass p")
def get_pass(caller: ClientDep, context: ContextDep, pass_index: PassPath) -> PassInfo:
    """Kind, round and output nodes of pass p; kind 'done' once the session has no pass p."""
    return context.engine.downloads.pass_info(caller.session_id, pass_index)


PartQuery = Annotated[
    int,
    Query(
        ge=0,
        le=MAX_COUNT,
        description="Which part of the layer's rows this share or sum holds (0-based; rows"
        " part_span(part) of the layer, docs/protocol.md).",
    ),
]
PartsQuery = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_COUNT,
        description="How many parts the layer's shares travel in: part_count(rows, cols).",
    ),
]


@dataclass(frozen=True, slots=True)
class _Exchange:
    """What every upload and download route names: the caller, the pass and the layer."""

    caller: Caller
    context: ServiceContext
    pass_index: int
    layer: int


def _exchange(
    caller: ClientDep, context: ContextDep, pass_index: PassPath, layer: LayerPath
) -> _Exchange:
    return _Exchange(caller, context, pass_index, layer)


ExchangeDep = Annotated[_Exchange, Depends(_exchange)]


async def _upload(
    kind: UploadKind,
    exchange: _Exchange,
    request: Request,
    shape: str | None,
    encoding: str | None,
    *,
    part: int = 0,
    parts: int = 1,
) -> JSONResponse:
    """Read the binary body (within the byte budget), store it off the event loop, wake the
    long-polls, answer with a receipt."""
    caller, context = exchange.caller, exchange.context
    store = partial(context.engine.uploads.put, kind, caller, exchange.pass_index, exchange.layer)
    async with binary_body(request) as body:
        outcome = await run_in_threadpool(
            store, shape=shape, encoding=encoding, body=body, part=part, parts=parts
        )
    if outcome.wakes_waiters:
        context.notifier.notify(caller.session_id)
    return _receipt_response(caller, exchange.pass_index, exchange.layer, outcome)


async def _download(
    kind: ResultKind, exchange: _Exchange, wait: float | None, *, part: int = 0
) -> Response:
    """Long-poll until the result is complete or the wait runs out (202)."""
    caller, context = exchange.caller, exchange.context
    pass_index, layer = exchange.pass_index, exchange.layer
    check = partial(context.engine.downloads.get, kind, caller, pass_index, layer, part)
    result = await poll(context, caller.session_id, check, wait)
    return _payload_response(result, pass_index, layer)


def _upload_route(kind: UploadKind, summary: str) -> Callable[[_Route], _Route]:
    return router.put(
        f"/passes/{{p}}/layers/{{l}}/{KIND_NAME[kind]}",
        name=f"put_{KIND_NAME[kind]}",
        status_code=201,
        response_model=UploadReceipt,
        responses=UPLOAD_RESPONSES,
        openapi_extra=BINARY_REQUEST_BODY,
        summary=summary,
    )


def _download_route(
    path: str, summary: str, *, result: str, waiting: str, with_count: bool
) -> Callable[[_Route], _Route]:
    return router.get(
        f"/passes/{{p}}/layers/{{l}}/{path}",
        name=f"get_{path}",
        response_class=Response,
        responses={
            200: binary_response(result, with_count=with_count),
            202: {"model": WaitingStatus, "description": waiting},
        },
        summary=summary,
    )


# The routes have no docstrings of their own: FastAPI would take them as OpenAPI descriptions.


@_upload_route("nodes", "Upload this client's node set (training passes)")
async def put_nodes(
    exchange: ExchangeDep,
    request: Request,
    shape: ShapeHeader = None,
    encoding: EncodingHeader = None,
) -> JSONResponse:
    return await _upload("nodes", exchange, request, shape, encoding)


@_download_route(
    "nodes",
    "Download the node union (long poll)",
    result="The sorted union (int64).",
    waiting="Not all node sets are in yet.",
    with_count=False,
)
async def get_nodes(exchange: ExchangeDep, wait: WaitQuery = None) -> Response:
    return await _download("union", exchange, wait)


@_upload_route("share", "Upload one part of this client's embedding share")
async def put_share(
    exchange: ExchangeDep,
    request: Request,
    shape: ShapeHeader = None,
    encoding: EncodingHeader = None,
    part: PartQuery = 0,
    parts: PartsQuery = 1,
) -> JSONResponse:
    return await _upload("share", exchange, request, shape, encoding, part=part, parts=parts)


@_download_route(
    KIND_NAME["sum"],
    "Download the sum of one part (long poll)",
    result="The sum of the M shares' part (session encoding).",
    waiting="Not all shares of the part are in yet.",
    with_count=True,
)
async def get_sum(exchange: ExchangeDep, wait: WaitQuery = None, part: PartQuery = 0) -> Response:
    return await _download("sum", exchange, wait, part=part)


@router.post(
    "/rejoin", response_model=RejoinReceipt, summary="Take part again after a left-out pass"
)
def post_rejoin(caller: ClientDep, context: ContextDep) -> JSONResponse:
    """Stragglers "continue": a client left out of a pass is absent from the passes after it
    (they do not wait for it) until it calls this; the answer is the pass from which the others
    wait for it again. Harmless for a client that was never left out (the current pass)."""
    back_at = context.engine.uploads.rejoin(caller)
    context.notifier.notify_threadsafe(caller.session_id)  # a sync route: off the event loop
    receipt = RejoinReceipt(pass_index=back_at)
    return JSONResponse(receipt.model_dump(mode="json", by_alias=True))


@router.post(
    "/passes/{p}/metrics", status_code=204, response_class=Response, summary="Report metrics"
)
def post_metrics(
    caller: ClientDep, context: ContextDep, pass_index: PassPath, metrics: Metrics
) -> Response:
    """Stored for the status page only; a second report of the same client replaces the first."""
    context.engine.uploads.put_metrics(caller, pass_index, metrics)
    return Response(status_code=204)
