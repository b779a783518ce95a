"""CKKS key material, codec and encrypted sum (secure/ckks.py, secure/ckks_context.py)."""

from __future__ import annotations

import hashlib
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tenseal as ts

from secure.aggregation import (
    SHARE_GRID,
    PayloadError,
    PlainCodec,
    PlainSumAggregator,
    to_grid,
)
from secure.ckks import (
    CkksCodec,
    CkksSumAggregator,
    make_codec,
    make_sum_aggregator,
)
from secure.ckks_context import (
    COEFF_MOD_BIT_SIZES,
    GLOBAL_SCALE_BITS,
    HE_STANDARD_128_CLASSICAL,
    HE_STANDARD_128_QUANTUM,
    KEY_ID_BYTES,
    MAX_ABS_SUM,
    MAX_SHARES,
    POLY_MODULUS_DEGREE,
    SLOTS_PER_CIPHERTEXT,
    SUM_ERROR_BOUND,
    SUM_ERROR_FAILURE_BITS,
    VALUES_PER_CIPHERTEXT,
    KeyMaterialError,
    decoding_error_scale,
    generate_keys,
    load_public_context,
    load_secret_context,
    new_context,
    public_context_bytes,
    share_bound,
)
from secure.ckks_frame import (
    FORMAT_VERSION,
    MAGIC,
    MAX_CHUNK_BYTES,
    chunk_lengths,
    frame_chunks,
    max_payload_bytes,
    parse_frame,
)
from secure.ckks_packing import tenseal_vector_bytes

ROWS, COLS = 33, 130  # 4290 values: one full chunk of 4096 and a partial one


@pytest.fixture(scope="module")
def key_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def codec(key_files: tuple[Path, Path]) -> CkksCodec:
    return CkksCodec.from_file(key_files[0])


@pytest.fixture(scope="module")
def aggregator(key_files: tuple[Path, Path]) -> CkksSumAggregator:
    return CkksSumAggregator.from_bytes(key_files[1].read_bytes())


@pytest.fixture(scope="module")
def other_codec() -> CkksCodec:
    """Same parameters, a different key pair."""
    return CkksCodec(new_context())


def random_share(rows: int, cols: int, *, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size=(rows, cols)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Key material


def test_key_files_modes_and_contents(key_files: tuple[Path, Path]) -> None:
    secret_path, public_path = key_files
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    secret = ts.context_from(secret_path.read_bytes())
    public = ts.context_from(public_path.read_bytes())
    assert secret.is_private() and not public.is_private()
    for context in (secret, public):
        assert not context.has_galois_keys()
        assert not context.has_relin_keys()


def test_generate_keys_refuses_to_overwrite(tmp_path: Path) -> None:
    secret_path, _ = generate_keys(tmp_path)
    before = secret_path.read_bytes()
    with pytest.raises(KeyMaterialError, match="already exist"):
        generate_keys(tmp_path)
    assert secret_path.read_bytes() == before
    generate_keys(tmp_path, overwrite=True)
    assert secret_path.read_bytes() != before
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600


def test_public_context_rejects_secret_file_and_vice_versa(key_files: tuple[Path, Path]) -> None:
    secret_path, public_path = key_files
    with pytest.raises(KeyMaterialError, match="secret key"):
        load_public_context(secret_path)
    with pytest.raises(KeyMaterialError, match="secret key"):
        load_public_context(secret_path.read_bytes())
    with pytest.raises(KeyMaterialError, match="no secret key"):
        load_secret_context(public_path)
    assert not load_public_context(public_path).is_private()
    assert load_secret_context(secret_path).is_private()


def test_roles_refuse_the_wrong_context(key_files: tuple[Path, Path]) -> None:
    secret_path, public_path = key_files
    with pytest.raises(KeyMaterialError):
        CkksSumAggregator(load_secret_context(secret_path))
    with pytest.raises(KeyMaterialError):
        make_sum_aggregator("ckks", secret_path.read_bytes())
    with pytest.raises(KeyMaterialError):
        CkksCodec(load_public_context(public_path))


@pytest.mark.parametrize(
    "content",
    [b"", b"not a context", None],
    ids=["empty", "garbage", "truncated"],
)
def test_corrupt_key_files(
    tmp_path: Path, key_files: tuple[Path, Path], content: bytes | None
) -> None:
    secret = key_files[0].read_bytes()
    path = tmp_path / "broken.context"
    path.write_bytes(secret[: len(secret) // 2] if content is None else content)
    with pytest.raises(KeyMaterialError):
        load_secret_context(path)
    with pytest.raises(KeyMaterialError):
        load_public_context(path)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(KeyMaterialError, match="no such key file"):
        load_secret_context(tmp_path / "nope.context")
    with pytest.raises(KeyMaterialError, match="no such key file"):
        make_codec(tmp_path / "nope.context")


def test_other_parameters_are_refused() -> None:
    context = ts.context(ts.SCHEME_TYPE.CKKS, 4096, coeff_mod_bit_sizes=[40, 20, 40])
    context.global_scale = 2.0**20
    with pytest.raises(KeyMaterialError, match="parameters"):
        load_public_context(public_context_bytes(context))


def test_public_context_cannot_decrypt(codec: CkksCodec, key_files: tuple[Path, Path]) -> None:
    chunk = parse_frame(codec.encode(random_share(2, 3, seed=1))).chunks[0]
    public = load_public_context(key_files[1])
    vector = ts.ckks_vector_from(public, chunk)
    with pytest.raises(ValueError, match="secret"):
        vector.decrypt()


# ---------------------------------------------------------------------------------------------
# Codec and sum


@pytest.mark.parametrize(
    ("rows", "cols"),
    [(1, 1), (0, 16), (16, 128), (ROWS, COLS), (3, SLOTS_PER_CIPHERTEXT + 1), (7, 5)],
)
def test_round_trip(codec: CkksCodec, rows: int, cols: int) -> None:
    share = random_share(rows, cols, seed=rows * 1000 + cols)
    payload = codec.encode(share)
    decoded = codec.decode_sum(payload, rows=rows, cols=cols)
    assert decoded.shape == (rows, cols) and decoded.dtype == np.float32
    # shares travel on the fixed-point grid: the CKKS error rounds away, the result is exact
    np.testing.assert_array_equal(decoded, to_grid(share).astype(np.float32))
    expected_chunks = -(-rows * cols // VALUES_PER_CIPHERTEXT)
    assert len(parse_frame(payload).chunks) == expected_chunks


def test_sum_of_three_clients(codec: CkksCodec, key_files: tuple[Path, Path]) -> None:
    service = make_sum_aggregator("ckks", key_files[1].read_bytes())
    shares = [random_share(ROWS, COLS, seed=seed) for seed in range(3)]
    payloads = [codec.encode(share) for share in shares]
    for payload in payloads:
        service.validate(payload, rows=ROWS, cols=COLS)
    total = service.add(payloads, rows=ROWS, cols=COLS)
    service.validate(total, rows=ROWS, cols=COLS)  # a sum is a valid (unseeded) share too
    decoded = codec.decode_sum(total, rows=ROWS, cols=COLS)
    expected = np.sum([to_grid(share) for share in shares], axis=0)
    np.testing.assert_array_equal(decoded, expected.astype(np.float32))
    np.testing.assert_allclose(decoded, np.sum(shares, axis=0), rtol=0, atol=2 * SHARE_GRID)


def test_sum_at_the_encodable_limit(codec: CkksCodec, aggregator: CkksSumAggregator) -> None:
    """MAX_SHARES constant shares at the per-share bound: the worst case for the modulus. Each
    client encrypts its own share (independent noise, as in the protocol); the raw CKKS error
    stays within SUM_ERROR_BOUND and the decoded sum is exact."""
    bound = share_bound(clients=MAX_SHARES)
    share = np.full((2, SLOTS_PER_CIPHERTEXT // 2), bound, dtype=np.float32)
    share[1] = -bound
    cols = share.shape[1]
    total = aggregator.add([codec.encode(share) for _ in range(MAX_SHARES)], rows=2, cols=cols)
    raw = codec.decrypt_sum(total, rows=2, cols=cols)
    raw_error = np.abs(raw - share.astype(np.float64) * MAX_SHARES).max()
    assert raw_error <= SUM_ERROR_BOUND < SHARE_GRID / 2
    decoded = codec.decode_sum(total, rows=2, cols=cols)
    np.testing.assert_array_equal(decoded, share * MAX_SHARES)


def test_add_keeps_order_and_limits(codec: CkksCodec, aggregator: CkksSumAggregator) -> None:
    shares = [codec.encode(random_share(3, 4, seed=seed)) for seed in (7, 8)]
    forward = codec.decode_sum(aggregator.add(shares, rows=3, cols=4), rows=3, cols=4)
    backward = codec.decode_sum(aggregator.add(shares[::-1], rows=3, cols=4), rows=3, cols=4)
    np.testing.assert_allclose(forward, backward, rtol=0, atol=SUM_ERROR_BOUND)
    with pytest.raises(ValueError, match="nothing"):
        aggregator.add([], rows=3, cols=4)
    with pytest.raises(ValueError, match="shares exceed"):
        aggregator.add([shares[0]] * (MAX_SHARES + 1), rows=3, cols=4)


def test_shares_are_seeded_secret_key_ciphertexts_two_values_per_slot(
    codec: CkksCodec, aggregator: CkksSumAggregator
) -> None:
    """A share's chunk carries VALUES_PER_CIPHERTEXT values in half as many slots, and its second
    polynomial as a seed: about a third of the bytes of TenSEAL's own public-key vectors of the
    same values, though those are compressed and ours are not. The service's sum is an ordinary
    ciphertext; at the encodable limit (pairs of values at the share bound, the largest slot
    magnitude) the error of a MAX_SHARES sum is the fresh noise alone, far below the public-key
    bound, and the sum decodes exactly."""
    bound = share_bound(clients=MAX_SHARES)
    share = np.full((2, VALUES_PER_CIPHERTEXT // 2), bound, dtype=np.float32)
    share[1] = -bound
    cols = share.shape[1]
    shares = [codec.encode(share) for _ in range(MAX_SHARES)]
    (chunk,) = parse_frame(shares[0]).chunks
    loaded = ts.ckks_vector_from(load_public_context(public_context_bytes(codec.context)), chunk)
    assert loaded.size() == VALUES_PER_CIPHERTEXT // 2
    expanded = loaded.serialize()  # the seed drawn out into a full polynomial, compressed
    public_key_vectors = sum(
        len(ts.ckks_vector(codec.context, half.tolist()).serialize())
        for half in np.split(share.reshape(-1), 2)
    )
    assert len(chunk) < 0.7 * len(expanded) and len(chunk) < 0.35 * public_key_vectors

    total = aggregator.add(shares, rows=2, cols=cols)
    (sum_chunk,) = parse_frame(total).chunks
    assert len(sum_chunk) > 1.5 * len(chunk)
    raw = codec.decrypt_sum(total, rows=2, cols=cols)
    raw_error = np.abs(raw - share.astype(np.float64) * MAX_SHARES).max()
    assert raw_error < SUM_ERROR_BOUND / 4  # measured ~2e-6; public-key shares reach ~1.5e-5
    np.testing.assert_array_equal(codec.decode_sum(total, rows=2, cols=cols), share * MAX_SHARES)


def test_chunks_are_tenseal_vectors(codec: CkksCodec) -> None:
    """Our serialization of a CKKS vector is TenSEAL's, byte for byte."""
    vector = ts.ckks_vector(codec.context, [0.25, -1.5, 3.0])
    seal_ciphertext = parse_tenseal_vector(vector.serialize())
    rebuilt = tenseal_vector_bytes(seal_ciphertext, slots=3, scale=codec.context.global_scale)
    assert rebuilt == vector.serialize()


def parse_tenseal_vector(data: bytes) -> bytes:
    """The SEAL ciphertext inside a one-ciphertext TenSEAL vector of fewer than 128 slots."""
    assert data[:3] == b"\x0a\x01" + bytes([data[2]]) and data[3] == 0x12
    length, offset = 0, 4
    for shift in range(0, 64, 7):
        length |= (data[offset] & 0x7F) << shift
        offset += 1
        if data[offset - 1] < 0x80:
            break
    assert data[offset + length] == 0x19 and len(data) == offset + length + 9
    return data[offset : offset + length]


def test_running_sum_ignores_the_order_of_arrival(
    codec: CkksCodec, aggregator: CkksSumAggregator
) -> None:
    """Ciphertext addition is exact modulo q: shares added as they arrive give the same bytes as
    in client order. Each client's share is added once, at most MAX_SHARES of them."""
    payloads = [codec.encode(random_share(ROWS, COLS, seed=seed)) for seed in range(3)]
    shares = [aggregator.read_share(payload, **SHAPE) for payload in payloads]
    arriving = aggregator.new_sum(**SHAPE)
    for client in (2, 0, 1):
        arriving.add(client, aggregator.read_share(payloads[client], **SHAPE))
    assert arriving.clients == frozenset({0, 1, 2})
    assert arriving.payload() == aggregator.add(payloads, **SHAPE)
    with pytest.raises(ValueError, match="already in"):
        arriving.add(1, shares[1])
    full = aggregator.new_sum(**SHAPE)
    for client in range(MAX_SHARES):
        full.add(client, aggregator.read_share(payloads[0], **SHAPE))
    with pytest.raises(ValueError, match="shares exceed"):
        full.add(MAX_SHARES, shares[0])


def test_plain_running_sum_adds_in_client_order() -> None:
    """float32 addition is not associative: the plaintext sum is formed in client order whatever
    the order of arrival, as the in-process trainer forms it."""
    aggregator = PlainSumAggregator()
    values = [1.0, 1e8, -1e8]  # (1 + 1e8) - 1e8 = 0 in float32, (-1e8 + 1e8) + 1 = 1
    payloads = [np.full((1, 1), value, dtype="<f4").tobytes() for value in values]
    arriving = aggregator.new_sum(rows=1, cols=1)
    for client in (2, 1, 0):
        arriving.add(client, aggregator.read_share(payloads[client], rows=1, cols=1))
    assert arriving.payload() == aggregator.add(payloads, rows=1, cols=1)
    assert np.frombuffer(arriving.payload(), dtype="<f4").tolist() == [0.0]


@pytest.mark.parametrize(
    "share",
    [
        np.array([[np.nan, 0.0]]),
        np.array([[np.inf]]),
        np.array([[MAX_ABS_SUM * 1.01]]),
        np.zeros(4),
    ],
    ids=["nan", "inf", "too-large", "1-d"],
)
def test_encode_refuses_what_ckks_cannot_carry(codec: CkksCodec, share: np.ndarray) -> None:
    with pytest.raises(ValueError):
        codec.encode(share)


def test_payload_size(codec: CkksCodec) -> None:
    payload = codec.encode(random_share(32, 128, seed=3))
    assert len(payload) / (32 * 128) < 6.4  # ~6.27 bytes per value, docs/encryption.md


def test_chunking_follows_the_ring_degree() -> None:
    assert VALUES_PER_CIPHERTEXT == 2 * SLOTS_PER_CIPHERTEXT == POLY_MODULUS_DEGREE
    assert VALUES_PER_CIPHERTEXT < ROWS * COLS < 2 * VALUES_PER_CIPHERTEXT
    assert chunk_lengths(rows=ROWS, cols=COLS) == [
        VALUES_PER_CIPHERTEXT,
        ROWS * COLS - VALUES_PER_CIPHERTEXT,
    ]
    # two chunks of at most MAX_CHUNK_BYTES each, plus the frame header and length fields
    assert max_payload_bytes(rows=ROWS, cols=COLS) == HEADER_BYTES + 2 * (4 + MAX_CHUNK_BYTES)
    assert MAX_CHUNK_BYTES == 2 * 2 * POLY_MODULUS_DEGREE * 8


def test_parameters_within_the_he_standard(codec: CkksCodec) -> None:
    """The key-level modulus (all primes) is within the HomomorphicEncryption.org 128-bit limit
    for N, with a margin, classically and against quantum attacks; SEAL agrees on the sizes."""
    total_bits = sum(COEFF_MOD_BIT_SIZES)
    assert total_bits <= HE_STANDARD_128_CLASSICAL[POLY_MODULUS_DEGREE] - 32
    assert total_bits <= HE_STANDARD_128_QUANTUM[POLY_MODULUS_DEGREE] - 32
    seal = codec.context.seal_context().data
    assert seal.key_context_data().total_coeff_modulus_bit_count() == total_bits
    assert seal.first_context_data().total_coeff_modulus_bit_count() == COEFF_MOD_BIT_SIZES[0]
    assert seal.first_context_data().parms().poly_modulus_degree() == POLY_MODULUS_DEGREE
    # the previous parameters sat exactly at the classical limit, above the post-quantum one
    assert HE_STANDARD_128_CLASSICAL[2048] == 40 + 14 > HE_STANDARD_128_QUANTUM[2048]


def test_decoding_error_bound_fits_the_share_grid(codec: CkksCodec) -> None:
    """The 2^-40 tail bound of a MAX_SHARES sum is below half a grid step, and the range
    leaves room for the largest sum below q / 2."""
    tail = decoding_error_scale(shares=MAX_SHARES) * SUM_ERROR_FAILURE_BITS * np.log(2)
    assert tail == pytest.approx(SUM_ERROR_BOUND)
    assert SUM_ERROR_BOUND < SHARE_GRID / 2
    # A coefficient is at most the largest slot magnitude times the scale; a slot holds two sums
    # of at most MAX_ABS_SUM each, so sqrt(2) * MAX_ABS_SUM * 2^30 = 2^39.5, about a factor
    # sqrt(2) below q / 2 (q is the largest suitable prime below 2^41)
    seal = codec.context.seal_context().data
    q = seal.first_context_data().parms().coeff_modulus()[0].value()
    largest_coefficient = np.sqrt(2) * MAX_ABS_SUM * 2.0**GLOBAL_SCALE_BITS
    assert largest_coefficient * 1.414 <= q / 2 < 2.0 ** (COEFF_MOD_BIT_SIZES[0] - 1)


def test_a_single_share_at_the_range_limit(codec: CkksCodec) -> None:
    share = np.array([[MAX_ABS_SUM, -MAX_ABS_SUM, 0.5]], dtype=np.float32)
    assert share_bound(clients=1) == MAX_ABS_SUM
    np.testing.assert_array_equal(codec.decode_sum(codec.encode(share), rows=1, cols=3), share)


def test_key_id_is_a_prefix_of_the_public_context_sha256(
    key_files: tuple[Path, Path], codec: CkksCodec, aggregator: CkksSumAggregator
) -> None:
    """docs/encryption.md: key id = SHA-256(bytes of public.context)[:8], at payload bytes 5..12."""
    expected = hashlib.sha256(key_files[1].read_bytes()).digest()[:KEY_ID_BYTES]
    assert codec.key_id == aggregator.key_id == expected
    payload = codec.encode(random_share(2, 2, seed=9))
    assert payload[len(MAGIC) + 1 : len(MAGIC) + 1 + KEY_ID_BYTES] == expected


# ---------------------------------------------------------------------------------------------
# Malformed payloads


def _replace_chunk(payload: bytes, index: int, chunk: bytes) -> bytes:
    frame = parse_frame(payload)
    chunks = list(frame.chunks)
    chunks[index] = chunk
    return frame_chunks(chunks, key_id=frame.key_id)


def _wrong_scale_chunk(codec: CkksCodec) -> bytes:
    context = codec.context.copy()
    context.global_scale = 2.0**20
    return ts.ckks_vector(context, [0.5] * SLOTS_PER_CIPHERTEXT).serialize()


def _other_parameters_chunk(codec: CkksCodec) -> bytes:
    """Same N and slot count, another coefficient modulus: SEAL must refuse to load it."""
    context = ts.context(ts.SCHEME_TYPE.CKKS, POLY_MODULUS_DEGREE, coeff_mod_bit_sizes=[30, 30])
    context.global_scale = 2.0**20
    return ts.ckks_vector(context, [0.5] * SLOTS_PER_CIPHERTEXT).serialize()


def _random_bytes_chunk(codec: CkksCodec) -> bytes:
    size = len(parse_frame(codec.encode(np.zeros((1, 1)))).chunks[0])
    return np.random.default_rng(5).bytes(size)


def _oversized_vector_chunk(codec: CkksCodec) -> bytes:
    """A TenSEAL vector spanning two ciphertexts (TenSEAL splits it silently)."""
    return ts.ckks_vector(codec.context, [0.1] * (2 * SLOTS_PER_CIPHERTEXT)).serialize()


Mutation = Callable[[bytes, CkksCodec, CkksCodec], bytes]

MALFORMED: dict[str, Mutation] = {
    "empty": lambda good, codec, other: b"",
    "garbage": lambda good, codec, other: b"\x00garbage" * 40,
    "bad-magic": lambda good, codec, other: b"XXXX" + good[4:],
    "bad-version": lambda good, codec, other: MAGIC + bytes([FORMAT_VERSION + 1]) + good[5:],
    "truncated-header": lambda good, codec, other: good[:10],
    "truncated-chunk": lambda good, codec, other: good[:-1],
    "truncated-length": lambda good, codec, other: good[: len(parse_frame(good).chunks[0]) + 23],
    "trailing-bytes": lambda good, codec, other: good + b"\x00",
    "too-few-chunks": lambda good, codec, other: frame_chunks(
        parse_frame(good).chunks[:1], key_id=codec.key_id
    ),
    "too-many-chunks": lambda good, codec, other: frame_chunks(
        parse_frame(good).chunks * 2, key_id=codec.key_id
    ),
    "count-lies": lambda good, codec, other: good[:13] + struct.pack(">I", 3) + good[17:],
    "huge-length": lambda good, codec, other: good[:17] + struct.pack(">I", 2**31) + good[21:],
    "other-key-pair": lambda good, codec, other: other.encode(random_share(ROWS, COLS, seed=1)),
    "other-parameters": lambda good, codec, other: _replace_chunk(
        good, 0, _other_parameters_chunk(codec)
    ),
    "wrong-scale": lambda good, codec, other: _replace_chunk(good, 0, _wrong_scale_chunk(codec)),
    "random-chunk": lambda good, codec, other: _replace_chunk(good, 1, _random_bytes_chunk(codec)),
    "empty-chunk": lambda good, codec, other: _replace_chunk(good, 1, b""),
    "swapped-chunks": lambda good, codec, other: frame_chunks(
        parse_frame(good).chunks[::-1], key_id=codec.key_id
    ),
    "oversized-vector-chunk": lambda good, codec, other: _replace_chunk(
        good, 0, _oversized_vector_chunk(codec)
    ),
    "wrong-shape": lambda good, codec, other: codec.encode(random_share(ROWS + 2, COLS, seed=2)),
}


@pytest.fixture(scope="module")
def good_payload(codec: CkksCodec) -> bytes:
    return codec.encode(random_share(ROWS, COLS, seed=0))


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_payloads_raise_payload_error(
    name: str,
    good_payload: bytes,
    codec: CkksCodec,
    other_codec: CkksCodec,
    aggregator: CkksSumAggregator,
) -> None:
    bad = MALFORMED[name](good_payload, codec, other_codec)
    with pytest.raises(PayloadError) as caught:
        aggregator.validate(bad, rows=ROWS, cols=COLS)
    assert type(caught.value) is PayloadError and str(caught.value)
    with pytest.raises(PayloadError):
        aggregator.add([good_payload, bad], rows=ROWS, cols=COLS)
    with pytest.raises(PayloadError):
        codec.decode_sum(bad, rows=ROWS, cols=COLS)


def test_decode_refuses_a_sum_from_another_key_pair(
    codec: CkksCodec, other_codec: CkksCodec
) -> None:
    payload = other_codec.encode(random_share(2, 2, seed=4))
    with pytest.raises(PayloadError, match="key id"):
        codec.decode_sum(payload, rows=2, cols=2)


# ---------------------------------------------------------------------------------------------
# Fuzzing: every mutated payload is refused with PayloadError, or it is a usable share


SHAPE = {"rows": ROWS, "cols": COLS}
HEADER_BYTES = len(MAGIC) + 1 + KEY_ID_BYTES + 4  # magic | version | key id | chunk count
# SEAL's serialization header inside each chunk: magic 0xA15E (little-endian), header size 16,
# version major/minor, compression mode, 2 reserved bytes (ignored by SEAL), uint64 size. The
# ciphertext's members that follow are checked too, but lie inside the zstd stream.
SEAL_HEADER_START = b"\x5e\xa1\x10"
SEAL_CHECKED_BYTES = (0, 1, 2, 3, 4, 5, *range(8, 16))
SCALE_FIELD_BYTES = 9  # TenSEAL's scale field ends each chunk: tag and double


@dataclass(frozen=True)
class FuzzCase:
    name: str
    payload: bytes
    structural: bool  # breaks the frame or a ciphertext's header: validation must refuse it
    touched_chunks: frozenset[int]  # chunks whose bytes changed; the others must sum exactly


@dataclass
class FuzzTally:
    rejected: list[str] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FrameLayout:
    """Where the parts of a well-formed payload lie."""

    lengths: tuple[range, ...]  # each chunk's uint32 length field
    chunks: tuple[range, ...]  # each chunk's bytes
    checked_bytes: tuple[tuple[int, ...], ...]  # each chunk's bytes checked before SEAL parses it

    @classmethod
    def of(cls, payload: bytes) -> FrameLayout:
        lengths, chunks, checked_bytes = [], [], []
        offset = HEADER_BYTES
        for chunk in parse_frame(payload).chunks:
            lengths.append(range(offset, offset + 4))
            chunks.append(range(offset + 4, offset + 4 + len(chunk)))
            seal = chunk.find(SEAL_HEADER_START)
            assert 0 <= seal < 16, "no SEAL header near the start of the chunk"
            # TenSEAL's fields before SEAL's header, that header, the scale field
            checked = [*range(seal), *(seal + i for i in SEAL_CHECKED_BYTES)]
            checked += range(len(chunk) - SCALE_FIELD_BYTES, len(chunk))
            checked_bytes.append(tuple(offset + 4 + i for i in checked))
            offset += 4 + len(chunk)
        assert offset == len(payload)
        return cls(tuple(lengths), tuple(chunks), tuple(checked_bytes))

    def structural(self, position: int) -> bool:
        return (
            position < HEADER_BYTES
            or any(position in lengths for lengths in self.lengths)
            or any(position in checked for checked in self.checked_bytes)
        )

    def chunk_of(self, position: int) -> int | None:
        return next((i for i, chunk in enumerate(self.chunks) if position in chunk), None)


def flip(good: bytes, layout: FrameLayout, flips: dict[int, int], name: str) -> FuzzCase:
    corrupted = bytearray(good)
    for position, mask in flips.items():
        corrupted[position] ^= mask
    touched = {layout.chunk_of(position) for position in flips}
    return FuzzCase(
        name=name,
        payload=bytes(corrupted),
        structural=any(layout.structural(position) for position in flips),
        touched_chunks=frozenset(index for index in touched if index is not None),
    )


def structural_mutations(good: bytes) -> list[FuzzCase]:
    """Every byte of the frame header, of the chunk lengths and of each chunk's checked bytes
    flipped three ways; truncations (at every boundary and at random cuts); trailing bytes."""
    layout = FrameLayout.of(good)
    positions = [
        *range(HEADER_BYTES),
        *(p for lengths in layout.lengths for p in lengths),
        *(p for checked in layout.checked_bytes for p in checked),
    ]
    cases = [
        flip(good, layout, {position: mask}, f"flip {position} ^ {mask:#x}")
        for position in positions
        for mask in (0x01, 0x80, 0xFF)
    ]
    cuts = {0, 4, 5, HEADER_BYTES - 1, HEADER_BYTES, len(good) - 1}
    for lengths, chunk in zip(layout.lengths, layout.chunks, strict=True):
        cuts |= {lengths.start, lengths.start + 2, chunk.start, chunk.start + 16, chunk.stop - 1}
    cuts |= {int(c) for c in np.random.default_rng(12).integers(1, len(good), size=20)}
    cases += [
        FuzzCase(f"truncated to {cut}", good[:cut], True, frozenset()) for cut in sorted(cuts)
    ]
    cases += [
        FuzzCase(f"{len(extra)} trailing bytes", good + extra, True, frozenset())
        for extra in (b"\x00", b"\x00\x00\x00\x00", good[HEADER_BYTES:])
    ]
    return cases


def random_flips(good: bytes, *, count: int, seed: int) -> list[FuzzCase]:
    """Three random bytes flipped per payload; structural when one of them is."""
    layout = FrameLayout.of(good)
    rng = np.random.default_rng(seed)
    cases = []
    for index in range(count):
        flips = {int(p): int(rng.integers(1, 256)) for p in rng.integers(0, len(good), size=3)}
        cases.append(flip(good, layout, flips, f"random {index}: {flips}"))
    return cases


def check_mutations(
    cases: list[FuzzCase],
    good: bytes,
    *,
    codec: CkksCodec,
    aggregator: CkksSumAggregator,
) -> FuzzTally:
    """Validate each case: a refusal must be a PayloadError (anything else propagates), an
    acceptance must be a structurally intact share that adds to ``good`` and decodes to a finite
    sum, exact in every chunk the mutation did not touch."""
    reference = codec.decode_sum(aggregator.add([good, good], rows=ROWS, cols=COLS), **SHAPE)
    chunk_of_value = np.arange(ROWS * COLS) // VALUES_PER_CIPHERTEXT
    tally = FuzzTally()
    for case in cases:
        try:
            aggregator.validate(case.payload, **SHAPE)
        except PayloadError as error:
            assert str(error), f"{case.name}: PayloadError without a message"
            tally.rejected.append(case.name)
            continue
        assert not case.structural, f"{case.name}: a structurally broken payload was accepted"
        tally.accepted.append(case.name)
        try:
            total = aggregator.add([good, case.payload], **SHAPE)
            decoded = codec.decode_sum(total, **SHAPE)
        except PayloadError as error:
            raise AssertionError(
                f"{case.name}: accepted by validate, refused when summed: {error}"
            ) from None
        assert decoded.shape == (ROWS, COLS) and np.isfinite(decoded).all(), case.name
        untouched = ~np.isin(chunk_of_value, list(case.touched_chunks))
        np.testing.assert_array_equal(
            decoded.reshape(-1)[untouched], reference.reshape(-1)[untouched], err_msg=case.name
        )
    assert len(tally.rejected) + len(tally.accepted) == len(cases)
    return tally


def test_structural_mutations_are_all_rejected(
    good_payload: bytes, codec: CkksCodec, aggregator: CkksSumAggregator
) -> None:
    cases = structural_mutations(good_payload)
    tally = check_mutations(cases, good_payload, codec=codec, aggregator=aggregator)
    assert len(tally.rejected) == len(cases) > 150 and not tally.accepted


def test_flipped_bytes_are_rejected_or_still_sum(
    good_payload: bytes, codec: CkksCodec, aggregator: CkksSumAggregator
) -> None:
    """CKKS ciphertexts carry no MAC: a flip inside the compressed polynomials can yield a
    well-formed ciphertext of other values. Such a share is accepted and only spoils its own
    chunk of the sum; everything that breaks the structure is refused."""
    # ~4 % of triple flips leave a 2-chunk N = 4096 payload well formed; the payload's bytes
    # change with every encryption, so 300 cases make "none accepted" a ~1e-5 event
    cases = random_flips(good_payload, count=300, seed=11)
    tally = check_mutations(cases, good_payload, codec=codec, aggregator=aggregator)
    # both outcomes occur, so each branch of check_mutations is exercised
    assert tally.rejected and tally.accepted
    structural = [case.name for case in cases if case.structural]
    assert set(structural) <= set(tally.rejected)


@pytest.mark.parametrize("validator", ["no-op", "frame-only"])
def test_the_fuzz_detects_a_lax_validator(
    validator: str,
    monkeypatch: pytest.MonkeyPatch,
    good_payload: bytes,
    codec: CkksCodec,
    aggregator: CkksSumAggregator,
) -> None:
    """The checks above fail when validation does nothing, or checks the frame only."""

    def lax_validate(self: CkksSumAggregator, payload: bytes, *, rows: int, cols: int) -> None:
        if validator == "frame-only":
            parse_frame(payload)

    monkeypatch.setattr(CkksSumAggregator, "validate", lax_validate)
    if validator == "no-op":
        with pytest.raises(AssertionError, match="structurally broken payload was accepted"):
            check_mutations(
                structural_mutations(good_payload), good_payload, codec=codec, aggregator=aggregator
            )
    with pytest.raises(AssertionError, match="accepted by validate, refused when summed"):
        check_mutations(
            random_flips(good_payload, count=60, seed=11),
            good_payload,
            codec=codec,
            aggregator=aggregator,
        )


# ---------------------------------------------------------------------------------------------
# Factories


def test_factories(key_files: tuple[Path, Path]) -> None:
    secret_path, public_path = key_files
    assert isinstance(make_codec(None), PlainCodec)
    assert isinstance(make_sum_aggregator("float32", None), PlainSumAggregator)
    assert make_codec(secret_path) is make_codec(str(secret_path))
    public = public_path.read_bytes()
    assert make_sum_aggregator("ckks", public) is make_sum_aggregator("ckks", bytes(public))
    assert make_sum_aggregator("ckks", public).encoding == "ckks"
    with pytest.raises(KeyMaterialError):
        make_sum_aggregator("ckks", None)
    with pytest.raises(ValueError, match="unknown encoding"):
        make_sum_aggregator("rot13", None)
