"""The alignment's group operations (libsodium's ristretto255 through rbcl): blinding commutes,
the hash is separated by alignment, and the checks refuse what the service must not relay."""

from __future__ import annotations

import pytest

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
