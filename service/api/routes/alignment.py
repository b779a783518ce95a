"""Alignment routes: the admin creates an alignment (one token per party); each party posts the
blinded sets the ring gives it, fetches the one it blinds next (long poll) and, at the end, its
positions in the aligned node index. See :mod:`service.alignment` and docs/protocol.md.

Authentication: the admin token for creating; a party token (bound to one alignment and one
party index) for the party routes; either for the status. Order of checks as elsewhere: no or
unknown token -> 401, unknown alignment -> 404, token not allowed here -> 403
(:mod:`service.api.deps`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from secure.body_limits import BodyLimitTooSmall, set_part_elements
from secure.psi import ELEMENT_BYTES
from secure.wire.alignment import (
    SET_ENCODING,
    AlignmentChanges,
    AlignmentCreate,
    AlignmentCreated,
    AlignmentStatus,
    AlignmentWaiting,
    SetReceipt,
)
from secure.wire.common import MAX_CLIENTS
from secure.wire.headers import ENCODING_HEADER, SHAPE_HEADER, SIGNATURE_HEADER
from service.alignment.manager import (
    POSITIONS_ENCODING,
    PartyCaller,
    SetHead,
    SetPart,
    SetUpload,
)
from service.api.body import api_router, binary_body
from service.api.deps import (
    AlignmentAdminDep,
    AlignmentIdPath,
    AlignmentReaderDep,
    AlignmentsDep,
    ContextDep,
    PartyDep,
)
from service.api.polling import WaitQuery, poll, poll_or_waiting
from service.api.routes.docs import BINARY_REQUEST_BODY, OCTET_STREAM, binary_response
from service.context import ServiceContext
from service.errors import ProblemError
from service.notify import Pending

router = api_router("/v1/alignments", "alignments")
Route = TypeVar("Route", bound=Callable[..., Awaitable[Any]])

OwnerPath = Annotated[
    int, Path(alias="o", ge=0, lt=MAX_CLIENTS, description="The party whose ids the set holds.")
]
HopPath = Annotated[
    int, Path(alias="h", ge=0, lt=MAX_CLIENTS, description="Keys applied so far, minus one.")
]
PartQuery = Annotated[
    int,
    Query(
        ge=0,
        lt=2**31,
        description="Which part: part k holds elements k * part_elements up to the next part's "
        "(the alignment's `part_elements`).",
    ),
]
ShapeHeader = Annotated[
    str | None,
    Header(alias=SHAPE_HEADER, description="Element count of the whole set (all its parts)."),
]
EncodingHeader = Annotated[
    str | None, Header(alias=ENCODING_HEADER, description=f"'{SET_ENCODING}'.")
]
SignatureHeader = Annotated[
    str | None,
    Header(
        alias=SIGNATURE_HEADER,
        description="Optional: the poster's Ed25519 signature of the set (hex), relayed to the "
        "next party unchecked.",
    ),
]

WAITING_RESPONSE: dict[int | str, dict[str, object]] = {
    202: {"model": AlignmentWaiting, "description": "Not there yet: the parties still owing."}
}


def _notify_key(alignment_id: str) -> str:
    return f"alignment:{alignment_id}"


def _binary(result: SetPart | Pending, *, encoding: str) -> Response:
    """A part (X-Glasu-Shape: the whole set's element count), or the 202 of a long poll."""
    if isinstance(result, Pending):
        return _waiting(result)
    headers = {SHAPE_HEADER: str(result.size), ENCODING_HEADER: encoding}
    if result.signature is not None:
        headers[SIGNATURE_HEADER] = result.signature.hex()
    return Response(result.body, media_type=OCTET_STREAM, headers=headers)


def _waiting(pending: Pending) -> JSONResponse:
    """The 202 of a long poll that ran out: the parties still owing."""
    waiting = AlignmentWaiting(missing=pending.missing)
    return JSONResponse(waiting.model_dump(mode="json"), status_code=202)


def _long_poll_route(path: str, *, summary: str, part_is: str) -> Callable[[Route], Route]:
    """A party's GET of a binary part that others deliver: 200 with the part (``part_is``),
    202 with the parties still owing it when the wait runs out."""
    return router.get(
        path,
        response_class=Response,
        responses={200: binary_response(part_is, with_count=False), **WAITING_RESPONSE},
        summary=summary,
    )


async def _polled_part(
    context: ServiceContext,
    caller: PartyCaller,
    check: Callable[[], SetPart | Pending],
    wait: float | None,
    *,
    encoding: str,
) -> Response:
    """``check``, long-polled on the alignment's notifications, as the route's answer."""
    result = await poll(context, _notify_key(caller.alignment_id), check, wait)
    return _binary(result, encoding=encoding)


@router.post("", status_code=201, response_model=AlignmentCreated, summary="Create an alignment")
def create_alignment(
    _: AlignmentAdminDep,
    context: ContextDep,
    alignments: AlignmentsDep,
    request: AlignmentCreate,
    response: Response,
) -> AlignmentCreated:
    """Admin only. Returns the party tokens once: the service keeps only their hashes."""
    limit = context.settings.max_body_bytes
    if request.part_elements is None:  # the most that fit this service's limit
        try:
            request = request.model_copy(update={"part_elements": set_part_elements(limit)})
        except BodyLimitTooSmall as exc:
            raise ProblemError(422, "validation-error", str(exc)) from None
    part_bytes = request.part_elements * ELEMENT_BYTES
    if part_bytes > limit:
        raise ProblemError(
            422,
            "validation-error",
            f"part_elements {request.part_elements} makes parts of {part_bytes} bytes, over "
            f"this service's body limit of {limit} (GLASU_MAX_BODY_BYTES)"
            f": at most {limit // ELEMENT_BYTES}",
        )
    created = alignments.create(request)
    response.headers["Location"] = f"/v1/alignments/{created.alignment_id}"
    return created


@router.get("/{aid}", response_model=AlignmentStatus, summary="Alignment status")
def get_alignment(
    _: AlignmentReaderDep, alignments: AlignmentsDep, alignment_id: AlignmentIdPath
) -> AlignmentStatus:
    """The admin or any party of the alignment: set sizes, hops posted and, once done, the size
    of the intersection and its digest."""
    return alignments.status(alignment_id)


@router.put(
    "/{aid}/parties/{m}/sets/{o}/hops/{h}",
    status_code=201,
    response_model=SetReceipt,
    responses={200: {"model": SetReceipt, "description": "Identical duplicate."}},
    openapi_extra=BINARY_REQUEST_BODY,
    summary="Post a blinded set",
)
async def put_set(
    caller: PartyDep,
    context: ContextDep,
    alignments: AlignmentsDep,
    request: Request,
    owner: OwnerPath,
    hop: HopPath,
    part: PartQuery = 0,
    shape: ShapeHeader = None,
    encoding: EncodingHeader = None,
    signature: SignatureHeader = None,
) -> JSONResponse:
    # The set of party o blinded by parties o..o+h (mod M): party o posts hop 0 (its own set,
    # blinded and shuffled), party o+h posts hop h; each in parts of part_elements elements,
    # every part with the whole set's size and signature. (No docstring: OpenAPI description.)
    head = SetHead(shape=shape, encoding=encoding, signature=signature)
    # refused on its head when it can be: before the body is read
    await run_in_threadpool(alignments.check_set_head, caller, owner, hop, part, head)
    async with binary_body(request) as body:
        upload: SetUpload = await run_in_threadpool(
            alignments.put_set, caller, owner, hop, part, head, body
        )
    context.notifier.notify(_notify_key(caller.alignment_id))
    receipt = SetReceipt(
        owner=owner,
        hop=hop,
        part=part,
        parts=upload.parts,
        party=caller.party,
        status="created" if upload.created else "duplicate",
        size=upload.size,
    )
    return JSONResponse(receipt.model_dump(mode="json"), status_code=201 if upload.created else 200)


@_long_poll_route(
    "/{aid}/parties/{m}/sets/{o}/hops/{h}",
    summary="Fetch the set to blind next (long poll)",
    part_is="Part `part` of the set to blind next (ristretto255 elements).",
)
async def get_set(
    caller: PartyDep,
    context: ContextDep,
    alignments: AlignmentsDep,
    owner: OwnerPath,
    hop: HopPath,
    part: PartQuery = 0,
    wait: WaitQuery = None,
) -> Response:
    # Served only to party o+h+1 (mod M), the next to blind it, once all its parts are in;
    # never the fully blinded hop.
    check = partial(alignments.get_set, caller, owner, hop, part)
    return await _polled_part(context, caller, check, wait, encoding=SET_ENCODING)


@_long_poll_route(
    "/{aid}/parties/{m}/positions",
    summary="Fetch this party's positions in the aligned index (long poll)",
    part_is="For each position of part `part` of the set this party posted, its aligned index "
    "(-1: not shared), little-endian int64.",
)
async def get_positions(
    caller: PartyDep,
    context: ContextDep,
    alignments: AlignmentsDep,
    part: PartQuery = 0,
    wait: WaitQuery = None,
) -> Response:
    # Ready once every fully blinded set is in and the service has intersected them; part k
    # covers the positions of part k of the set this party posted.
    check = partial(alignments.positions, caller, part)
    return await _polled_part(context, caller, check, wait, encoding=POSITIONS_ENCODING)


@router.put(
    "/{aid}/parties/{m}/removed",
    status_code=201,
    responses={200: {"description": "Identical duplicate."}},
    openapi_extra=BINARY_REQUEST_BODY,
    summary="Post an update's removed positions",
)
async def put_removed(
    caller: PartyDep, context: ContextDep, alignments: AlignmentsDep, request: Request
) -> Response:
    # An update only: the positions of this party's kept set whose ids it removed since the
    # base, little-endian int64 (empty: none), posted once. (No docstring: OpenAPI description.)
    async with binary_body(request) as body:
        created = await run_in_threadpool(alignments.put_removed, caller, body)
    context.notifier.notify(_notify_key(caller.alignment_id))
    return Response(status_code=201 if created else 200)


@router.get(
    "/{aid}/parties/{m}/changes",
    response_model=AlignmentChanges,
    responses=WAITING_RESPONSE,
    summary="Fetch what an update changed for this party (long poll)",
)
async def get_changes(
    caller: PartyDep, context: ContextDep, alignments: AlignmentsDep, wait: WaitQuery = None
) -> AlignmentChanges | JSONResponse:
    # An update only, once every party's delta is in and the service applied them to the
    # base's kept sets: the base's aligned indices removed, the new indices inserted and this
    # party's kept position of each.
    check = partial(alignments.changes, caller)
    return await poll_or_waiting(context, _notify_key(caller.alignment_id), check, wait)
