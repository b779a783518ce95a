"""The Gaussian mechanism at the first aggregation layer: row clipping, sensitivity, noise.

Pure maths on numpy arrays; the noise comes from a ``secure.noise.NoiseSource``. See
``docs/privacy.md`` for the derivation of the sensitivity bounds and the assumptions the sampler
and the model must meet.

Privacy unit: one node's feature row at one client (node-level DP for features, "replace one"
adjacency), with the graph, the sampled node sets and every other client's data held fixed.

Typical use by a worker, per release::

    delta_ = node_sensitivity(clip=1.0, occurrence_cap=1, depth=1)
    std = per_client_noise_std(noise_multiplier=z, sensitivity=delta_, clients=M, shared=False)
    share = privatize(h_plus, clip=1.0, noise_std=std, noise=noise)  # then encrypt and upload
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from secure.noise import NoiseSource

Adjacency = Literal["replace", "add-remove"]

#: How a client's layer-1 release is formed (docs/privacy.md sections 3.4 and 3.7):
#: "clip-after" aggregates then clips each row to C; "degree-normalised" clips each node's own
#: row to C, then sums over the drawn neighbourhood and divides by max(degree, degree floor).
ReleaseKind = Literal["clip-after", "degree-normalised"]
RELEASE_KINDS: tuple[ReleaseKind, ...] = ("clip-after", "degree-normalised")
#: d_min of the degree-normalised release: a fixed setting, never a statistic of the graph.
DEFAULT_DEGREE_FLOOR = 4

__all__ = [
    "DEFAULT_DEGREE_FLOOR",
    "RELEASE_KINDS",
    "Adjacency",
    "ReleaseKind",
    "affected_rows",
    "check_int",
    "check_non_negative",
    "check_positive",
    "clip_rows",
    "degree_normalised_sensitivity",
    "effective_noise_multiplier",
    "node_sensitivity",
    "per_client_noise_std",
    "privatize",
    "row_count_sensitivity",
]

# Relative shrink applied to rows whose computed norm still exceeds ``clip`` after rescaling
# (a rounding artefact of at most a few ulps): the bound ``norm <= clip`` must hold exactly.
_ULP_SHRINK = 1.0 - 8.0 * np.finfo(np.float64).eps


def check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def check_non_negative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_int(name: str, value: int, *, minimum: int) -> int:
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
    clip = check_positive("clip", clip)
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
    c = check_int("occurrence_cap", occurrence_cap, minimum=0)
    h = check_int("depth", depth, minimum=0)
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
    clip = check_positive("clip", clip)
    rows = affected_rows(occurrence_cap=occurrence_cap, depth=depth)
    if max_rows is not None:
        rows = min(rows, check_int("max_rows", max_rows, minimum=1))
    return _per_row_change(clip, adjacency) * math.sqrt(rows)


def degree_normalised_sensitivity(
    *, clip: float, occurrence_cap: int, degree_floor: int, adjacency: Adjacency = "replace"
) -> float:
    """L2 sensitivity of one client's degree-normalised layer-1 release to one node's features.

    ``Delta = 2 * clip * sqrt(occurrence_cap + 1) / degree_floor``

    The release: every source row is clipped to norm <= ``clip`` on its own (before any
    aggregation), and target u releases the sum of the clipped rows of itself and its drawn
    neighbours divided by ``max(deg(u), degree_floor)`` (``deg``: the terms of the sum, the
    self-loop included). Node v's clipped row moves by at most 2C and enters at most
    ``occurrence_cap + 1`` rows (the targets that drew it, at most c by the sampler's cap, and
    its own), each through a denominator >= ``degree_floor``: each of those rows moves by at most
    2C / d_min. Rows are fixed by the sampled structure, which does not see features, and a
    final clip of the released rows to C cannot add to it (projection onto a ball is
    non-expansive). One aggregation layer (the release layer) and weight-free maps only; see
    docs/privacy.md section 3.7.
    """
    clip = check_positive("clip", clip)
    rows = affected_rows(occurrence_cap=occurrence_cap, depth=1)
    floor = check_int("degree_floor", degree_floor, minimum=1)
    return _per_row_change(clip, adjacency) * math.sqrt(rows) / floor


def row_count_sensitivity(*, clip: float, max_rows: int, adjacency: Adjacency = "replace") -> float:
    """``2 * clip * sqrt(max_rows)``: the sensitivity when every row of the release may change.

    This is the bound to use when the weights that produce the release are trained on the
    client's clean features (local updates), or when no occurrence cap is enforced: one node's
    features can then move the weights and through them every row. ``max_rows`` is the number
    of rows of the release (or a cap on it); it depends on the sampled structure only.
    """
    clip = check_positive("clip", clip)
    rows = check_int("max_rows", max_rows, minimum=1)
    return _per_row_change(clip, adjacency) * math.sqrt(rows)


# --------------------------------------------------------------------------------------------
# Noise
# --------------------------------------------------------------------------------------------


def privatize(
    matrix: np.ndarray, *, clip: float, noise_std: float, noise: NoiseSource
) -> np.ndarray:
    """Clip every row to norm ``clip``, then add i.i.d. N(0, noise_std^2) to every coordinate.

    ``noise_std`` is this client's standard deviation: ``z * Delta`` on its own, or
    :func:`per_client_noise_std` when the noise is shared between clients. Returns float64.
    """
    noise_std = check_non_negative("noise_std", noise_std)
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
    z = check_non_negative("noise_multiplier", noise_multiplier)
    delta_ = check_positive("sensitivity", sensitivity)
    m = check_int("clients", clients, minimum=1)
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
    z = check_non_negative("noise_multiplier", noise_multiplier)
    m = check_int("clients", clients, minimum=1)
    j = check_int("colluding", colluding, minimum=1)
    if m == 1 or not shared:
        return z
    if j > m - 1:
        raise ValueError(f"at most clients - 1 = {m - 1} peers can collude, got {j}")
    return z * math.sqrt((m - j) / m)
