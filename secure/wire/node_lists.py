"""A session's node lists on the wire (``train_nodes``, ``eval_nodes`` of ``POST /v1/sessions``):
compact, so that a session of millions of nodes fits the JSON limit (docs/protocol.md,
"Node lists").

A list is a set of node ids, sent as ``{"encoding": "delta-zstd", "count": n, "data": B64}``:
the ids ascending and distinct, each written as its gap to the one before (the first as
itself) in little-endian int64, the whole one zstd frame that declares its size, in standard
base64. A random split costs about one bit per node of the graph (10M nodes: ~1.6 MB a list),
a range a few bytes. A plain JSON list of ids is still read (the sessions stored by earlier
versions hold them) and, like the encoded form, parsed into a sorted int64 array: the service
draws the batches from the ids in ascending order.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

import numpy as np
import zstandard
from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema

from secure.wire.common import MAX_COUNT, StrictModel

NODE_LIST_ENCODING = "delta-zstd"
ID_BYTES = 8  # little-endian int64
MAX_LIST_NODES = MAX_COUNT  # ids in one list: 16 GiB once decoded
ZSTD_LEVEL = 3  # level 9 is 5x slower for 10M ids and no smaller


class EncodedNodes(StrictModel):
    """The wire form of a node list."""

    encoding: Literal["delta-zstd"] = Field(
        description="Ascending distinct ids as gaps (the first id itself), little-endian int64, "
        "in one zstd frame that declares its size, then base64."
    )
    count: int = Field(ge=0, le=MAX_LIST_NODES, description="How many ids the list holds.")
    data: str = Field(description="The zstd frame, standard base64 with padding.")


def encode_nodes(ids: np.ndarray | list[int]) -> dict[str, Any]:
    """The wire form (a JSON object) of the distinct ids ``ids``, in any order."""
    nodes = np.sort(np.asarray(ids, dtype=np.int64))
    if nodes.size and (nodes[0] < 0 or np.any(nodes[1:] == nodes[:-1])):
        raise ValueError("node ids must be distinct and not negative")
    gaps = np.diff(nodes, prepend=np.int64(0)).astype("<i8")
    frame = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(
        gaps.tobytes()
    )
    return {
        "encoding": NODE_LIST_ENCODING,
        "count": int(nodes.size),
        "data": base64.b64encode(frame).decode("ascii"),
    }


def decode_nodes(encoded: EncodedNodes) -> np.ndarray:
    """The ids of ``encoded``, ascending int64; ValueError naming what is wrong."""
    try:
        frame = base64.b64decode(encoded.data, validate=True)
    except binascii.Error:
        raise ValueError("data is not standard base64") from None
    expected = encoded.count * ID_BYTES
    try:
        declared = zstandard.frame_content_size(frame)
        if declared != expected:  # zstandard allocates what the frame declares: check it first
            what = "no size" if declared < 0 else f"{declared} bytes"
            raise ValueError(
                f"data's zstd frame declares {what}; {encoded.count} ids take {expected}"
            )
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise ValueError(f"data is not one zstd frame: {exc}") from None
    if len(raw) != expected:
        raise ValueError(f"data inflates to {len(raw)} bytes; {encoded.count} ids take {expected}")
    gaps = np.frombuffer(raw, dtype="<i8")
    if gaps.size and (gaps[0] < 0 or np.any(gaps[1:] < 1)):
        raise ValueError("the ids must be ascending and distinct: every gap after the first >= 1")
    nodes = np.cumsum(gaps, dtype=np.int64)
    if nodes.size > 1 and np.any(nodes[1:] <= nodes[:-1]):  # the sum wrapped past 2^63
        raise ValueError("the ids overflow int64")
    return nodes


def _from_list(ids: list[int] | np.ndarray) -> np.ndarray:
    try:
        nodes = np.sort(np.asarray(ids, dtype=np.int64))
    except OverflowError:
        raise ValueError("node ids must fit in int64 (0 <= id < num_nodes)") from None
    if nodes.size > 1 and np.any(nodes[1:] == nodes[:-1]):
        raise ValueError("node ids must be distinct")
    return nodes


def _from_encoded(encoded: EncodedNodes) -> np.ndarray:
    return decode_nodes(encoded)


class _NodeListSchema:
    """Pydantic's schema of :data:`NodeList`: the encoded object or a JSON list of ids in,
    a sorted int64 array in Python, the encoded object out (JSON)."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        encoded = core_schema.no_info_after_validator_function(
            _from_encoded, handler.generate_schema(EncodedNodes)
        )
        listed = core_schema.no_info_after_validator_function(
            _from_list,
            core_schema.list_schema(core_schema.int_schema(strict=True), max_length=MAX_LIST_NODES),
        )
        array = core_schema.no_info_after_validator_function(
            _from_list, core_schema.is_instance_schema(np.ndarray)
        )
        return core_schema.json_or_python_schema(
            json_schema=core_schema.tagged_union_schema(
                {"encoded": encoded, "list": listed}, discriminator=_form
            ),
            python_schema=core_schema.tagged_union_schema(
                {"encoded": encoded, "list": listed, "array": array}, discriminator=_form
            ),
            serialization=core_schema.plain_serializer_function_ser_schema(
                _serialized, info_arg=True
            ),
        )


def _form(value: Any) -> str:
    """Which form a node list comes in (one schema's errors are reported, not every form's)."""
    if isinstance(value, np.ndarray):
        return "array"
    return "list" if isinstance(value, list) else "encoded"


def _serialized(nodes: np.ndarray, info: core_schema.SerializationInfo) -> Any:
    return encode_nodes(nodes) if info.mode_is_json() else nodes


#: A session's node list: sorted distinct int64 ids as a numpy array once parsed.
NodeList = Annotated[np.ndarray, _NodeListSchema]
