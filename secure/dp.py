"""The Gaussian mechanism at the first aggregation layer: row clipping, sensitivity, noise.

Pure maths on numpy arrays; the only state is the noise source. See ``docs/privacy.md`` for the
derivation of the sensitivity bounds and the assumptions the sampler and the model must meet.

Privacy unit: one node's feature row at one client (node-level DP for features, "replace one"
adjacency), with the graph, the sampled node sets and every other client's data held fixed.

Typical use by a worker, per release::

    delta_ = node_sensitivity(clip=1.0, occurrence_cap=1, depth=1)
    std = per_client_noise_std(noise_multiplier=z, sensitivity=delta_, clients=M, shared=False)
    share = privatize(h_plus, clip=1.0, noise_std=std, noise=noise)  # then encrypt and upload
"""

from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from randomgen import ChaCha

Adjacency = Literal["replace", "add-remove"]

__all__ = [
    "Adjacency",
    "GaussianNoise",
    "NoiseSource",
    "NoiseStateError",
    "NotPrivateNoiseError",
    "affected_rows",
    "clip_rows",
    "effective_noise_multiplier",
    "node_sensitivity",
    "per_client_noise_std",
    "privatize",
    "require_private_noise",
    "row_count_sensitivity",
]

# Relative shrink applied to rows whose computed norm still exceeds ``clip`` after rescaling
# (a rounding artefact of at most a few ulps): the bound ``norm <= clip`` must hold exactly.
_ULP_SHRINK = 1.0 - 8.0 * np.finfo(np.float64).eps


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _check_non_negative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _check_int(name: str, value: int, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_matrix(matrix: np.ndarray) -> np.ndarray:
    m = np.asarray(matrix)
    if m.ndim != 2:
        raise ValueError(f"expected a 2-D matrix (rows x cols), got shape {m.shape}")
    if not (np.issubdtype(m.dtype, np.floating) or np.issubdtype(m.dtype, np.integer)):
        raise TypeError(f"expected a real numeric matrix, got dtype {m.dtype}")
    m = m.astype(np.float64, copy=True)
    if not np.all(np.isfinite(m)):
        raise ValueError("matrix contains NaN or infinite values; refusing to release it")
    return m


# --------------------------------------------------------------------------------------------
# Clipping
# --------------------------------------------------------------------------------------------


def clip_rows(matrix: np.ndarray, *, clip: float) -> np.ndarray:
    """Scale every row to L2 norm at most ``clip``.

    Rows with norm <= ``clip`` are returned unchanged; longer rows are scaled down to norm
    ``clip`` (never above it, also after rounding); zero rows stay zero. Returns a new float64
    array. Raises ``ValueError`` on non-finite input: a NaN cannot be clipped.
    """
    clip = _check_positive("clip", clip)
    out = _check_matrix(matrix)
    if out.size == 0:
        return out
    norms = np.linalg.norm(out, axis=1)
    over = norms > clip
    if np.any(over):
        out[over] *= (clip / norms[over])[:, None]
        # Rounding may leave a row a few ulps above the bound; pull those below it.
        for _ in range(8):
            still = np.linalg.norm(out, axis=1) > clip
            if not np.any(still):
                break
            out[still] *= _ULP_SHRINK
    return out


# --------------------------------------------------------------------------------------------
# Sensitivity
# --------------------------------------------------------------------------------------------


def affected_rows(*, occurrence_cap: int, depth: int) -> int:
    """Upper bound on the number of rows of the release that one node's features can change.

    ``(occurrence_cap + 1) ** depth``: at each of the ``depth`` row-mixing layers, every
    affected row can reach at most ``occurrence_cap`` target rows that drew it as a neighbour,
    plus its own row (self-loop, residual or skip connection). See docs/privacy.md.
    """
    c = _check_int("occurrence_cap", occurrence_cap, minimum=0)
    h = _check_int("depth", depth, minimum=0)
    return (c + 1) ** h


def _per_row_change(clip: float, adjacency: Adjacency) -> float:
    if adjacency not in ("replace", "add-remove"):
        raise ValueError(f"adjacency must be 'replace' or 'add-remove', got {adjacency!r}")
    # Both rows of a changed pair have norm <= clip, so they differ by at most 2 * clip. This
    # holds for add-remove too: in this protocol a client must upload a row for every node of
    # the agreed row set, so "removing" node v's features replaces them by a placeholder, and
    # every affected row (v's own included) is a clipped nonlinear function that exists under
    # both datasets. The per-row bound C of DP-SGD (a whole clipped term appears or vanishes)
    # does not apply. docs/privacy.md, "Replace-one versus add/remove-one".
    return 2.0 * clip


def node_sensitivity(
    *,
    clip: float,
    occurrence_cap: int,
    depth: int,
    adjacency: Adjacency = "replace",
    max_rows: int | None = None,
) -> float:
    """Data-independent L2 sensitivity Delta of one client's clipped release to one node's
    features, for a sampled message-passing GNN with the occurrence cap enforced.

    ``Delta = 2 * clip * sqrt(min((occurrence_cap + 1) ** depth, max_rows))``

    - ``clip``: every released row has L2 norm <= clip (:func:`clip_rows`).
    - ``occurrence_cap`` (c): within one batch, at every layer up to the release, every node is
      drawn as a neighbour by at most c target rows (the sampler enforces it; the fanout alone
      does not bound it).
    - ``depth`` (h): number of row-mixing (message-passing) layers up to and including the
      release layer; row-wise maps (input encoder, activation, dropout, LayerNorm) do not count.
    - ``max_rows``: optional cap on the number of rows of this release (the rows are fixed by
      the sampled structure, not by features); never loosens the bound.
    - ``adjacency``: "replace" (default) or "add-remove"; both give the same value here, see
      :func:`_per_row_change` and docs/privacy.md.

    Sound only if the weights of the layers up to the release do not depend on this client's
    private features except through earlier noisy releases (frozen, public, or trained under
    DP and accounted); if they are trained on clean features use :func:`row_count_sensitivity`.
    No BatchNorm with batch statistics below the release (it couples all rows).
    """
    clip = _check_positive("clip", clip)
    rows = affected_rows(occurrence_cap=occurrence_cap, depth=depth)
    if max_rows is not None:
        rows = min(rows, _check_int("max_rows", max_rows, minimum=1))
    return _per_row_change(clip, adjacency) * math.sqrt(rows)


def row_count_sensitivity(*, clip: float, max_rows: int, adjacency: Adjacency = "replace") -> float:
    """``2 * clip * sqrt(max_rows)``: the sensitivity when every row of the release may change.

    This is the bound to use when the weights that produce the release are trained on the
    client's clean features (local updates), or when no occurrence cap is enforced: one node's
    features can then move the weights and through them every row. ``max_rows`` is the number
    of rows of the release (or a cap on it); it depends on the sampled structure only.
    """
    clip = _check_positive("clip", clip)
    rows = _check_int("max_rows", max_rows, minimum=1)
    return _per_row_change(clip, adjacency) * math.sqrt(rows)


# --------------------------------------------------------------------------------------------
# Noise
# --------------------------------------------------------------------------------------------


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
            seed = _check_int("seed", seed, minimum=0)
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
        std = _check_non_negative("std", std)
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


def privatize(
    matrix: np.ndarray, *, clip: float, noise_std: float, noise: NoiseSource
) -> np.ndarray:
    """Clip every row to norm ``clip``, then add i.i.d. N(0, noise_std^2) to every coordinate.

    ``noise_std`` is this client's standard deviation: ``z * Delta`` on its own, or
    :func:`per_client_noise_std` when the noise is shared between clients. Returns float64.
    """
    noise_std = _check_non_negative("noise_std", noise_std)
    clipped = clip_rows(matrix, clip=clip)
    return clipped + noise.sample(clipped.shape, std=noise_std)


def per_client_noise_std(
    *, noise_multiplier: float, sensitivity: float, clients: int, shared: bool
) -> float:
    """Standard deviation each client adds to its share.

    - ``shared=False``: ``z * Delta``. Every share carries the full noise; the guarantee for a
      client's data holds against the service, any peer and any coalition, with multiplier z.
    - ``shared=True``: ``z * Delta / sqrt(M)``. The M shares add up to variance (z * Delta)^2 in
      the sum. Only sound when nobody sees an individual share (encryption on, TLS, a service
      that does not collude with a key-holding client) and every client adds its share honestly;
      a peer who subtracts its own share faces only (M - 1) / M of the variance: account with
      :func:`effective_noise_multiplier`.
    """
    z = _check_non_negative("noise_multiplier", noise_multiplier)
    delta_ = _check_positive("sensitivity", sensitivity)
    m = _check_int("clients", clients, minimum=1)
    std = z * delta_
    return std / math.sqrt(m) if shared else std


def effective_noise_multiplier(
    *, noise_multiplier: float, clients: int, shared: bool, colluding: int = 1
) -> float:
    """The noise multiplier that protects one client's data against ``colluding`` peers who
    pool their own shares (subtract them from the decrypted sum).

    - not shared: ``z`` (the victim's own share alone carries variance (z * Delta)^2);
    - shared: ``z * sqrt((M - colluding) / M)``; one curious peer (the default) gives
      ``z * sqrt((M - 1) / M)``, all other clients together ``z / sqrt(M)``.

    With ``clients == 1`` there is no peer and the single share carries everything: ``z``.
    Feed this value, not ``z``, to the privacy ledger when the noise is shared.
    """
    z = _check_non_negative("noise_multiplier", noise_multiplier)
    m = _check_int("clients", clients, minimum=1)
    j = _check_int("colluding", colluding, minimum=1)
    if m == 1 or not shared:
        return z
    if j > m - 1:
        raise ValueError(f"at most clients - 1 = {m - 1} peers can collude, got {j}")
    return z * math.sqrt((m - j) / m)
