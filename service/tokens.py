"""Bearer tokens: drawn at random, handed out once, kept only as their SHA-256 (the checks of a
request's token are :mod:`service.api.deps`)."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_BYTES = 32


def new_tokens(count: int) -> list[str]:
    return [secrets.token_urlsafe(TOKEN_BYTES) for _ in range(count)]


def token_sha256(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()
