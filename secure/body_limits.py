"""Parts sized to a body limit: how many values of a share, or elements of an alignment's set,
one request body may carry under the service's ``max_body_bytes`` (``GLASU_MAX_BODY_BYTES``, or a
proxy's lower limit given to the service as its own).

The service sizes the parts of every session and alignment it creates with these functions and
states the result (``part_values``, ``part_elements``) and its limit in their descriptions; the
clients cut their bodies by what the description says, so no upload passes the limit. Numpy-free
and torch-free: the service and the CLI both import it.
"""

from __future__ import annotations

from secure.protocol import PART_VALUES, ShareEncoding
from secure.psi import ELEMENT_BYTES
from secure.wire.alignment import SET_PART_ELEMENTS

#: Bytes of a limit left unused (a sixteenth of a smaller limit): a body carries nothing but its
#: values and their framing, but a proxy that counts a little more than the body (or rounds its
#: limit) must not refuse a part.
BODY_HEADROOM_BYTES = 1024
FLOAT32_BYTES = 4


class BodyLimitTooSmall(ValueError):
    """The body limit cannot carry one minimal part (one row of a share, one set element)."""


def usable_bytes(max_body_bytes: int) -> int:
    """What a part may take of the limit ``max_body_bytes``: all but the headroom."""
    return max_body_bytes - min(BODY_HEADROOM_BYTES, max_body_bytes // 16)


def share_part_values(
    max_body_bytes: int,
    *,
    encoding: ShareEncoding,
    widest: int,
    most: int = PART_VALUES,
) -> int:
    """Values per part of a session's shares: the most (at most ``most``) whose upload fits
    ``max_body_bytes``, whole ciphertexts when encrypted; a part carries one row at least,
    so :class:`BodyLimitTooSmall` if one row of the ``widest`` layer does not fit."""
    usable = usable_bytes(max_body_bytes)
    if encoding != "float32":
        header, ciphertext, values = _encrypted_sizes()
        fitting = max(0, (usable - header) // ciphertext) * values
        needed = share_part_bytes(widest, encoding=encoding)
    else:
        fitting = max(0, usable) // FLOAT32_BYTES
        needed = widest * FLOAT32_BYTES
    if fitting < widest:
        raise BodyLimitTooSmall(
            f"a body limit of {max_body_bytes} bytes cannot carry one row of a {widest}-column"
            f" {encoding} share ({needed} bytes, and a little headroom): raise"
            " GLASU_MAX_BODY_BYTES (and the proxy's limit in front of the service)"
        )
    return min(most, fitting)


def share_part_bytes(part_values: int, *, encoding: ShareEncoding) -> int:
    """The largest upload of a part of ``part_values`` values (the bound the sizing uses)."""
    if encoding != "float32":
        header, ciphertext, values = _encrypted_sizes()
        return header + -(-part_values // values) * ciphertext
    return part_values * FLOAT32_BYTES


def set_part_elements(max_body_bytes: int) -> int:
    """Elements per part of an alignment's sets: the most (at most :data:`SET_PART_ELEMENTS`)
    that fit ``max_body_bytes``; :class:`BodyLimitTooSmall` if not even one does."""
    fitting = max(0, usable_bytes(max_body_bytes)) // ELEMENT_BYTES
    if fitting < 1:
        raise BodyLimitTooSmall(
            f"a body limit of {max_body_bytes} bytes cannot carry one {ELEMENT_BYTES}-byte set"
            " element and a little headroom: raise GLASU_MAX_BODY_BYTES"
        )
    return min(SET_PART_ELEMENTS, fitting)


def _encrypted_sizes() -> tuple[int, int, int]:
    """An encrypted frame's header, the most one ciphertext takes in it (its length prefix
    included), and the values it holds: a seeded ciphertext at one prime carrying N values,
    under CKKS (two per slot) as under BFV (masked shares, one per slot). Imported here: the
    CKKS modules load TenSEAL, which the service loads only for its first encrypted session."""
    from secure.ckks_context import VALUES_PER_CIPHERTEXT
    from secure.ckks_frame import CHUNK_PREFIX_BYTES, FRAME_HEADER_BYTES, SHARE_CHUNK_BOUND_BYTES

    return FRAME_HEADER_BYTES, CHUNK_PREFIX_BYTES + SHARE_CHUNK_BOUND_BYTES, VALUES_PER_CIPHERTEXT
