"""Two values per slot, seeded secret-key ciphertexts (secure/ckks_packing.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts

from secure.ckks_context import (
    GLOBAL_SCALE,
    POLY_MODULUS_DEGREE,
    new_context,
    public_context_bytes,
)
from secure.ckks_packing import (
    VALUES_PER_CIPHERTEXT,
    SecretKeyCipher,
    check_share_chunk,
    slots_for,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def context() -> ts.Context:
    return new_context()


@pytest.fixture(scope="module")
def cipher(context: ts.Context) -> SecretKeyCipher:
    return SecretKeyCipher(context)


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
    context: ts.Context, cipher: SecretKeyCipher
) -> None:
    """Every encryption draws a new seed and new noise; the service's sum (no seed) is about
    twice a share's chunk."""
    values = np.linspace(-1, 1, VALUES_PER_CIPHERTEXT)
    (first,), (second,) = cipher.encrypt(values), cipher.encrypt(values)
    assert first != second
    check_share_chunk(first)  # uncompressed
    full_polynomials = 2 * POLY_MODULUS_DEGREE * 8  # two polynomials of 64-bit coefficients
    assert len(first) < 0.51 * full_polynomials
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


def test_compressed_or_oddly_framed_share_chunks_are_refused(
    context: ts.Context, cipher: SecretKeyCipher
) -> None:
    (good,) = cipher.encrypt(np.ones(8))
    check_share_chunk(good)
    compressed = ts.ckks_vector(context, [1.0, 2.0]).serialize()  # TenSEAL's own: zstd
    with pytest.raises(ValueError, match="compressed"):
        check_share_chunk(compressed)
    seal_start = good.index(b"\x5e\xa1")
    cases = {
        "a field after the scale": good + b"\x20\x01",
        "no scale": good[:-9],
        "a second ciphertext": good[:-9] + good[good.index(b"\x12") : -9] + good[-9:],
        "SEAL size too large": good[: seal_start + 8] + b"\xff" * 8 + good[seal_start + 16 :],
        "empty": b"",
        "sizes only": good[:4],
    }
    for name, chunk in cases.items():
        with pytest.raises(ValueError):
            check_share_chunk(chunk)
            pytest.fail(f"accepted: {name}")


_LOAD_IN_A_CHILD = """
import sys
from pathlib import Path

import tenseal as ts

from secure.aggregation import PayloadError
from secure.ckks import CkksSumAggregator, frame_chunks

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


def test_the_service_refuses_a_compressed_share_that_aborts_seal() -> None:
    """A zstd-compressed seeded ciphertext (one of the fuzz test's byte-flipped shares) on which
    SEAL's load calls std::terminate. The service refuses it before SEAL parses it; loading it
    through TenSEAL, as the service did before, kills the process (run apart, so the abort fails
    only that child)."""

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
    assert "refused: chunk 0: the ciphertext is compressed" in service.stdout
    bare = load("tenseal")
    assert bare.returncode != 0 and "terminate" in bare.stderr
