"""CKKS parameters and key material: generating, writing and loading TenSEAL contexts.

Workers hold the *secret* context (provisioned out of band); the service holds the *public* one,
which cannot decrypt. Neither file carries Galois or relinearization keys: the protocol only adds
ciphertexts. See docs/encryption.md for the measurements behind the constants below.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tenseal as ts

# Chosen by measurement (bench/he.py, TenSEAL 0.3.18, docs/encryption.md): one 40-bit data prime
# plus a 14-bit special prime = 54 bits, SEAL's 128-bit maximum for N = 2048. Ciphertexts carry
# only the data prime: 24.1 bytes per float (6.0x float32); max abs error of a sum of 16 shares
# with |x| <= 1 measured at 1.8e-5 to 2.1e-5 (5.2e-5 with fully correlated noise; target 1e-4).
# A 32-bit prime (16.6 B/float) misses the error target or overflows at 16 shares; 34 bits
# (21.1 B/float) has 1/32 of the range. N = 4096/8192 cost as many or more bytes with more noise
# or bigger keys; N = 1024 cannot hold two NTT primes within its 27 bits.
POLY_MODULUS_DEGREE = 2048
COEFF_MOD_BIT_SIZES = (40, 14)
GLOBAL_SCALE_BITS = 29
GLOBAL_SCALE = float(2**GLOBAL_SCALE_BITS)
SLOTS_PER_CIPHERTEXT = POLY_MODULUS_DEGREE // 2

# Encodable range. A sum s decodes correctly while |s| * 2^29 < q / 2 ~ 2^39, i.e. |s| < 1024;
# we keep a factor 2 of margin and split it over at most MAX_SHARES shares.
MAX_SHARES = 16
MAX_ABS_SUM = 512.0


def share_bound(*, clients: int) -> float:
    """The largest |value| each of ``clients`` shares may hold so that their sum decodes."""
    if not 1 <= clients <= MAX_SHARES:
        raise ValueError(f"CKKS parameters are sized for 1..{MAX_SHARES} clients, got {clients}")
    return MAX_ABS_SUM / clients


# Absolute decoding error of a sum of up to MAX_SHARES shares (design target, ~5x the measured).
SUM_ERROR_BOUND = 1e-4

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
    parms_id: tuple[int, ...]
    slots: int
    scale: float


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
    return context.serialize(
        save_public_key=True,
        save_secret_key=True,
        save_galois_keys=False,
        save_relin_keys=False,
    )


def public_context_bytes(context: ts.Context) -> bytes:
    """Parameters and public key only: what the service gets. Deterministic for a key pair."""
    return context.serialize(
        save_public_key=True,
        save_secret_key=False,
        save_galois_keys=False,
        save_relin_keys=False,
    )


def context_key_id(context: ts.Context) -> bytes:
    """A short public fingerprint of (parameters, scale, public key), equal on both sides."""
    return hashlib.sha256(public_context_bytes(context)).digest()[:KEY_ID_BYTES]


def generate_keys(out_dir: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``secret.context`` (mode 0600) and ``public.context`` into ``out_dir``.

    Refuses to replace existing key files unless ``overwrite``: losing a secret key loses every
    ciphertext made with it. Returns ``(secret_path, public_path)``.
    """
    out_dir = Path(out_dir)
    secret_path = out_dir / SECRET_CONTEXT_NAME
    public_path = out_dir / PUBLIC_CONTEXT_NAME
    existing = [path for path in (secret_path, public_path) if path.exists()]
    if existing and not overwrite:
        names = ", ".join(str(path) for path in existing)
        raise KeyMaterialError(f"key files already exist: {names} (pass overwrite=True)")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    context = new_context()
    _write_atomically(secret_path, secret_context_bytes(context), mode=0o600)
    _write_atomically(public_path, public_context_bytes(context), mode=0o644)
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
    """Check ``context`` against the module's parameters and derive its key id and level."""
    check_parameters(context, origin="context")
    seal_context = context.seal_context().data
    return LoadedContext(
        context=context,
        key_id=context_key_id(context),
        parms_id=tuple(seal_context.first_parms_id()),
        slots=POLY_MODULUS_DEGREE // 2,
        scale=context.global_scale,
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


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    """Write to a temporary file created with ``mode`` and rename it over ``path``."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(descriptor, mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
