"""Where the Gaussian mechanism's noise comes from (``secure.dp.privatize`` adds it): the
ChaCha20-driven :class:`GaussianNoise` (docs/privacy.md, section 2.1), the interface every noise
source meets (:class:`NoiseSource`, with the state a restarted worker needs), and the check that
noise backing a reported epsilon is private."""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np
from randomgen import ChaCha

from secure.dp import check_int, check_non_negative


class NotPrivateNoiseError(ValueError):
    """Raised where noise that is not private (a fixed seed, an unknown source) would back a
    reported epsilon."""


class NoiseStateError(ValueError):
    """A noise source whose state cannot be saved, or a saved state that does not fit it."""


class NoiseSource(ABC):
    """Where Gaussian noise comes from.

    :meth:`state_dict` and :meth:`load_state_dict` (the PyTorch habit) let a worker that
    restarts from a checkpoint draw the noise it would have drawn: a source that cannot say
    which noise that was refuses to be saved."""

    @abstractmethod
    def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
        """i.i.d. N(0, std^2) samples of the given shape (float64)."""

    @property
    def private(self) -> bool:
        """True only if the noise is unpredictable (cryptographic source, no fixed seed). A
        source that does not say otherwise is not private."""
        return False

    def for_release(self, release: bytes) -> NoiseSource:
        """The source to draw the noise of the release with digest ``release`` from: this one,
        unless the noise must be a function of the release (``secure.release_noise``)."""
        return self

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps so that this source draws the same noise after a restart."""
        raise NoiseStateError(f"the noise of {self!r} cannot be drawn again after a restart")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back a :meth:`state_dict`; :class:`NoiseStateError` if it is another source's."""
        raise NoiseStateError(f"{self!r} has no state to restore")

    def _check_state_kind(self, state: Mapping[str, Any], kind: str) -> None:
        if state.get("kind") != kind:
            raise NoiseStateError(
                f"the saved noise ({state.get('kind')}) does not fit the noise source {self!r}"
            )


# Entries of numpy's ziggurat output with |z| >= _TAIL_START are re-drawn by
# :func:`_gaussian_tail`. Any threshold keeps the distribution exactly N(0, 1); this one is
# numpy's ziggurat_nor_r, so exactly the draws of numpy's tail branch (0.026%) are replaced.
_TAIL_START = 3.6541528853610088
# Bits of exponent drawn for a uniform (at most 2^-961, still a normal double).
_EXPONENT_WORDS = 30


def _uniform_open(gen: np.random.Generator, n: int) -> np.ndarray:
    """``n`` i.i.d. uniforms on (0, 1) with *relative* resolution 2^-52 everywhere.

    ``U = (1 + m / 2^52) * 2^-(e + 1)``: m uniform on 52 bits, e >= 0 the number of leading
    zero bits of a random bit string (P(e = j) = 2^-(j + 1)), so U is uniform on a lattice of
    2^52 points in every binade [2^-(e+1), 2^-e). numpy's 53-bit uniforms have spacing 2^-53
    near 0, too coarse for ``log(U)`` far in a tail. Every operation here is exact.
    """
    exponent = np.zeros(n, dtype=np.int64)
    pending = np.arange(n)
    for _ in range(_EXPONENT_WORDS):
        if pending.size == 0:
            break
        words = gen.integers(0, 2**32, size=pending.size, dtype=np.uint32)
        bit_length = np.frexp(words.astype(np.float64))[1]  # exact: words < 2^53
        exponent[pending] += 32 - bit_length
        pending = pending[words == 0]
    mantissa = gen.integers(0, 2**52, size=n, dtype=np.int64)
    return np.ldexp(1.0 + mantissa * 2.0**-52, -(exponent + 1))


def _gaussian_tail(gen: np.random.Generator, n: int, start: float) -> np.ndarray:
    """``n`` i.i.d. draws of N(0, 1) conditioned on being >= ``start`` > 0 (Marsaglia 1964:
    x ~ Exp(rate start), accepted with probability exp(-x^2 / 2), returns start + x), on
    full-resolution uniforms."""
    out = np.empty(n, dtype=np.float64)
    pending = np.arange(n)
    while pending.size:
        x = -np.log(_uniform_open(gen, pending.size)) / start
        y = -np.log(_uniform_open(gen, pending.size))
        accept = 2.0 * y > x * x
        out[pending[accept]] = start + x[accept]
        pending = pending[~accept]
    return out


def _standard_normal(gen: np.random.Generator, shape: int | tuple[int, ...]) -> np.ndarray:
    """N(0, 1) samples: numpy's ziggurat, with its tail re-drawn at full resolution."""
    z = gen.standard_normal(shape, dtype=np.float64)
    tail = np.abs(z) >= _TAIL_START
    count = int(np.count_nonzero(tail))
    if count:
        z[tail] = np.copysign(_gaussian_tail(gen, count, _TAIL_START), z[tail])
    return z


class GaussianNoise(NoiseSource):
    """Gaussian noise driven by the ChaCha20 stream cipher (docs/privacy.md, section 2.1).

    - ``seed=None`` (the default, and the only choice for a real run): every :meth:`sample`
      call keys a fresh ChaCha20 generator (``randomgen.ChaCha``, 20 rounds, the RFC 7539
      keystream) with 256 bits from the OS CSPRNG (``secrets``). Every random bit is a
      cryptographic keystream bit; no two calls, threads or forked processes share a stream.
      :attr:`private` is True.
    - ``seed=<int>``: one PCG64DXSM generator seeded once, for reproducible experiments and
      tests only. A known seed makes the noise removable: :attr:`private` is False, and a
      report must say "not private" (:func:`require_private_noise`).

    Samples are numpy's ziggurat on those bits, with the tail (|z| >= 3.654, 0.026% of draws)
    re-drawn from full-resolution uniforms; the worker's share is then rounded to the 2^-12
    grid (``secure.aggregation.to_grid``). Not an exact discrete Gaussian: section 2.1 of
    docs/privacy.md bounds what floating point leaves.
    """

    def __init__(self, *, seed: int | None = None) -> None:
        if seed is not None:
            seed = check_int("seed", seed, minimum=0)
            self._rng: np.random.Generator | None = np.random.Generator(np.random.PCG64DXSM(seed))
        else:
            self._rng = None
        self._seeded = seed is not None

    @property
    def reproducible(self) -> bool:
        """True if constructed with an explicit seed."""
        return self._seeded

    @property
    def private(self) -> bool:
        """True unless seeded: cryptographic, unpredictable noise."""
        return not self._seeded

    def _generator(self) -> np.random.Generator:
        if self._rng is not None:
            return self._rng
        return np.random.Generator(ChaCha(key=secrets.randbits(256), counter=0, rounds=20))

    def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
        std = check_non_negative("std", std)
        out = _standard_normal(self._generator(), shape)
        out *= std
        return out

    def state_dict(self) -> dict[str, Any]:
        """The seeded generator's state. Unseeded noise (a fresh key per draw) has none: it
        cannot be drawn again, and refuses (:class:`NoiseStateError`)."""
        if self._rng is None:
            return super().state_dict()
        return {"kind": "seeded", "state": self._rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._check_state_kind(state, "seeded")
        if self._rng is None:
            raise NoiseStateError(f"{self!r} is not seeded: the saved noise was")
        self._rng.bit_generator.state = state["state"]

    def __repr__(self) -> str:
        return f"GaussianNoise(reproducible={self._seeded})"


def require_private_noise(noise: NoiseSource, *, allow_reproducible: bool = False) -> bool:
    """Whether ``noise`` is private; refuses non-private noise unless explicitly allowed.

    Call it where a run that reports epsilon is set up. Returns ``noise.private``: when False
    (only possible with ``allow_reproducible=True``, for tests and experiments) the report must
    be marked "not private". Raises :class:`NotPrivateNoiseError` otherwise.
    """
    if noise.private:
        return True
    if not allow_reproducible:
        raise NotPrivateNoiseError(
            f"{noise!r} is not private (fixed seed or unknown source): its noise can be "
            "reproduced and removed, so no epsilon can be claimed; drop the noise seed"
        )
    return False
