"""Two values per slot, seeded secret-key ciphertexts (secure/ckks_packing.py)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts

from secure.ckks_context import (
    GLOBAL_SCALE,
    POLY_MODULUS_DEGREE,
    VALUES_PER_CIPHERTEXT,
    new_context,
    public_context_bytes,
)
from secure.ckks_packing import (
    SEAL_COMPRESSION_NONE,
    SEAL_COMPRESSION_ZSTD,
    ChunkLayout,
    SecretKeyCipher,
    slots_for,
    tenseal_vector_bytes,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def context() -> ts.Context:
    return new_context()


@pytest.fixture(scope="module")
def cipher(context: ts.Context) -> SecretKeyCipher:
    return SecretKeyCipher(context)


@pytest.fixture(scope="module")
def layout(context: ts.Context) -> ChunkLayout:
    return ChunkLayout.of(context)


def summed(context: ts.Context, chunks: list[list[bytes]]) -> list[object]:
    """What the service does: load each chunk under the public context, add, keep the SEAL
    ciphertexts of the sums."""
    public = ts.context_from(public_context_bytes(context))
    totals = [ts.ckks_vector_from(public, chunk) for chunk in chunks[0]]
    for share in chunks[1:]:
        for total, chunk in zip(totals, share, strict=True):
            total.add_(ts.ckks_vector_from(public, chunk))
    return [total.ciphertext()[0] for total in totals]


@pytest.mark.parametrize("size", [1, 2, 7, VALUES_PER_CIPHERTEXT - 1, VALUES_PER_CIPHERTEXT + 3])
def test_pairs_of_values_share_a_slot_and_add_independently(
    context: ts.Context, cipher: SecretKeyCipher, size: int
) -> None:
    rng = np.random.default_rng(size)
    shares = [rng.uniform(-8, 8, size=size) for _ in range(3)]
    chunks = [cipher.encrypt(share) for share in shares]
    assert len(chunks[0]) == -(-size // VALUES_PER_CIPHERTEXT)
    public = ts.context_from(public_context_bytes(context))
    lengths = [min(VALUES_PER_CIPHERTEXT, size - start) for start in range(0, size, 4096)]
    for chunk, length in zip(chunks[0], lengths, strict=True):
        assert ts.ckks_vector_from(public, chunk).size() == slots_for(length)
    decrypted = np.concatenate(
        [
            cipher.decrypt(ciphertext, values=length)
            for ciphertext, length in zip(summed(context, chunks), lengths, strict=True)
        ]
    )
    np.testing.assert_allclose(decrypted, np.sum(shares, axis=0), rtol=0, atol=1e-5)


def test_seeded_chunks_are_random_and_half_the_expanded_size(
    context: ts.Context, cipher: SecretKeyCipher, layout: ChunkLayout
) -> None:
    """Every encryption draws a new seed and new noise; a share's chunk is about half an
    unseeded ciphertext inflated, and zstd takes a fifth of that off on the wire."""
    values = np.linspace(-1, 1, VALUES_PER_CIPHERTEXT)
    (first,), (second,) = cipher.encrypt(values), cipher.encrypt(values)
    assert first != second
    inflated, slots = layout.checked(first)
    assert slots == VALUES_PER_CIPHERTEXT // 2
    full_polynomials = 2 * POLY_MODULUS_DEGREE * 8  # two polynomials of 64-bit coefficients
    assert len(first) < 0.85 * len(inflated) < 0.85 * 0.51 * full_polynomials
    public = ts.context_from(public_context_bytes(context))
    loaded = ts.ckks_vector_from(public, first).ciphertext()[0]
    assert loaded.size() == 2 and loaded.scale == GLOBAL_SCALE


def test_without_memfd_a_private_temporary_file_serves(
    monkeypatch: pytest.MonkeyPatch, context: ts.Context, cipher: SecretKeyCipher
) -> None:
    """Systems without memfd_create (macOS, Windows) go through a temporary directory, removed
    after the call."""
    monkeypatch.delattr(os, "memfd_create", raising=False)
    created: list[str] = []
    original = os.path.join

    def recording_join(*parts: str) -> str:
        path = original(*parts)
        if path.endswith("ciphertext"):
            created.append(path)
        return path

    monkeypatch.setattr(os.path, "join", recording_join)
    values = np.arange(10, dtype=np.float64) / 8
    chunks = cipher.encrypt(values)
    (ciphertext,) = summed(context, [chunks])
    np.testing.assert_allclose(cipher.decrypt(ciphertext, values=10), values, atol=1e-5)
    assert created and not any(os.path.exists(path) for path in created)


def test_oddly_framed_chunks_are_refused(cipher: SecretKeyCipher, layout: ChunkLayout) -> None:
    (good,) = cipher.encrypt(np.ones(8))
    assert layout.checked(good)[1] == 4
    seal_start = good.index(b"\x5e\xa1")
    zlib = good[: seal_start + 5] + b"\x01" + good[seal_start + 6 :]
    with pytest.raises(ValueError, match="compression mode 1 is not accepted"):
        layout.checked(zlib)
    cases = {
        "a field after the scale": good + b"\x20\x01",
        "no scale": good[:-9],
        "scale cut short": good[:-4],
        "a second ciphertext": good[:-9] + good[good.index(b"\x12") : -9] + good[-9:],
        "two sizes": b"\x0a\x02\x04\x04" + good[4:],
        "SEAL size too large": good[: seal_start + 8] + b"\xff" * 8 + good[seal_start + 16 :],
        "empty": b"",
        "sizes only": good[:4],
    }
    for name, chunk in cases.items():
        with pytest.raises(ValueError):
            layout.checked(chunk)
            pytest.fail(f"accepted: {name}")


def _other_context(**changes: object) -> ts.Context:
    parameters: dict[str, object] = {
        "poly_modulus_degree": POLY_MODULUS_DEGREE,
        "coeff_mod_bit_sizes": [41, 24],
    }
    scale = changes.pop("scale", GLOBAL_SCALE)
    parameters.update(changes)
    other = ts.context(ts.SCHEME_TYPE.CKKS, **parameters)
    other.global_scale = scale
    return other


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ({"scale": 2.0**20}, "vector scale 1.04858e"),
        ({"coeff_mod_bit_sizes": [30, 30, 24]}, "the session's modulus level"),
        ({"poly_modulus_degree": 8192, "coeff_mod_bit_sizes": [41, 24]}, "poly modulus degree"),
    ],
)
def test_ciphertexts_of_other_parameters_are_refused_by_their_bytes(
    layout: ChunkLayout, other: dict[str, object], message: str
) -> None:
    """Chunks that SEAL would parse, encrypted under other parameters: the layout names what
    differs before SEAL sees them."""
    chunk = ts.ckks_vector(_other_context(**other), [0.5] * 4).serialize()
    with pytest.raises(ValueError, match=message):
        layout.checked(chunk)


def test_a_ciphertext_scale_that_disagrees_with_the_vector_is_refused(
    cipher: SecretKeyCipher, layout: ChunkLayout
) -> None:
    """TenSEAL keeps a vector's scale apart from its ciphertext's: both must be the session's."""
    good, _ = layout.checked(cipher.encrypt(np.ones(8))[0])  # inflated
    members = good.index(b"\x5e\xa1") + 16
    scale_offset = members + 32 + 1 + 3 * 8
    wrong = good[:scale_offset] + struct.pack("<d", 2.0**31) + good[scale_offset + 8 :]
    with pytest.raises(ValueError, match=r"scale 2147483648.0 \(expected 1073741824.0\)"):
        layout.checked(wrong)


def test_chunks_are_inflated_by_zstandard_before_seal_loads_them(
    context: ts.Context, cipher: SecretKeyCipher, layout: ChunkLayout
) -> None:
    """A chunk as SEAL saves it (zstd) and as TenSEAL serializes a sum: the checked chunk holds
    the same ciphertext, uncompressed, and an uncompressed chunk passes through unchanged."""
    values = np.linspace(-1, 1, 100)
    (share,) = cipher.encrypt(values)
    vector = ts.ckks_vector_from(context, share)
    for chunk in (share, vector.serialize()):
        plain, slots = layout.checked(chunk)
        seal_start = plain.index(b"\x5e\xa1")
        assert plain[seal_start + 5] == SEAL_COMPRESSION_NONE and slots == 50
        assert layout.checked(plain) == (plain, 50)
        reloaded = ts.ckks_vector_from(context, plain)
        np.testing.assert_allclose(
            cipher.decrypt(reloaded.ciphertext()[0], values=100), values, atol=1e-5
        )
    seal_start = share.index(b"\x5e\xa1")
    broken = share[: seal_start + 40] + bytes(64) + share[seal_start + 104 :]
    with pytest.raises(ValueError, match="does not inflate"):
        layout.checked(broken)


@pytest.mark.parametrize("declared", [1 << 40, (1 << 20) + 1])
def test_a_zstd_frame_declaring_a_huge_size_is_refused_before_allocating(
    layout: ChunkLayout, declared: int
) -> None:
    """zstandard allocates the content size a frame declares; a chunk must not make the service
    allocate more than a ciphertext can take (1 MiB)."""
    single_segment_8_byte_size = 0b11100000  # frame header descriptor
    frame = (
        b"\x28\xb5\x2f\xfd"  # zstd magic
        + bytes([single_segment_8_byte_size])
        + struct.pack("<Q", declared)
        + b"\x01\x00\x00"  # one empty raw block, the last
    )
    seal = struct.pack("<HBBBBHQ", 0xA15E, 16, 4, 3, SEAL_COMPRESSION_ZSTD, 0, 16 + len(frame))
    chunk = tenseal_vector_bytes(seal + frame, slots=4, scale=GLOBAL_SCALE)
    with pytest.raises(ValueError, match=f"declares {declared} bytes"):
        layout.checked(chunk)


_LOAD_IN_A_CHILD = """
import sys
from pathlib import Path

import tenseal as ts

from secure.aggregation import PayloadError
from secure.ckks import CkksSumAggregator
from secure.ckks_frame import frame_chunks

public, chunk, path = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]).read_bytes(), sys.argv[3]
try:
    if path == "service":
        service = CkksSumAggregator.from_bytes(public)
        service.validate(frame_chunks([chunk], key_id=service.key_id), rows=1, cols=4096)
    else:
        ts.ckks_vector_from(ts.context_from(public), chunk)
except (PayloadError, ValueError, RuntimeError) as error:
    print("refused:", error)
"""


def test_a_compressed_chunk_that_aborts_seal_is_inflated_by_zstandard_and_refused() -> None:
    """A zstd-compressed seeded ciphertext (one of the fuzz test's byte-flipped shares) on which
    SEAL's load calls std::terminate. The service (and a worker decoding a sum: the same path)
    inflates it with zstandard, so SEAL parses it uncompressed and refuses it; loading it through
    TenSEAL, as the service once did, kills the process (each run apart, so the abort fails only
    that child)."""

    def load(path: str) -> subprocess.CompletedProcess[str]:
        arguments = [
            str(DATA / "seeded-zstd-share-that-aborts-seal.public.context"),
            str(DATA / "seeded-zstd-share-that-aborts-seal.bin"),
            path,
        ]
        return subprocess.run(
            [sys.executable, "-c", _LOAD_IN_A_CHILD, *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).parents[2],
        )

    service = load("service")
    assert service.returncode == 0, service.stderr
    assert service.stdout.startswith("refused: chunk 0"), service.stdout
    bare = load("tenseal")
    assert bare.returncode != 0 and "terminate" in bare.stderr
