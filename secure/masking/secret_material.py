"""Secret bytes that do not show themselves: the one type for the masking layer's secrets.

As in Tink, a secret is read only through a call that names the act (:meth:`SecretBytes.reveal`),
its ``repr`` and ``str`` say what it is and how long, never its value, and equality compares in
constant time. A secret that ends in a log, a traceback or a test failure message stays secret.
"""

from __future__ import annotations

import hmac


class SecretBytes:
    """Secret key material of a given ``kind`` (a pair secret, a slot seed, a private key)."""

    __slots__ = ("_kind", "_value")

    def __init__(self, value: bytes, *, kind: str) -> None:
        self._value = bytes(value)
        self._kind = kind

    @property
    def kind(self) -> str:
        return self._kind

    def reveal(self) -> bytes:
        """The secret itself, for the primitive that consumes it."""
        return self._value

    def __len__(self) -> int:
        return len(self._value)

    def __repr__(self) -> str:
        return f"SecretBytes(kind={self._kind!r}, {len(self._value)} bytes, redacted)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SecretBytes):
            return NotImplemented
        return self._kind == other._kind and hmac.compare_digest(self._value, other._value)

    def __hash__(self) -> int:
        # equal secrets hash alike without the hash exposing more than the kind and length
        return hash((self._kind, len(self._value)))

    def __reduce__(self) -> tuple:
        raise TypeError("secret material is not pickled")
