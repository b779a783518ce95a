"""Noise that is a function of the release it masks (docs/privacy.md, section 2.2).

A worker's noise must never be drawn twice for two different releases: if a service got two
releases with the same noise, their difference would be noise-free. So the worker does not
store per-pass keys (a service that answers a pass differently after a crash would get the same
key applied to another input); it derives each release's ChaCha20 key from

- a secret of 256 bits that never leaves the worker (:class:`ReleaseSecret`, kept in the owner's
  local privacy ledger, so that the noise and the record of what it masked live and die
  together),
- a scope naming the owner's session and client (the session id the owner configured, never the
  one a service echoes),
- and the digest of everything the release depends on (:func:`release_digest`: pass, layer,
  the pass's output nodes, the release's rows and the clean matrix itself).

The derivation is BLAKE2b in its keyed mode (RFC 7693, a PRF), with a personalisation string
of this protocol. The same input gives the same noise, so recomputing a release after a crash
sends back the identical release (an idempotent retry, counted once); any other input gives
independent noise and is another release, which the owner's gate accounts as such.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
from randomgen import ChaCha

from secure.noise import GaussianNoise, NoiseSource

SECRET_BYTES: Final = 32
_PERSON: Final = b"glasu-noise-v1"  # BLAKE2b personalisation: at most 16 bytes


class ReleaseSecret:
    """The worker's 256-bit noise secret. Its bytes are reachable only through :meth:`derive`
    and :meth:`to_bytes` (for the ledger that stores it); ``repr`` never shows them."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != SECRET_BYTES:
            raise ValueError(f"a release secret has {SECRET_BYTES} bytes")
        self._key = key

    @classmethod
    def generate(cls) -> ReleaseSecret:
        return cls(secrets.token_bytes(SECRET_BYTES))

    def to_bytes(self) -> bytes:
        return self._key

    def derive(self, *, scope: str, release: bytes) -> int:
        """The 256-bit ChaCha20 key of the release with digest ``release`` in ``scope``."""
        scope_bytes = scope.encode()
        kdf = hashlib.blake2b(key=self._key, digest_size=32, person=_PERSON)
        kdf.update(len(scope_bytes).to_bytes(4, "big") + scope_bytes + release)
        return int.from_bytes(kdf.digest(), "big")

    def __repr__(self) -> str:
        return "ReleaseSecret(<hidden>)"


def release_digest(
    *, pass_index: int, layer: int, output_nodes: np.ndarray, rows: np.ndarray, clean: np.ndarray
) -> bytes:
    """SHA-256 of everything a release depends on: the pass and layer, the pass's output nodes,
    the node ids of the release's rows (the union the service returned) and the clean matrix
    before noise (so another model, feature table or sample is another release)."""
    digest = hashlib.sha256(f"glasu-release pass={pass_index} layer={layer}".encode())
    for part in (output_nodes, rows, clean):
        array = np.ascontiguousarray(part)
        digest.update(f"|{array.dtype.str}{array.shape}|".encode())
        digest.update(array.reshape(-1).view(np.uint8))  # the bytes in place: no copy
    return digest.digest()


def part_key(release: bytes, part: int) -> bytes:
    """What the noise of part ``part`` of the release with digest ``release`` is drawn for
    (``NoiseSource.for_release``): the digest itself for part 0, so a release of one part is
    noised as it was before releases travelled in parts, and SHA-256 of the digest and the
    part's index for the others (each part's noise independent of every other part's)."""
    if part == 0:
        return release
    return hashlib.sha256(b"glasu-release-part" + release + part.to_bytes(8, "big")).digest()


def with_part_rows(release: bytes, part_rows: int) -> bytes:
    """The digest of a release sent in parts of ``part_rows`` rows where the protocol's default
    layout (``secure.protocol.PART_VALUES``) would cut it otherwise: each part's noise is keyed
    by the release and the part's index (:func:`part_key`), so the same rows cut another way
    carry other noise, and must be another release, never "already recorded"."""
    return hashlib.sha256(
        b"glasu-release-part-rows" + release + part_rows.to_bytes(8, "big")
    ).digest()


class _KeyedGaussian(GaussianNoise):
    """The noise of one release: the ChaCha20 keystream of one derived key."""

    def __init__(self, key: int) -> None:
        super().__init__()
        self._stream = np.random.Generator(ChaCha(key=key, counter=0, rounds=20))

    def _generator(self) -> np.random.Generator:
        return self._stream

    def __repr__(self) -> str:
        return "GaussianNoise(release-keyed)"


class ReleaseKeyedNoise(GaussianNoise):
    """Cryptographic Gaussian noise whose key is derived per release (module docstring): as
    private as ``GaussianNoise()``, and it can only draw for a named release."""

    def __init__(self, secret: ReleaseSecret, *, scope: str) -> None:
        super().__init__()
        self._secret = secret
        self.scope = scope

    def for_release(self, release: bytes) -> NoiseSource:
        return _KeyedGaussian(self._secret.derive(scope=self.scope, release=release))

    def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
        raise RuntimeError("release-keyed noise draws for a release only: for_release(digest)")

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "release-keyed"}  # a function of each release: nothing to save

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state_kind(state, "release-keyed")

    def __repr__(self) -> str:
        return f"ReleaseKeyedNoise(scope={self.scope!r})"
