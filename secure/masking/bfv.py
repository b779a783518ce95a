"""Shares as exact integers in TenSEAL's BFV batching, so that uniform masks modulo ``t`` can
hide them and cancel in the encrypted sum.

CKKS slots hold approximate reals with no wrap-around, so a mask in them cannot be uniform; BFV
slots hold integers modulo the plaintext modulus ``t`` and add exactly. A share's values lie on
the 2^-12 share grid (:data:`secure.aggregation.SHARE_GRID`), so ``round(value * 2^12) mod t``
is exact, and a sum decodes back by reading its residue in (-t/2, t/2) and scaling.

Parameters (docs/secure-aggregation.md):

- N = 4096 (as the CKKS path), coefficient modulus (40, 40): 80 bits, within the HE standard's
  128-bit classical limit for N = 4096 (109 bits). Ciphertexts carry the 40-bit data prime only.
  An encrypted sum of 16 shares keeps 8 bits of SEAL's invariant noise budget (measured with
  ``sealapi.Decryptor.invariant_noise_budget``: fresh 10): additions cost at most 4 bits.
  TenSEAL makes relinearisation keys, so a single prime (no special prime) is refused.
- t = 8380417 = 2^23 - 2^13 + 1: prime and 1 modulo 2N = 8192, as batching needs. A sum of up to
  (t - 1) / 2 grid steps, |sum| <= 1023, decodes: about twice the CKKS path's range
  (:data:`secure.ckks_context.MAX_ABS_SUM` = 512), so shares bounded by ``share_bound`` fit. Being
  just below 2^23, 99.9 % of 23-bit draws are below ``t``: mask streams reject almost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal as ts

from secure.aggregation import SHARE_GRID, to_grid
from secure.ckks_context import MAX_ABS_SUM

POLY_MODULUS_DEGREE = 4096
COEFF_MOD_BIT_SIZES = (40, 40)
PLAIN_MODULUS = 8380417  # 2^23 - 2^13 + 1, prime, = 1 mod 2 * POLY_MODULUS_DEGREE
SLOTS_PER_CIPHERTEXT = POLY_MODULUS_DEGREE
#: The largest |sum| that decodes: (t - 1) / 2 grid steps.
DECODABLE_ABS_SUM = (PLAIN_MODULUS - 1) // 2 * SHARE_GRID
#: The largest |value| a wrapped share may hold: far beyond any noise, and small enough that
#: its integer on the grid stays exact in float64 and int64.
WRAP_ABS_LIMIT = 2.0**40


def new_bfv_context() -> ts.Context:
    """A fresh BFV context (new key pair) with this module's parameters."""
    return ts.context(
        ts.SCHEME_TYPE.BFV,
        poly_modulus_degree=POLY_MODULUS_DEGREE,
        plain_modulus=PLAIN_MODULUS,
        coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES),
        n_threads=1,  # as the CKKS contexts: one vector's calls never use TenSEAL's thread pool
    )


def public_bfv_context(context: ts.Context) -> ts.Context:
    """A copy of ``context`` without its secret key (what the service may hold)."""
    public = context.copy()
    public.make_context_public()
    return public


def encode_share(
    values: np.ndarray, *, modulus: int = PLAIN_MODULUS, wrap: bool = False
) -> np.ndarray:
    """A share's values (flattened, rounded to the share grid) as integers in [0, modulus).
    ``wrap``: any value is reduced modulo ``modulus`` (a split-noise share, whose sum is what
    must decode); otherwise a value beyond ``MAX_ABS_SUM`` is refused."""
    grid = to_grid(np.ravel(values))
    largest = float(np.max(np.abs(grid), initial=0.0))
    if largest > (WRAP_ABS_LIMIT if wrap else MAX_ABS_SUM):
        raise ValueError(
            f"share has |value| {largest:.4g} > {MAX_ABS_SUM:g}: its sum may not decode"
        )
    return np.round(grid / SHARE_GRID).astype(np.int64) % modulus


def add_mask(encoded: np.ndarray, mask: np.ndarray, *, modulus: int = PLAIN_MODULUS) -> np.ndarray:
    """An encoded share plus its mask, modulo ``modulus``."""
    if encoded.shape != mask.shape:
        raise ValueError(f"share of {encoded.shape} values, mask of {mask.shape}")
    return (encoded + mask) % modulus


def decode_sum(residues: np.ndarray, *, modulus: int = PLAIN_MODULUS) -> np.ndarray:
    """Float64 values of a sum's residues modulo ``modulus``: each read in (-t/2, t/2]."""
    centred = np.asarray(residues, dtype=np.int64) % modulus
    centred = np.where(centred > modulus // 2, centred - modulus, centred)
    return centred.astype(np.float64) * SHARE_GRID


def encrypt(context: ts.Context, residues: np.ndarray) -> list[bytes]:
    """Residues (int64 in [0, t)) as serialized BFV vectors of up to N values each."""
    step = SLOTS_PER_CIPHERTEXT
    return [
        ts.bfv_vector(context, residues[start : start + step].tolist()).serialize()
        for start in range(0, residues.size, step)
    ]


def add_encrypted(context: ts.Context, shares: Sequence[Sequence[bytes]]) -> list[bytes]:
    """The homomorphic sum of shares encrypted by :func:`encrypt` (what the service does)."""
    if not shares or len({len(chunks) for chunks in shares}) != 1:
        raise ValueError("the shares must be given, each of the same number of chunks")
    sums = []
    for chunks in zip(*shares, strict=True):
        total = ts.bfv_vector_from(context, chunks[0])
        for chunk in chunks[1:]:
            total += ts.bfv_vector_from(context, chunk)
        sums.append(total.serialize())
    return sums


def decrypt(context: ts.Context, chunks: Sequence[bytes]) -> np.ndarray:
    """The residues in [0, t) of encrypted chunks, with ``context``'s secret key."""
    values = [ts.bfv_vector_from(context, chunk).decrypt() for chunk in chunks]
    flat = np.concatenate([np.asarray(v, dtype=np.int64) for v in values]) if values else []
    return np.asarray(flat, dtype=np.int64) % PLAIN_MODULUS
