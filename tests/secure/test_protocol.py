"""The wire messages (secure/protocol.py) that the client, both drivers and the service share."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from secure.protocol import decode_nodes, encode_nodes, sorted_union


def test_sorted_union_is_sorted_distinct_int64() -> None:
    union = sorted_union([np.array([5, 1, 9]), np.array([9, 2]), np.array([], dtype=np.int64)])
    assert union.dtype == np.int64 and union.tolist() == [1, 2, 5, 9]
    assert sorted_union([]).tolist() == []


def test_node_sets_travel_as_little_endian_int64() -> None:
    nodes = np.array([0, 3, 2**40], dtype=np.int64)
    body = encode_nodes(nodes)
    assert body == nodes.astype("<i8").tobytes() and len(body) == 24
    assert decode_nodes(body).tolist() == nodes.tolist()


def test_the_protocol_module_loads_no_torch() -> None:
    code = "import sys, secure.protocol; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_a_union_with_duplicates_or_missing_nodes_is_a_violation() -> None:
    import pytest

    from secure.protocol import ProtocolViolation, check_union

    own = np.array([2, 5])
    assert check_union(np.array([1, 2, 5]), own=own, num_nodes=10, layer=1).tolist() == [1, 2, 5]
    for union, says in [
        (np.array([2, 2, 5]), "duplicates"),
        (np.array([5, 2]), "sorted"),
        (np.array([2, 11]), "outside"),
        (np.array([1, 2]), "lacks"),
        (np.array([[2, 5]]), "flat"),
    ]:
        with pytest.raises(ProtocolViolation, match=says):
            check_union(union, own=own, num_nodes=10, layer=1)
