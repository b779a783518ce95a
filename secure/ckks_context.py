"""CKKS parameters and key material: generating, writing and loading TenSEAL contexts.

Workers hold the *secret* context (provisioned out of band); the service holds the *public* one,
which cannot decrypt. Neither file carries Galois or relinearization keys: the protocol only adds
ciphertexts. See docs/encryption.md for the measurements behind the constants below.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tenseal as ts

from secure.ckks_packing import ChunkLayout
from secure.files import atomic_write

# HomomorphicEncryption.org security standard (Albrecht et al., 2018), ternary secret (SEAL samples
# a uniform ternary secret key): the largest total coefficient-modulus bit count log2(q) per ring
# degree N, for 128-bit security against classical and against quantum attacks (the same values
# as SEAL's hestdparms.h, SEAL_HE_STD_PARMS_128_TC and _128_TQ). The bound applies to the
# key-level modulus: the product of *all* primes, special prime included.
HE_STANDARD_128_CLASSICAL = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
HE_STANDARD_128_QUANTUM = {1024: 25, 2048: 51, 4096: 101, 8192: 202, 16384: 411, 32768: 827}

# Chosen with a security margin (docs/encryption.md, bench/he.py, TenSEAL 0.3.18): N = 4096 with a
# 41-bit data prime and a 24-bit special prime, 65 bits in all: 44 bits below the 128-bit classical
# limit (109) and 36 below the 128-bit post-quantum one (101); it is also within the 192-bit
# tables (75 classical, 70 post-quantum). Ciphertexts carry only the data prime: 12.5 bytes per
# value in a sum (two values per slot, secure/ckks_packing.py), 6.3 in a seeded share. Doubling N
# doubles the decoding error at a given scale, so the scale is 2^30 (one bit more than N = 2048's
# 2^29) and the data prime 41 bits (one more than 40) to keep both the old error and the old
# range; a 40-bit prime at 2^29 would cost 4 % fewer bytes with twice the error. The previous
# N = 2048, (40, 14) sat exactly at the 128-bit classical limit (54) and above the post-quantum
# one (51).
POLY_MODULUS_DEGREE = 4096
COEFF_MOD_BIT_SIZES = (41, 24)
GLOBAL_SCALE_BITS = 30
GLOBAL_SCALE = float(2**GLOBAL_SCALE_BITS)
SLOTS_PER_CIPHERTEXT = POLY_MODULUS_DEGREE // 2
# Two real values per slot: the real and imaginary part (secure/ckks_packing.py).
VALUES_PER_CIPHERTEXT = 2 * SLOTS_PER_CIPHERTEXT

# Encodable range. A coefficient of an encoded sum is at most its largest slot magnitude times
# 2^30, and decodes correctly below q / 2 ~ 2^40, i.e. for slots of magnitude below 1024. A slot
# holds two sums (real and imaginary part, secure/ckks_packing.py) of |s| <= 512 each, so its
# magnitude is at most 724: a factor sqrt(2) of margin in the worst case. The 512 are split over
# at most MAX_SHARES shares.
MAX_SHARES = 16
MAX_ABS_SUM = 512.0


def share_bound(*, clients: int) -> float:
    """The largest |value| each of ``clients`` shares may hold so that their sum decodes."""
    if not 1 <= clients <= MAX_SHARES:
        raise ValueError(f"CKKS parameters are sized for 1..{MAX_SHARES} clients, got {clients}")
    return MAX_ABS_SUM / clients


def decoding_error_scale(
    *, shares: int, poly_modulus_degree: int = POLY_MODULUS_DEGREE, scale: float = GLOBAL_SCALE
) -> float:
    """Laplace scale b of one value's decoding error in a sum of ``shares`` independently
    encrypted shares: P(|error| > t) ~ exp(-t / b). The parameters are the product's unless
    given (bench/he.py compares candidates).

    The error is dominated by the rounding r1 * s of SEAL's switch of a fresh public-key
    ciphertext from the key level to the data prime (r1: coefficients in [-1/2, 1/2], variance
    1/12; s: ternary secret, variance 2/3). In a slot it is Re(sigma(r1) sigma(s)) / scale, the
    real part of a product of two complex Gaussians with E|.|^2 = N/12 and 2N/3, i.e. Laplace
    with scale N / (2 sqrt(18)) / scale; a sum of M shares has sqrt(M) times that. The other
    terms (encoding rounding, r0, key-level noise / special prime) add < 1 % (docs/encryption.md).
    """
    return poly_modulus_degree * math.sqrt(shares / 18) / (2 * scale)


# Absolute decoding error of a sum of up to MAX_SHARES independently encrypted shares, exceeded
# with probability at most 2^-40 per value: 40 ln 2 Laplace scales, 5.0e-5 (the largest of 524,288
# values measured: 1.9e-5; N = 2048 at 2^29 had the same bound). Below half a step of the 2^-12
# share grid (1.2e-4, exceeded with probability ~2^-98), so decoded sums round to the exact
# plaintext sum (secure.aggregation.to_grid).
SUM_ERROR_FAILURE_BITS = 40


def sum_error_bound(
    *, shares: int, poly_modulus_degree: int = POLY_MODULUS_DEGREE, scale: float = GLOBAL_SCALE
) -> float:
    """The decoding error of one value of a sum of ``shares`` shares that is exceeded with
    probability at most 2^-SUM_ERROR_FAILURE_BITS (:func:`decoding_error_scale`)."""
    laplace_scale = decoding_error_scale(
        shares=shares, poly_modulus_degree=poly_modulus_degree, scale=scale
    )
    return laplace_scale * SUM_ERROR_FAILURE_BITS * math.log(2)


SUM_ERROR_BOUND = sum_error_bound(shares=MAX_SHARES)

SECRET_CONTEXT_NAME = "secret.context"
PUBLIC_CONTEXT_NAME = "public.context"
KEY_ID_BYTES = 8
_CONTEXT_THREADS = 1  # encrypt/add/decrypt of one vector never use TenSEAL's thread pool


class KeyMaterialError(ValueError):
    """A key file or context that is missing, corrupt, of the wrong kind or wrong parameters."""


@dataclass(frozen=True)
class LoadedContext:
    """A checked TenSEAL context plus the facts that payload validation needs."""

    context: ts.Context
    key_id: bytes
    layout: ChunkLayout


def new_context() -> ts.Context:
    """A fresh CKKS context (new key pair) with the module's parameters."""
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=POLY_MODULUS_DEGREE,
        coeff_mod_bit_sizes=list(COEFF_MOD_BIT_SIZES),
        n_threads=_CONTEXT_THREADS,
    )
    context.global_scale = GLOBAL_SCALE
    return context


def secret_context_bytes(context: ts.Context) -> bytes:
    """Everything a worker needs: parameters, public and secret key (no relin/Galois keys)."""
    if not context.is_private():
        raise KeyMaterialError("this context holds no secret key")
    return _serialize(context, secret_key=True)


def public_context_bytes(context: ts.Context) -> bytes:
    """Parameters and public key only: what the service gets. Deterministic for a key pair."""
    return _serialize(context, secret_key=False)


def _serialize(context: ts.Context, *, secret_key: bool) -> bytes:
    return context.serialize(
        save_public_key=True,
        save_secret_key=secret_key,
        save_galois_keys=False,
        save_relin_keys=False,
    )


def context_key_id(context: ts.Context) -> bytes:
    """A short public fingerprint of (parameters, scale, public key), equal on both sides.

    ``sha256(public_context_bytes(context))[:KEY_ID_BYTES]``, i.e. the first 8 bytes of SHA-256
    over the exact bytes of ``public.context``: re-serializing a loaded public or secret context
    reproduces those bytes (tested), so the first 16 hex digits of the service's
    ``public_context_sha256`` are the key id.
    """
    return hashlib.sha256(public_context_bytes(context)).digest()[:KEY_ID_BYTES]


def generate_keys(out_dir: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``secret.context`` (mode 0600) and ``public.context`` into ``out_dir``.

    Refuses to replace existing key files unless ``overwrite``: losing a secret key loses every
    ciphertext made with it. Returns ``(secret_path, public_path)``.
    """
    return write_context_files(
        Path(out_dir), new_context, names=(SECRET_CONTEXT_NAME, PUBLIC_CONTEXT_NAME),
        overwrite=overwrite,
    )  # fmt: skip


def write_context_files(
    out_dir: Path,
    make_context: Callable[[], ts.Context],
    *,
    names: tuple[str, str],
    overwrite: bool,
) -> tuple[Path, Path]:
    """A fresh context of ``make_context`` written as ``names`` (secret, mode 0600; public) in
    ``out_dir``; :class:`KeyMaterialError` for existing files unless ``overwrite``."""
    secret_path, public_path = (out_dir / name for name in names)
    existing = [path for path in (secret_path, public_path) if path.exists()]
    if existing and not overwrite:
        listed = ", ".join(str(path) for path in existing)
        raise KeyMaterialError(f"key files already exist: {listed} (pass overwrite=True)")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    context = make_context()
    atomic_write(secret_path, secret_context_bytes(context), mode=0o600)
    atomic_write(public_path, public_context_bytes(context), mode=0o644)
    return secret_path, public_path


def load_public_context(source: Path | str | bytes) -> ts.Context:
    """The service's context. Refuses a context that holds a secret key."""
    context = _deserialize(_read_source(source), origin=_describe_source(source))
    if context.is_private():
        raise KeyMaterialError(
            f"{_describe_source(source)} contains a secret key; the service must only ever get"
            f" the public context ({PUBLIC_CONTEXT_NAME})"
        )
    check_parameters(context, origin=_describe_source(source))
    return context


def load_secret_context(path: Path | str) -> ts.Context:
    """A worker's context. Refuses a public-only context (it could not decrypt)."""
    context = _deserialize(_read_source(Path(path)), origin=str(path))
    if not context.is_private():
        raise KeyMaterialError(
            f"{path} holds no secret key: workers need {SECRET_CONTEXT_NAME}, not the public one"
        )
    check_parameters(context, origin=str(path))
    return context


def describe_context(context: ts.Context) -> LoadedContext:
    """Check ``context`` against the module's parameters and derive its key id and chunk layout."""
    check_parameters(context, origin="context")
    return LoadedContext(
        context=context, key_id=context_key_id(context), layout=ChunkLayout.of(context)
    )


def check_parameters(context: ts.Context, *, origin: str) -> None:
    """Raise :class:`KeyMaterialError` unless ``context`` uses this module's CKKS parameters."""
    try:
        found = _parameters_of(context)
    except Exception as error:  # TenSEAL raises assorted types for unusable contexts
        raise KeyMaterialError(f"{origin}: not a usable CKKS context ({error})") from None
    expected = (
        POLY_MODULUS_DEGREE,
        1,
        COEFF_MOD_BIT_SIZES[0],
        sum(COEFF_MOD_BIT_SIZES),
        GLOBAL_SCALE,
    )
    if found != expected:
        raise KeyMaterialError(
            f"{origin}: CKKS parameters (N, data levels, data bits, total bits, scale) = {found},"
            f" expected {expected}; regenerate the keys with `glasu keygen`"
        )
    if not context.has_public_key():
        raise KeyMaterialError(f"{origin}: the context has no public key")


def _parameters_of(context: ts.Context) -> tuple[int, int, int, int, float]:
    seal_context = context.seal_context().data
    first = seal_context.first_context_data()
    if first.parms().scheme() != ts.SCHEME_TYPE.CKKS.value:
        raise ValueError(f"scheme is {first.parms().scheme()}, not CKKS")
    return (
        first.parms().poly_modulus_degree(),
        first.chain_index() + 1,
        first.total_coeff_modulus_bit_count(),
        seal_context.key_context_data().total_coeff_modulus_bit_count(),
        context.global_scale,
    )


def _deserialize(data: bytes, *, origin: str) -> ts.Context:
    if not data:
        raise KeyMaterialError(f"{origin}: empty key material")
    try:
        return ts.context_from(data, n_threads=_CONTEXT_THREADS)
    except Exception as error:  # protobuf/SEAL parse errors surface as several types
        raise KeyMaterialError(
            f"{origin}: not a TenSEAL context (corrupt or truncated?): {error}"
        ) from None


def _read_source(source: Path | str | bytes) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source)
    path = Path(source)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KeyMaterialError(f"{path}: no such key file") from None
    except OSError as error:
        raise KeyMaterialError(f"{path}: cannot read key file ({error.strerror})") from None


def _describe_source(source: Path | str | bytes) -> str:
    if isinstance(source, bytes | bytearray | memoryview):
        return "the given context bytes"
    return str(source)
