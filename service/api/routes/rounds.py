"""Client routes of one pass: pass descriptor, node sets and unions, embeddings and sums, metrics.

Uploads read the body here (:mod:`service.api.body`) and hand everything blocking to the engine
in a worker thread; the downloads long-poll (see :mod:`service.notify`) and answer 202 with a
waiting status on timeout. The node-set and embedding exchanges differ only in their kinds, so
one function adds the PUT and the GET route of each. The URL keeps the protocol's names
``{sid}``, ``{m}``, ``{p}``, ``{l}``; the Python parameters behind them are named in full.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import Header, Path, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from secure.wire.common import MAX_COUNT, MAX_LAYERS
from secure.wire.passes import Metrics, PassInfo, RejoinReceipt, UploadReceipt, WaitingStatus
from service.api.body import api_router, binary_body
from service.api.deps import ClientDep, ContextDep
from service.api.polling import WaitQuery, poll
from service.api.routes.docs import BINARY_REQUEST_BODY, OCTET_STREAM, binary_response
from service.notify import Waiting
from service.rounds import Caller, Payload, UploadOutcome
from service.store import ResultKind, UploadKind

router = api_router("/v1/sessions/{sid}/clients/{m}", "clients")

PassPath = Annotated[int, Path(alias="p", ge=0, le=MAX_COUNT, description="Pass index (0-based).")]
LayerPath = Annotated[
    int, Path(alias="l", ge=1, le=MAX_LAYERS, description="Aggregation layer (1-based).")
]
ShapeHeader = Annotated[
    str | None, Header(alias="X-Glasu-Shape", description="'n' (node set) or 'rows,cols'.")
]
EncodingHeader = Annotated[
    str | None, Header(alias="X-Glasu-Encoding", description="int64, float32 or ckks.")
]

UPLOAD_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"model": UploadReceipt, "description": "Identical duplicate of an earlier upload."},
    201: {"model": UploadReceipt, "description": "Stored."},
}


def _payload_response(result: Payload | Waiting, pass_index: int, layer: int) -> Response:
    if isinstance(result, Waiting):
        status = WaitingStatus(
            pass_index=pass_index, layer=layer, received=result.received, missing=result.missing
        )
        return JSONResponse(status.model_dump(mode="json", by_alias=True), status_code=202)
    headers = {"X-Glasu-Shape": result.shape, "X-Glasu-Encoding": result.encoding}
    if result.count is not None:
        headers["X-Glasu-Count"] = str(result.count)
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


@router.get("/passes/{p}", response_model=PassInfo, summary="Describe pass p")
def get_pass(caller: ClientDep, context: ContextDep, pass_index: PassPath) -> PassInfo:
    """Kind, round and output nodes of pass p; kind 'done' once the session has no pass p."""
    return context.engine.downloads.pass_info(caller.session_id, pass_index)


def _add_layer_exchange(
    upload_kind: UploadKind,
    result_kind: ResultKind,
    *,
    result_path: str,
    upload_summary: str,
    download_summary: str,
    result_description: str,
    waiting_description: str,
) -> None:
    """The two routes of one exchange at a layer: PUT this client's upload, GET the result."""

    async def upload(
        caller: ClientDep,
        context: ContextDep,
        request: Request,
        pass_index: PassPath,
        layer: LayerPath,
        shape: ShapeHeader = None,
        encoding: EncodingHeader = None,
    ) -> JSONResponse:
        # Read the binary body (within the byte budget), store it off the event loop, wake the
        # long-polls, answer with a receipt. (No docstring: the route's OpenAPI description.)
        store = partial(context.engine.uploads.put, upload_kind, caller, pass_index, layer)
        async with binary_body(request) as body:
            outcome = await run_in_threadpool(store, shape=shape, encoding=encoding, body=body)
        if outcome.wakes_waiters:
            context.notifier.notify(caller.session_id)
        return _receipt_response(caller, pass_index, layer, outcome)

    async def download(
        caller: ClientDep,
        context: ContextDep,
        pass_index: PassPath,
        layer: LayerPath,
        wait: WaitQuery = None,
    ) -> Response:
        # Long-poll until the result is complete or the wait runs out (202).
        check = partial(context.engine.downloads.get, result_kind, caller, pass_index, layer)
        result = await poll(context, caller.session_id, check, wait)
        return _payload_response(result, pass_index, layer)

    router.put(
        f"/passes/{{p}}/layers/{{l}}/{upload_kind}",
        name=f"put_{upload_kind}",
        status_code=201,
        response_model=UploadReceipt,
        responses=UPLOAD_RESPONSES,
        openapi_extra=BINARY_REQUEST_BODY,
        summary=upload_summary,
    )(upload)
    router.get(
        f"/passes/{{p}}/layers/{{l}}/{result_path}",
        name=f"get_{result_path}",
        response_class=Response,
        responses={
            200: binary_response(result_description, with_count=result_kind == "aggregate"),
            202: {"model": WaitingStatus, "description": waiting_description},
        },
        summary=download_summary,
    )(download)


_add_layer_exchange(
    "nodes",
    "union",
    result_path="nodes",
    upload_summary="Upload this client's node set",
    download_summary="Download the node union (long poll)",
    result_description="The sorted union (int64).",
    waiting_description="Not all node sets are in yet.",
)
_add_layer_exchange(
    "embedding",
    "aggregate",
    result_path="aggregate",
    upload_summary="Upload this client's embedding share",
    download_summary="Download the sum (long poll)",
    result_description="The sum of the M shares (session encoding).",
    waiting_description="Not all shares are in yet.",
)


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
