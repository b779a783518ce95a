"""The alignment's group operations (libsodium's ristretto255 through rbcl): blinding commutes,
the hash is separated by alignment, and the checks refuse what the service must not relay."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from secure import psi
from secure.psi import (
    ELEMENT_BYTES,
    IDENTITY,
    BlindingKey,
    check_elements,
    hash_to_group,
    id_digest,
    pack,
    unpack,
)


def test_blinding_commutes_so_equal_ids_meet_only_under_every_key() -> None:
    a, b, c = BlindingKey(), BlindingKey(), BlindingKey()
    x = hash_to_group("align-1", "customer-42")
    assert a.blind(b.blind(c.blind(x))) == c.blind(a.blind(b.blind(x)))
    assert a.blind(b.blind(x)) != a.blind(c.blind(x))  # a partial blinding is another element
    assert len(x) == ELEMENT_BYTES and x != IDENTITY


def test_the_hash_is_separated_by_alignment_and_unambiguous() -> None:
    assert hash_to_group("align-1", "42") != hash_to_group("align-2", "42")
    assert id_digest("ab", "c") != id_digest("a", "bc")  # length-prefixed fields
    assert hash_to_group("align-1", "42") == hash_to_group("align-1", "42")


def test_the_checks_refuse_invalid_identity_and_repeated_elements() -> None:
    good = [hash_to_group("s", str(i)) for i in range(3)]
    check_elements(good)
    assert unpack(pack(good)) == good
    for bad, says in (
        ([*good, good[0]], "twice"),
        ([*good, IDENTITY], "not a valid"),
        ([*good, b"\xff" * 32], "not a valid"),
    ):
        with pytest.raises(ValueError, match=says):
            check_elements(bad)
    with pytest.raises(ValueError, match="whole number"):
        unpack(pack(good)[:-1])
    with pytest.raises(ValueError, match="not a blindable"):
        BlindingKey().blind(b"\xff" * 32)


def with_bit_255(element: bytes) -> bytes:
    """The other spelling of ``element`` that the bundled libsodium decodes to the same point."""
    return element[:-1] + bytes([element[-1] | 0x80])


def test_an_element_with_bit_255_set_is_refused_not_read_as_its_twin() -> None:
    good = [hash_to_group("s", str(i)) for i in range(3)]
    twin = with_bit_255(good[0])
    with pytest.raises(ValueError, match="element 3 is not a valid"):
        check_elements([*good, twin])  # one element spelled twice
    with pytest.raises(ValueError, match="element 0 is not a valid"):
        check_elements([twin])
    with pytest.raises(ValueError, match="not a blindable"):
        BlindingKey().blind(twin)


def test_blinding_over_processes_gives_the_elements_of_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(psi, "PARALLEL_FROM", 10)
    key = BlindingKey()
    ids = [f"customer-{i}" for i in range(50)]
    alone = [key.blind(hash_to_group("align-1", node)) for node in ids]
    chunks = list(key.blind_ids("align-1", ids, workers=2))
    assert len(chunks) > 1 and [e for chunk in chunks for e in chunk] == alone
    again = [e for chunk in key.blind_elements(alone, workers=2) for e in chunk]
    assert again == key.blind_all(alone)


def _indexed_in_sets(bodies: list[bytes], union: bool) -> psi.IndexedSets:
    """The index as Python sets and a dict build it: what :func:`psi.index_sets` must equal."""
    owned = [unpack(body) for body in bodies]
    shared = set(owned[0]).intersection(*owned[1:])
    aligned = sorted(set().union(*owned) if union else shared)
    place = {element: i for i, element in enumerate(aligned)}
    return psi.IndexedSets(
        aligned_nodes=len(aligned),
        shared_nodes=len(shared),
        digest=hashlib.sha256(pack(aligned)).digest(),
        positions=[
            np.array([place.get(e, -1) for e in elements], dtype="<i8").tobytes()
            for elements in owned
        ],
    )


@pytest.mark.parametrize("ties", [False, True])  # elements that share their first 8 bytes
@pytest.mark.parametrize("union", [False, True])
def test_the_index_in_numpy_is_that_of_python_sets(union: bool, ties: bool) -> None:
    rng = random.Random(7)
    pool = [
        rng.randbytes(30) + bytes([rng.choice([0, 1, 255]), rng.choice([0, 7])]) for _ in range(600)
    ]
    if ties:  # and trailing zero bytes: numpy must not lose them
        pool += [bytes(8) + rng.randbytes(23) + bytes([rng.choice([0, 5])]) for _ in range(60)]
        pool += [bytes(31) + b"\x01", bytes(32), b"\x01" + bytes(31)]
    for parties in (1, 2, 3, 4):
        sets = [rng.sample(pool, rng.randint(0, 300)) for _ in range(parties)]
        if ties:
            sets = [elements + pool[-63:] for elements in sets if elements]
            sets = [list(dict.fromkeys(elements)) for elements in sets] or [pool[-63:]]
        bodies = [pack(elements) for elements in sets]
        assert psi.index_sets(bodies, union=union) == _indexed_in_sets(bodies, union)
