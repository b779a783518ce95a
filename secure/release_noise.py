"""Noise that is a function of the release it masks (docs/privacy.md, section 2.2).

A worker's noise must never be drawn twice for two different releases: if a service got two
releases with the same noise, their difference would be noise-free, and two releases of the
same inputs at two noise levels (r1 = x + sZ, r2 = x + 2sZ) would give the clean x = 2 r1 - r2.
So the worker does not store per-pass keys (a service that answers a pass differently after a
crash would get the same key applied to another input); it derives each release's ChaCha20 key
from

- a secret of 256 bits that never leaves the worker (:class:`ReleaseSecret`, kept in the owner's
  local privacy ledger, so that the noise and the record of what it masked live and die
  together),
- a scope naming the owner's session and client (the session id the owner configured, never the
  one a service echoes),
- and the release's identity (:func:`release_digest`): everything the release depends on, its
  inputs (pass, layer, the pass's output nodes, the release's rows, the clean matrix, the part
  layout and, in a count-aware session, the presence column) *and* every parameter of the
  mechanism that noises and sends it (:class:`ReleaseMechanism`: z, the noise std, clip,
  sensitivity, occurrence cap, shared noise or not, M, the release layer and width, the share
  encoding).

The derivation is BLAKE2b in its keyed mode (RFC 7693, a PRF), with a personalisation string
of this protocol (``glasu-noise-v2``: keys of the earlier derivation, whose digest left the
mechanism out, never equal these). The same inputs under the same mechanism give the same noise,
so recomputing a release after a crash sends back the byte-identical release (an idempotent
retry, counted once); any other input or any other parameter gives independent noise and is
another release, which the owner's gate accounts as such.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
from randomgen import ChaCha

from secure.discrete_gaussian import DiscreteGaussianNoise
from secure.noise import GaussianNoise, NoiseSource
from secure.privacy import RELEASE_LAYER, SessionPrivacy
from secure.split_noise import privatize_on_grid

SECRET_BYTES: Final = 32
_PERSON: Final = b"glasu-noise-v2"  # BLAKE2b personalisation: at most 16 bytes


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


#: The fields added to :class:`ReleaseMechanism` after v1, at the values every earlier release
#: had: :meth:`ReleaseMechanism.canonical` leaves them out there.
_V1_DEFAULTS: Final = {"split_noise": False, "release": "clip-after", "degree_floor": None}


@dataclass(frozen=True, kw_only=True)
class ReleaseMechanism:
    """Every parameter of the mechanism that turns a clean release into the bytes a worker
    uploads: one canonical description, hashed into each release's identity
    (:func:`release_digest`, hence its noise key) and kept in the owner's ledger (each release
    row and the session's record). Two releases of the same inputs under mechanisms that differ
    in any field are two releases with independent noise."""

    layer: int  # the graph layer released (``secure.privacy.RELEASE_LAYER``)
    width: int  # columns of the release
    clients: int  # M: the shares in a sum
    noise_multiplier: float  # z
    ledger_noise_multiplier: float  # the z the ledger composes (shared noise: a peer's)
    noise_std: float  # this client's standard deviation per coordinate
    clip: float  # C
    sensitivity: float  # Delta
    occurrence_cap: int  # c
    shared_noise: bool
    encoding: str  # the share encoding ("float32", "ckks")
    # split discrete Gaussian noise (docs/privacy.md section 11); added after v1, so
    # :meth:`canonical` writes it only when True and every earlier digest stays as it was
    split_noise: bool = False
    # how the release is formed (``secure.dp.ReleaseKind``) and its degree floor d_min; added
    # after v1 too: written only for a degree-normalised release
    release: str = "clip-after"
    degree_floor: int | None = None

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "ledger_noise_multiplier", "noise_std", "clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a release mechanism's {name} is a finite number, got {value}")

    @classmethod
    def of(cls, privacy: SessionPrivacy, *, width: int, encoding: str) -> ReleaseMechanism:
        """The mechanism of ``privacy``'s releases, ``width`` columns wide, sent as
        ``encoding``."""
        return cls(
            layer=RELEASE_LAYER,
            width=int(width),
            clients=privacy.clients,
            noise_multiplier=float(privacy.noise_multiplier),
            ledger_noise_multiplier=float(privacy.ledger_noise_multiplier),
            noise_std=float(privacy.release_noise_std(width)),
            clip=float(privacy.clip),
            sensitivity=float(privacy.sensitivity),
            occurrence_cap=int(privacy.occurrence_cap),
            shared_noise=bool(privacy.shared_noise),
            encoding=str(encoding),
            split_noise=bool(privacy.split_noise),
            release=str(privacy.release),
            degree_floor=int(privacy.degree_floor) if privacy.degree_normalised else None,
        )

    @classmethod
    def from_canonical(cls, text: str) -> ReleaseMechanism:
        return cls(**json.loads(text))

    def canonical(self) -> str:
        """Sorted-key JSON, floats in their shortest round-trip form (what the ledger keeps);
        the fields added after v1 only where they differ from their defaults (``split_noise``
        True, a degree-normalised ``release`` and its ``degree_floor``)."""
        fields = asdict(self)
        for name, default in _V1_DEFAULTS.items():
            if fields[name] == default:
                del fields[name]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @property
    def digest(self) -> str:
        """SHA-256 (hex) of the canonical description, under this protocol's label."""
        return hashlib.sha256(
            b"glasu-release-mechanism-v1|" + self.canonical().encode()
        ).hexdigest()

    def differences(self, other: ReleaseMechanism) -> list[str]:
        """``"name: ours != theirs"`` for each field that differs."""
        ours, theirs = asdict(self), asdict(other)
        return [f"{k}: {ours[k]!r} != {theirs[k]!r}" for k in sorted(ours) if ours[k] != theirs[k]]


def release_digest(
    *,
    pass_index: int,
    layer: int,
    output_nodes: np.ndarray,
    rows: np.ndarray,
    clean: np.ndarray,
    mechanism: ReleaseMechanism,
    part_rows: int,
    presence: np.ndarray | None = None,
) -> bytes:
    """SHA-256 of a release's identity: everything the release depends on (the pass and layer,
    the pass's output nodes, the node ids of the release's rows, the union the service returned,
    the clean matrix before noise, so another model, feature table or sample is another
    release; the rows per part it travels in and a count-aware session's presence column) and
    every parameter of the ``mechanism`` that noises it. Changing any one of them changes the
    digest, hence the noise key."""
    digest = hashlib.sha256(
        f"glasu-release-v2 pass={pass_index} layer={layer} part_rows={part_rows}"
        f" mechanism={mechanism.digest}".encode()
    )
    parts = [output_nodes, rows, clean]
    if presence is not None:
        parts.append(presence)
    for part in parts:
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


class _KeyedStream(GaussianNoise):
    """Noise drawn from the ChaCha20 keystream of one derived key (one release's)."""

    def __init__(self, key: int) -> None:
        super().__init__()
        self._stream = np.random.Generator(ChaCha(key=key, counter=0, rounds=20))

    def _generator(self) -> np.random.Generator:
        return self._stream


class _KeyedGaussian(_KeyedStream):
    """The noise of one release."""

    def __repr__(self) -> str:
        return "GaussianNoise(release-keyed)"


class _KeyedDiscreteGaussian(_KeyedStream, DiscreteGaussianNoise):
    """The split noise of one release: exact discrete Gaussians on the share grid."""

    def __repr__(self) -> str:
        return "DiscreteGaussianNoise(release-keyed)"


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


class SplitReleaseKeyedNoise(ReleaseKeyedNoise):
    """A party's split share of the noise (docs/privacy.md section 11), keyed per release like
    :class:`ReleaseKeyedNoise` (the same secret, scope and derivation: the release digest covers
    the mechanism, whose ``split_noise`` keeps these keys apart from any continuous release's):
    :meth:`for_release` gives exact discrete Gaussian noise on the share grid."""

    def for_release(self, release: bytes) -> NoiseSource:
        return _KeyedDiscreteGaussian(self._secret.derive(scope=self.scope, release=release))

    def __repr__(self) -> str:
        return f"SplitReleaseKeyedNoise(scope={self.scope!r})"


def release_keyed_noise(
    secret: ReleaseSecret, *, scope: str, split_noise: bool
) -> ReleaseKeyedNoise:
    """The worker's release-keyed noise: :class:`SplitReleaseKeyedNoise` for a session that
    splits its noise, :class:`ReleaseKeyedNoise` otherwise."""
    kind = SplitReleaseKeyedNoise if split_noise else ReleaseKeyedNoise
    return kind(secret, scope=scope)


def split_share_part(
    clean: np.ndarray,
    *,
    clip: float,
    noise_std: float,
    noise: NoiseSource,
    release: bytes,
    part: int,
) -> np.ndarray:
    """Part ``part`` of a party's split-noise release, exactly on the share grid: its rows
    clipped to ``clip``, rounded to the grid, then the party's discrete Gaussian share of the
    noise keyed by the release's digest ``release`` and the part
    (``noise.for_release(part_key(release, part))``) added. No clamp: under masks the share is
    reduced modulo the plaintext modulus, which keeps the sum (docs/privacy.md section 11.2).

    ``noise`` is the worker's :class:`SplitReleaseKeyedNoise` (or, in tests, a seeded
    ``DiscreteGaussianNoise``), ``noise_std`` the mechanism's (``SessionPrivacy
    .release_noise_std(width)``): the call a masked release path makes for each part, as
    ``models.release.DpRelease`` calls ``secure.dp.privatize``."""
    return privatize_on_grid(
        clean, clip=clip, noise_std=noise_std, noise=noise.for_release(part_key(release, part))
    )
