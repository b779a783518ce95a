"""Two real values per CKKS slot, encrypted with the secret key and sent seeded.

TenSEAL's ``CKKSVector`` puts one real value in each of a ciphertext's N/2 slots and serializes
both of its polynomials. SEAL does better on both counts, and TenSEAL ships SEAL's own Python
binding (``tenseal.sealapi``), which reaches it:

- A slot holds a complex number, so a ciphertext carries N real values, a pair per slot as its
  real and imaginary parts. Homomorphic addition adds the two parts independently, so the service
  sums these ciphertexts exactly as before, with half as many of them to load, add and send.
- Workers hold the secret key, so they encrypt with it: ``(-a*s + m + e, a)`` at the data prime,
  skipping public-key encryption at the key level and the division by the special prime (about
  half the CPU; its decoding error is the fresh noise and the encoding's rounding alone, 22 times
  less variance than a public-key share's). ``a`` is uniformly random, so SEAL saves it as the
  64-byte seed that drew it: half the bytes. SEAL's ``load`` draws ``a`` again, and the service
  loads shares through TenSEAL, which calls it, so it needs no change; the sums it returns are
  ordinary ciphertexts.
- Shares travel uncompressed. SEAL's binding saves only with zstd compression, and loading some
  malformed zstd-compressed *seeded* ciphertexts aborts the process: in the SEAL that TenSEAL
  0.3.18 bundles (4.3, by its serialization headers), ``InflateGetBuffer`` restores the stream's
  exception mask in its destructor, which throws when the stream has failed, and a throwing
  destructor calls ``std::terminate`` (found by the fuzz test in tests/secure/test_ckks_codec.py,
  about 1 in 10,000 random triple byte flips). So the worker inflates the saved bytes again
  (``zstandard``) and the service refuses any compressed share before SEAL sees it
  (:func:`check_share_chunk`): SEAL never inflates what a client sent. The cost is 8.0 bytes per
  value up instead of 6.3; no uncompressed seeded chunk aborted in 90,000 flipped ones.

The decoding error of each part of a slot is distributed as that of a real-packed slot (the real
and the imaginary part of one complex error: docs/encryption.md), so
:data:`~secure.ckks_context.SUM_ERROR_BOUND` bounds both. The SEAL objects are built on the TenSEAL
context's own SEAL context and secret key: TenSEAL's two extension modules are built from one
SEAL source in one wheel (the version is pinned) and accept each other's objects.
"""

from __future__ import annotations

import os
import struct
import tempfile
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import tenseal as ts
import zstandard
from tenseal import sealapi

from secure.ckks_context import SLOTS_PER_CIPHERTEXT

# A ciphertext carries two real values per slot.
VALUES_PER_CIPHERTEXT = 2 * SLOTS_PER_CIPHERTEXT


def slots_for(values: int) -> int:
    """How many slots ``values`` real values take (the last slot's imaginary part may be 0)."""
    return -(-values // 2)


class _Saveable(Protocol):
    def save(self, path: str, /) -> None: ...


class _SaveBuffer:
    """Where SEAL's binding, which saves only to a file path, writes a ciphertext to be read back:
    an anonymous in-memory file (``memfd``) on Linux, else a file in a private temporary
    directory. One per :meth:`SecretKeyCipher.encrypt` call, so concurrent calls never share it."""

    def __enter__(self) -> _SaveBuffer:
        self._fd: int | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self._fd = os.memfd_create("glasu-ckks", os.MFD_CLOEXEC)
            self.path = f"/proc/self/fd/{self._fd}"
        else:
            self._directory = tempfile.TemporaryDirectory(prefix="glasu-ckks-")
            self.path = os.path.join(self._directory.name, "ciphertext")
        return self

    def saved(self, item: _Saveable) -> bytes:
        item.save(self.path)  # truncates and rewrites the file
        with open(self.path, "rb") as file:
            return file.read()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if self._directory is not None:
            self._directory.cleanup()


class SecretKeyCipher:
    """Encrypts chunks of up to :data:`VALUES_PER_CIPHERTEXT` values with the secret key into
    serialized TenSEAL CKKS vectors (seeded, uncompressed), and decrypts summed ones."""

    def __init__(self, context: ts.Context) -> None:
        native = context.data
        seal_context = native.seal_context()
        secret_key = native.secret_key()
        self._encoder = sealapi.CKKSEncoder(seal_context)
        self._encryptor = sealapi.Encryptor(seal_context, secret_key)
        self._decryptor = sealapi.Decryptor(seal_context, secret_key)
        self._scale = context.global_scale

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        """One serialized vector per :data:`VALUES_PER_CIPHERTEXT` of the float64 ``values``."""
        with _SaveBuffer() as buffer:
            return [
                self._encrypt_chunk(values[start : start + VALUES_PER_CIPHERTEXT], buffer)
                for start in range(0, values.size, VALUES_PER_CIPHERTEXT)
            ]

    def _encrypt_chunk(self, values: np.ndarray, buffer: _SaveBuffer) -> bytes:
        if values.size % 2:
            values = np.append(values, 0.0)
        plaintext = sealapi.Plaintext()
        self._encoder.encode(values.view(np.complex128).tolist(), self._scale, plaintext)
        seeded = buffer.saved(self._encryptor.encrypt_symmetric(plaintext))
        return tenseal_vector_bytes(uncompressed(seeded), slots=values.size // 2, scale=self._scale)

    def decrypt(self, ciphertext: Any, *, values: int) -> np.ndarray:
        """The first ``values`` float64 values of a SEAL ciphertext (TenSEAL's binding of one),
        with their CKKS error."""
        plaintext = sealapi.Plaintext()
        self._decryptor.decrypt(ciphertext, plaintext)
        slots = self._encoder.decode_complex(plaintext)  # every slot of the ring, as a list
        decoded = np.fromiter(slots, dtype=np.complex128, count=len(slots))
        return decoded.view(np.float64)[:values]


# TenSEAL 0.3.18 serializes a CKKSVector as a CKKSVectorProto (tenseal/proto/tensors.proto):
# field 1 ``sizes`` (packed repeated uint32), field 2 ``ciphertexts`` (repeated bytes: SEAL's
# serialization), field 3 ``scale`` (double), in that order (a test compares with TenSEAL's own).
_SIZES_TAG = bytes([1 << 3 | 2])
_CIPHERTEXT_TAG = bytes([2 << 3 | 2])
_SCALE_TAG = bytes([3 << 3 | 1])
_DOUBLE = struct.Struct("<d")


def tenseal_vector_bytes(ciphertext: bytes, *, slots: int, scale: float) -> bytes:
    """A serialized TenSEAL CKKSVector of ``slots`` slots around one serialized SEAL ciphertext."""
    sizes = _varint(slots)
    return b"".join(
        (
            _SIZES_TAG,
            _varint(len(sizes)),
            sizes,
            _CIPHERTEXT_TAG,
            _varint(len(ciphertext)),
            ciphertext,
            _SCALE_TAG,
            _DOUBLE.pack(scale),
        )
    )


def _varint(value: int) -> bytes:
    encoded = bytearray()
    while value > 0x7F:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


# SEAL's serialization header (seal/serialization.h, ``SEALHeader``), little-endian: magic 0xA15E
# (uint16), header size (uint8, 16), version major and minor (uint8 each), compression mode
# (uint8), 2 reserved bytes, total size in bytes, header included (uint64); the object follows.
_SEAL_HEADER = struct.Struct("<HBBBBHQ")
_SEAL_MAGIC = 0xA15E
SEAL_COMPRESSION_NONE = 0
SEAL_COMPRESSION_ZSTD = 2
_MAX_INFLATED_BYTES = 1 << 20  # a 2-polynomial ciphertext at N = 4096 and one prime: ~64 KiB


def uncompressed(serialized: bytes) -> bytes:
    """A SEAL object saved with zstd compression, as SEAL would have saved it without."""
    magic, header_size, major, minor, mode, reserved, size = _SEAL_HEADER.unpack_from(serialized)
    if magic != _SEAL_MAGIC or mode != SEAL_COMPRESSION_ZSTD or size != len(serialized):
        raise ValueError("not a zstd-compressed SEAL serialization")
    members = zstandard.ZstdDecompressor().decompress(
        serialized[header_size:], max_output_size=_MAX_INFLATED_BYTES
    )
    header = _SEAL_HEADER.pack(
        magic,
        header_size,
        major,
        minor,
        SEAL_COMPRESSION_NONE,
        reserved,
        header_size + len(members),
    )
    return header + members


def check_share_chunk(chunk: bytes) -> None:
    """Raise ValueError unless ``chunk`` is laid out as :func:`tenseal_vector_bytes` writes it,
    around one uncompressed SEAL serialization (see the module docstring for why)."""
    ciphertext = _field(chunk, _SIZES_TAG, 0)
    ciphertext = _field(chunk, _CIPHERTEXT_TAG, ciphertext.stop)
    if chunk[ciphertext.stop : ciphertext.stop + 1] != _SCALE_TAG:
        raise ValueError("no scale after the ciphertext")
    if len(chunk) != ciphertext.stop + 1 + _DOUBLE.size:
        raise ValueError("bytes after the scale")
    if ciphertext.stop - ciphertext.start < _SEAL_HEADER.size:
        raise ValueError("the ciphertext is shorter than SEAL's header")
    magic, _, _, _, mode, _, size = _SEAL_HEADER.unpack_from(chunk, ciphertext.start)
    if magic != _SEAL_MAGIC or size != ciphertext.stop - ciphertext.start:
        raise ValueError("the ciphertext is not one SEAL serialization")
    if mode != SEAL_COMPRESSION_NONE:
        raise ValueError(
            f"the ciphertext is compressed (SEAL compression mode {mode}): shares must"
            " be sent uncompressed"
        )


def _field(data: bytes, tag: bytes, offset: int) -> range:
    """Where the length-delimited field ``tag``, expected at ``offset``, holds its bytes."""
    if data[offset : offset + 1] != tag:
        raise ValueError(f"protobuf field {tag[0] >> 3} expected at byte {offset}")
    length, shift, position = 0, 0, offset + 1
    while True:
        if position >= len(data) or shift > 28:
            raise ValueError("bad protobuf length")
        byte = data[position]
        length |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if byte < 0x80:
            break
    if position + length > len(data):
        raise ValueError("protobuf field runs past the end")
    return range(position, position + length)
