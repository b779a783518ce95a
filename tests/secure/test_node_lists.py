"""A session's node lists on the wire (secure/wire/node_lists.py): exact round trips, compact
for large graphs, and every malformed encoding refused with a reason."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import zstandard
from pydantic import ValidationError

from secure.wire.common import StrictModel
from secure.wire.node_lists import NodeList, encode_nodes


class Body(StrictModel):
    nodes: NodeList


def frame(raw: bytes, **options: bool) -> str:
    return base64.b64encode(zstandard.ZstdCompressor(**options).compress(raw)).decode()


def test_a_list_round_trips_sorted_and_a_split_of_a_million_nodes_is_small() -> None:
    rng = np.random.default_rng(0)
    ids = rng.permutation(1_000_000)[:600_000]
    body = Body.model_validate_json(Body(nodes=ids).model_dump_json())
    assert body.nodes.dtype == np.int64 and np.array_equal(body.nodes, np.sort(ids))
    assert len(Body(nodes=ids).model_dump_json()) < 250_000  # the JSON list: ~4.5 MB
    assert Body.model_validate({"nodes": [5, 2]}).nodes.tolist() == [2, 5]  # plain lists too
    assert encode_nodes([])["count"] == 0 and Body(nodes=[]).nodes.size == 0


@pytest.mark.parametrize(
    ("encoded", "reason"),
    [
        ({"encoding": "delta-zstd", "count": 2, "data": "not base64!"}, "not standard base64"),
        ({"encoding": "delta-zstd", "count": 2, "data": frame(b"\0" * 8)}, "declares 8 bytes"),
        (
            {
                "encoding": "delta-zstd",
                "count": 1,
                "data": frame(b"\1" + b"\0" * 7, write_content_size=False),
            },
            "declares no size",
        ),
        (
            {
                "encoding": "delta-zstd",
                "count": 2,
                "data": frame(np.array([3, 0], "<i8").tobytes()),
            },
            "ascending and distinct",
        ),
        (
            {
                "encoding": "delta-zstd",
                "count": 2,
                "data": frame(np.array([2**62, 2**62], "<i8").tobytes()),
            },
            "overflow",
        ),
        (
            {"encoding": "delta-zstd", "count": 1, "data": base64.b64encode(b"junk").decode()},
            "zstd",
        ),
        ({"encoding": "gzip", "count": 1, "data": ""}, "delta-zstd"),
        ({"encoding": "delta-zstd", "count": -1, "data": ""}, "count"),
        ([1, 1], "distinct"),
        ([2**63], "int64"),  # found by schemathesis: a server error before
    ],
)
def test_a_malformed_list_is_refused_with_its_reason(encoded: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        Body.model_validate({"nodes": encoded})
