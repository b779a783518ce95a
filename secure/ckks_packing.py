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
- SEAL never inflates bytes from the network. Ciphertexts travel as SEAL saves them,
  zstd-compressed, but loading some malformed zstd-compressed *seeded* ciphertexts aborts the
  process: in the SEAL that TenSEAL 0.3.18 bundles (4.3, by its serialization headers),
  ``InflateGetBuffer`` restores the stream's exception mask in its destructor, which throws when
  the stream has failed, and a throwing destructor calls ``std::terminate`` (found by the fuzz test
  in tests/secure/test_ckks_codec.py, about 1 in 10,000 random triple byte flips). So whoever
  receives a chunk (the service a share, a worker a sum) inflates it with ``zstandard`` and checks
  its layout before SEAL parses it, uncompressed (:meth:`ChunkLayout.checked`); no abort in 60,000
  flipped compressed shares through that path.

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
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import numpy as np
import tenseal as ts
import zstandard
from tenseal import sealapi


def slots_for(values: int) -> int:
    """How many slots ``values`` real values take (the last slot's imaginary part may be 0)."""
    return -(-values // 2)


class _Saveable(Protocol):
    def save(self, path: str, /) -> None: ...


class SaveBuffer:
    """Where SEAL's binding, which saves only to a file path, writes a ciphertext to be read back:
    an anonymous in-memory file (``memfd``) on Linux, else a file in a private temporary
    directory. One per encryption call (:meth:`SecretKeyCipher.encrypt`, the masked BFV codec's),
    so concurrent calls never share it."""

    def __enter__(self) -> SaveBuffer:
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
    """Encrypts chunks of up to N values (two per slot) with the secret key into serialized
    TenSEAL CKKS vectors (seeded, zstd-compressed as SEAL saves them), and decrypts summed
    ones."""

    def __init__(self, context: ts.Context) -> None:
        native = context.data
        seal_context = native.seal_context()
        secret_key = native.secret_key()
        self._encoder = sealapi.CKKSEncoder(seal_context)
        self._encryptor = sealapi.Encryptor(seal_context, secret_key)
        self._decryptor = sealapi.Decryptor(seal_context, secret_key)
        self._scale = context.global_scale
        self.values_per_ciphertext = 2 * self._encoder.slot_count()

    def encrypt(self, values: np.ndarray) -> list[bytes]:
        """One serialized vector per :attr:`values_per_ciphertext` of the float64 ``values``."""
        step = self.values_per_ciphertext
        with SaveBuffer() as buffer:
            return [
                self._encrypt_chunk(values[start : start + step], buffer)
                for start in range(0, values.size, step)
            ]

    def _encrypt_chunk(self, values: np.ndarray, buffer: SaveBuffer) -> bytes:
        if values.size % 2:
            values = np.append(values, 0.0)
        plaintext = sealapi.Plaintext()
        self._encoder.encode(values.view(np.complex128).tolist(), self._scale, plaintext)
        seeded = buffer.saved(self._encryptor.encrypt_symmetric(plaintext))
        return tenseal_vector_bytes(seeded, slots=values.size // 2, scale=self._scale)

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
# A BFVVector's proto is the same without the scale.
_SIZES_TAG = bytes([1 << 3 | 2])
_CIPHERTEXT_TAG = bytes([2 << 3 | 2])
_SCALE_TAG = bytes([3 << 3 | 1])
_DOUBLE = struct.Struct("<d")


def tenseal_vector_bytes(ciphertext: bytes, *, slots: int, scale: float | None) -> bytes:
    """A serialized TenSEAL CKKSVector of ``slots`` slots around one serialized SEAL ciphertext;
    with ``scale`` None, a BFVVector."""
    sizes = _varint(slots)
    scale_field = b"" if scale is None else _SCALE_TAG + _DOUBLE.pack(scale)
    return b"".join(
        (
            _SIZES_TAG,
            _varint(len(sizes)),
            sizes,
            _CIPHERTEXT_TAG,
            _varint(len(ciphertext)),
            ciphertext,
            scale_field,
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

# What SEAL writes of a ciphertext after its header and before its polynomials
# (seal/ciphertext.cpp, ``Ciphertext::save_members``), little-endian: parms id (4 x uint64), NTT
# form (uint8), size (polynomials), poly modulus degree, coefficient modulus count (uint64 each),
# scale (double), correction factor (uint64; 1 outside BGV).
_CIPHERTEXT_MEMBERS = struct.Struct("<4QBQQQdQ")
_MEMBER_NAMES = (
    "parms id",
    "NTT form",
    "polynomials",
    "poly modulus degree",
    "coefficient moduli",
    "scale",
    "correction factor",
)
_CIPHERTEXT_POLYNOMIALS = 2


@dataclass(frozen=True)
class ChunkLayout:
    """How every chunk under one context is laid out before SEAL may parse it.

    A chunk must be exactly what :func:`tenseal_vector_bytes` writes: one slot count, one SEAL
    serialization, zstd-compressed or not (SEAL must never inflate bytes from the network, so
    :meth:`checked` inflates it with ``zstandard``: see the module docstring), the context's
    scale, nothing else; and the ciphertext's members must be those of a fresh 2-polynomial
    NTT-form ciphertext at the context's data level and scale. Reading these facts from the bytes
    costs a comparison; asking SEAL for them after loading copies the whole ciphertext
    (``CKKSVector.ciphertext()``), a third of what the service spent beyond a bare sum.
    """

    members: bytes  # _CIPHERTEXT_MEMBERS as a chunk under this context must hold them
    scale_field: bytes  # TenSEAL's scale field, tag included

    @classmethod
    def of(cls, context: ts.Context) -> ChunkLayout:
        data_level = context.seal_context().data.first_context_data()
        parms = data_level.parms()
        scale = context.global_scale
        members = _CIPHERTEXT_MEMBERS.pack(
            *data_level.parms_id(),
            True,
            _CIPHERTEXT_POLYNOMIALS,
            parms.poly_modulus_degree(),
            len(parms.coeff_modulus()),
            scale,
            1,
        )
        return cls(members=members, scale_field=_SCALE_TAG + _DOUBLE.pack(scale))

    @classmethod
    def of_bfv(cls, context: ts.Context) -> ChunkLayout:
        """The layout of a TenSEAL BFVVector under ``context`` (secure/masking/codec.py): the
        same proto without the scale field, a fresh 2-polynomial ciphertext at the data level,
        not in NTT form, scale 1."""
        data_level = context.seal_context().data.first_context_data()
        parms = data_level.parms()
        members = _CIPHERTEXT_MEMBERS.pack(
            *data_level.parms_id(),
            False,
            _CIPHERTEXT_POLYNOMIALS,
            parms.poly_modulus_degree(),
            len(parms.coeff_modulus()),
            1.0,
            1,
        )
        return cls(members=members, scale_field=b"")

    def checked(self, chunk: bytes) -> tuple[bytes, int]:
        """``chunk`` as SEAL may parse it, its ciphertext inflated by ``zstandard`` if SEAL
        compressed it, and how many slots it fills; ValueError with a message unless it is laid
        out as this layout says."""
        sizes = _field(chunk, _SIZES_TAG, 0)
        slots, end = _read_varint(chunk, sizes.start)
        if end != sizes.stop:
            raise ValueError("the vector has more than one size (more than one ciphertext)")
        ciphertext = _field(chunk, _CIPHERTEXT_TAG, sizes.stop)
        if chunk[ciphertext.stop :] != self.scale_field:
            if len(chunk) - ciphertext.stop != len(self.scale_field) or (
                chunk[ciphertext.stop : ciphertext.stop + 1] != _SCALE_TAG
            ):
                raise ValueError("the ciphertext is not followed by the scale alone")
            raise ValueError(
                f"vector scale {_DOUBLE.unpack_from(chunk, ciphertext.stop + 1)[0]:.6g} differs"
                f" from the session's {_DOUBLE.unpack_from(self.scale_field, 1)[0]:.6g}"
            )
        if len(ciphertext) < _SEAL_HEADER.size:
            raise ValueError("the ciphertext is shorter than SEAL's header")
        magic, header_size, major, minor, mode, reserved, size = _SEAL_HEADER.unpack_from(
            chunk, ciphertext.start
        )
        if magic != _SEAL_MAGIC or header_size != _SEAL_HEADER.size or size != len(ciphertext):
            raise ValueError("the ciphertext is not one SEAL serialization")
        if mode == SEAL_COMPRESSION_ZSTD:
            body = _inflate(memoryview(chunk)[ciphertext.start + header_size : ciphertext.stop])
            size = header_size + len(body)
            inflated_header = _SEAL_HEADER.pack(
                magic, header_size, major, minor, SEAL_COMPRESSION_NONE, reserved, size
            )
            prefix = chunk[: sizes.stop] + _CIPHERTEXT_TAG + _varint(size)
            chunk = b"".join((prefix, inflated_header, body, self.scale_field))
            members = len(prefix) + header_size
        elif mode == SEAL_COMPRESSION_NONE:
            members = ciphertext.start + header_size
        else:
            raise ValueError(f"SEAL compression mode {mode} is not accepted (only zstd or none)")
        if chunk[members : members + _CIPHERTEXT_MEMBERS.size] != self.members:
            raise ValueError(self._members_mismatch(chunk, members))
        return chunk, slots

    def _members_mismatch(self, chunk: bytes, offset: int) -> str:
        if offset + _CIPHERTEXT_MEMBERS.size > len(chunk):
            return "the ciphertext is shorter than SEAL's header and members"
        found = _CIPHERTEXT_MEMBERS.unpack_from(chunk, offset)
        expected = _CIPHERTEXT_MEMBERS.unpack(self.members)
        found_named = (found[:4], *found[4:])
        expected_named = (expected[:4], *expected[4:])
        differences = [
            "not at the session's modulus level"
            if name == "parms id"
            else f"{name} {got} (expected {want})"
            for name, got, want in zip(_MEMBER_NAMES, found_named, expected_named, strict=True)
            if got != want
        ]
        return "the ciphertext does not fit this session: " + "; ".join(differences)


def _inflate(compressed: memoryview) -> bytes:
    """A zstd frame's content, at most :data:`_MAX_INFLATED_BYTES`. ``zstandard`` allocates the
    size a frame declares (``max_output_size`` bounds only frames that declare none), so a
    declared size is checked first: a client could declare a terabyte."""
    try:
        declared = zstandard.frame_content_size(compressed)
        if declared > _MAX_INFLATED_BYTES:
            raise ValueError(
                f"the ciphertext's zstd frame declares {declared} bytes"
                f" (at most {_MAX_INFLATED_BYTES})"
            )
        return zstandard.ZstdDecompressor().decompress(
            compressed, max_output_size=_MAX_INFLATED_BYTES
        )
    except zstandard.ZstdError as error:
        raise ValueError(f"the ciphertext does not inflate: {error}") from None


def _field(data: bytes, tag: bytes, offset: int) -> range:
    """Where the length-delimited field ``tag``, expected at ``offset``, holds its bytes."""
    if data[offset : offset + 1] != tag:
        raise ValueError(f"protobuf field {tag[0] >> 3} expected at byte {offset}")
    length, position = _read_varint(data, offset + 1)
    if position + length > len(data):
        raise ValueError("protobuf field runs past the end")
    return range(position, position + length)


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    """The protobuf varint at ``offset`` (at most five bytes) and the offset after it."""
    value, shift, position = 0, 0, offset
    while True:
        if position >= len(data) or shift > 28:
            raise ValueError(f"bad protobuf varint at byte {offset}")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if byte < 0x80:
            return value, position
