"""CKKS benchmark: parameter sweep (bytes per float, decoding error, security margin), the
previous against the current parameters, and the CPU cost of our codec/aggregator against bare
TenSEAL calls on the matrices a Cora round sends: our encryption (two values per slot, secret
key, seeded: secure/ckks_packing.py) against bare public-key TenSEAL vectors and against the bare
SEAL calls it makes, the service's path (validate each share once, add it into the running sum,
serialize the sum) against bare deserialize + add + serialize of the same ciphertexts and of
TenSEAL's own vectors of the same matrices, decryption.

    python -m bench.he [--pairs 15] [--out bench/results/he.json] [--skip-sweep]

Timings are CPU time (``time.process_time``) of this process, with ``n_threads=1`` contexts, so
other processes on a busy machine do not count. The two sides of a comparison run interleaved:
each pair times one sample of each side back to back, the side that goes first alternating from
pair to pair, so both see the same machine state. Ratios are computed per pair and reported as
the median with the interquartile range and the min-max. Prints tables and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tenseal as ts

from secure.aggregation import PlainCodec, PlainSumAggregator, to_grid
from secure.ckks import CkksCodec, CkksSumAggregator
from secure.ckks_context import (
    COEFF_MOD_BIT_SIZES,
    GLOBAL_SCALE_BITS,
    HE_STANDARD_128_CLASSICAL,
    HE_STANDARD_128_QUANTUM,
    KEY_ID_BYTES,
    POLY_MODULUS_DEGREE,
    new_context,
    public_context_bytes,
    secret_context_bytes,
    sum_error_bound,
)
from secure.ckks_frame import frame_chunks, parse_frame
from secure.ckks_packing import SecretKeyCipher

FLOAT32_BYTES = 4
CORA_SHAPES = ((182, 128), (265, 128), (16, 128), (2708, 16))
COMPARE_SHAPES = ((2708, 16), (200, 128))
SWEEP_SHARES = 16
SWEEP_SLOTS_PER_SHARE = 32_768
MIN_SAMPLE_CPU_SECONDS = 0.02  # calls per sample are repeated until a sample takes this long
DEFAULT_OUT = Path(__file__).parent / "results" / "he.json"


@dataclass(frozen=True)
class Candidate:
    label: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int


PREVIOUS = Candidate("N=2048, 40-bit data prime (previous)", 2048, (40, 14), 29)
CHOSEN = Candidate(
    "N=4096, 41-bit data prime (chosen)",
    POLY_MODULUS_DEGREE,
    COEFF_MOD_BIT_SIZES,
    GLOBAL_SCALE_BITS,
)

CANDIDATES = (
    Candidate("N=1024, two primes (infeasible)", 1024, (14, 13), 10),
    Candidate("N=2048, 32-bit data prime", 2048, (32, 22), 26),
    Candidate("N=2048, 32-bit data prime", 2048, (32, 22), 27),
    Candidate("N=2048, 34-bit data prime", 2048, (34, 20), 28),
    PREVIOUS,
    Candidate("N=4096, 40-bit data prime", 4096, (40, 40), 29),
    Candidate("N=4096, 40-bit data prime", 4096, (40, 24), 29),
    Candidate("N=4096, 40-bit data prime, range 512", 4096, (40, 24), 30),
    CHOSEN,
    Candidate("N=4096, three primes", 4096, (40, 20, 40), 20),
    Candidate("N=8192, TenSEAL tutorial", 8192, (60, 40, 40, 60), 40),
)


# ---------------------------------------------------------------------------------------------
# Security and the analytic decoding error


def security(poly_modulus_degree: int, bits: Sequence[int]) -> dict[str, object]:
    """Total (key-level) modulus bits against the HE standard's 128-bit limits for N."""
    total = sum(bits)
    classical = HE_STANDARD_128_CLASSICAL.get(poly_modulus_degree)
    quantum = HE_STANDARD_128_QUANTUM.get(poly_modulus_degree)
    return {
        "total_bits": total,
        "he_standard_128_classical_limit": classical,
        "margin_bits_classical": None if classical is None else classical - total,
        "he_standard_128_quantum_limit": quantum,
        "margin_bits_quantum": None if quantum is None else quantum - total,
    }


# ---------------------------------------------------------------------------------------------
# Parameter sweep


def sweep_candidate(candidate: Candidate) -> dict[str, object]:
    """Bytes per float and max abs error of a sum of SWEEP_SHARES shares with |x| <= 1."""
    row: dict[str, object] = asdict(candidate)
    row.update(security(candidate.poly_modulus_degree, candidate.coeff_mod_bit_sizes))
    try:
        context = _raw_context(candidate.poly_modulus_degree, candidate.coeff_mod_bit_sizes)
    except Exception as error:  # SEAL refuses insecure or impossible parameters
        row["error"] = str(error)
        return row
    context.global_scale = 2.0**candidate.scale_bits
    slots = candidate.poly_modulus_degree // 2
    shares = _sweep_shares(seed=candidate.poly_modulus_degree + candidate.scale_bits)
    total_bytes, worst_error = 0, 0.0
    for start in range(0, SWEEP_SLOTS_PER_SHARE, slots):
        block = shares[:, start : start + slots]
        accumulator = None
        for share in block:
            data = ts.ckks_vector(context, share.tolist()).serialize()
            total_bytes += len(data)
            vector = ts.ckks_vector_from(context, data)
            accumulator = vector if accumulator is None else accumulator + vector
        decoded = np.asarray(accumulator.decrypt())
        worst_error = max(worst_error, float(np.abs(decoded - block.sum(axis=0)).max()))
    data_bits = sum(candidate.coeff_mod_bit_sizes[:-1])
    row.update(
        worst_case_error_sum16=_constant_sum_error(context, slots=slots),
        bytes_per_float=total_bytes / shares.size,
        vs_float32=total_bytes / shares.size / FLOAT32_BYTES,
        max_abs_error_sum16=worst_error,
        predicted_error_bound_sum16=sum_error_bound(
            shares=SWEEP_SHARES,
            poly_modulus_degree=candidate.poly_modulus_degree,
            scale=2.0**candidate.scale_bits,
        ),
        headroom_abs_sum=2.0 ** (data_bits - 1 - candidate.scale_bits),
        public_context_bytes=len(public_context_bytes(context)),
        public_context_bytes_with_relin=len(context.serialize(save_galois_keys=False)),
    )
    return row


def _constant_sum_error(context: ts.Context, *, slots: int) -> float:
    """One constant +1 ciphertext added SWEEP_SHARES times: the largest coefficient a sum can
    reach, with fully correlated noise (16x one share's noise instead of ~4x)."""
    share = ts.ckks_vector(context, [1.0] * slots)
    total = share
    for _ in range(SWEEP_SHARES - 1):
        total = total + share
    return float(np.abs(np.asarray(total.decrypt()) - SWEEP_SHARES).max())


def _sweep_shares(*, seed: int) -> np.ndarray:
    """Uniform [-1, 1] values (float32-representable) with some coordinates at +-1 in all shares."""
    rng = np.random.default_rng(seed)
    shares = rng.uniform(-1.0, 1.0, size=(SWEEP_SHARES, SWEEP_SLOTS_PER_SHARE))
    shares[:, ::97] = 1.0
    shares[:, 1::97] = -1.0
    return shares.astype(np.float32).astype(np.float64)


def mean_on_service() -> dict[str, object]:
    """The alternative we did not take: the service multiplies the sum by 1/M and rescales.

    That needs a second data prime (for the rescale): uploads carry both data primes.
    """
    bits = (41, 30, 24)
    context = _raw_context(POLY_MODULUS_DEGREE, bits)
    context.global_scale = 2.0**GLOBAL_SCALE_BITS
    slots = POLY_MODULUS_DEGREE // 2
    shares = _sweep_shares(seed=7)[:3, :slots]
    uploads = [ts.ckks_vector(context, share.tolist()).serialize() for share in shares]
    vectors = [ts.ckks_vector_from(context, data) for data in uploads]
    total = vectors[0] + vectors[1] + vectors[2]
    started = time.process_time()
    mean = total * (1.0 / len(vectors))
    multiply_seconds = time.process_time() - started
    download = mean.serialize()
    error = float(np.abs(np.asarray(mean.decrypt()) - shares.mean(axis=0)).max())
    return {
        "parameters": (
            f"N={POLY_MODULUS_DEGREE}, coeff_mod_bit_sizes={bits}, scale 2^{GLOBAL_SCALE_BITS}"
        ),
        **security(POLY_MODULUS_DEGREE, bits),
        "upload_bytes_per_float": len(uploads[0]) / slots,
        "download_bytes_per_float": len(download) / slots,
        "max_abs_error_mean3": error,
        "multiply_rescale_cpu_seconds_per_chunk": multiply_seconds,
    }


def _raw_context(poly_modulus_degree: int, bits: Sequence[int]) -> ts.Context:
    return ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=poly_modulus_degree,
        coeff_mod_bit_sizes=list(bits),
        n_threads=1,
    )


# ---------------------------------------------------------------------------------------------
# Interleaved CPU timing


def _cpu_seconds(action: Callable[[], object], calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        action()
    return (time.process_time() - started) / calls


def calls_per_sample(*actions: Callable[[], object]) -> int:
    """Calls per sample so that the fastest action's sample takes MIN_SAMPLE_CPU_SECONDS."""
    for action in actions:
        action()  # warm-up: caches, lazily built tables
    fastest = min(max(_cpu_seconds(action, 1), 1e-7) for action in actions)
    return max(1, math.ceil(MIN_SAMPLE_CPU_SECONDS / fastest))


def spread(values: Sequence[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def interleaved(
    first: Callable[[], object], second: Callable[[], object], *, pairs: int
) -> dict[str, object]:
    """CPU seconds per call of both sides over ``pairs`` alternating pairs, and the per-pair
    ratio ``first / second``."""
    calls = calls_per_sample(first, second)
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(pairs):
        order = (0, 1) if index % 2 == 0 else (1, 0)
        sample = {side: _cpu_seconds((first, second)[side], calls) for side in order}
        times[0].append(sample[0])
        times[1].append(sample[1])
    ratios = [a / b for a, b in zip(*times, strict=True)]
    return {
        "calls_per_sample": calls,
        "first_cpu_seconds": statistics.median(times[0]),
        "second_cpu_seconds": statistics.median(times[1]),
        "ratio": spread(ratios),
    }


def median_cpu_seconds(action: Callable[[], object], *, samples: int) -> float:
    calls = calls_per_sample(action)
    return statistics.median(_cpu_seconds(action, calls) for _ in range(samples))


# ---------------------------------------------------------------------------------------------
# Raw TenSEAL: the same work as our path, without framing or validation


def raw_encrypt(context: ts.Context, matrix: np.ndarray) -> list[bytes]:
    values = np.ascontiguousarray(matrix, dtype=np.float64).reshape(-1)
    slots = context.seal_context().data.first_context_data().parms().poly_modulus_degree() // 2
    return [
        ts.ckks_vector(context, values[start : start + slots].tolist()).serialize()
        for start in range(0, values.size, slots)
    ]


def raw_add(context: ts.Context, shares: Sequence[list[bytes]]) -> list[bytes]:
    total = [ts.ckks_vector_from(context, data) for data in shares[0]]
    for share in shares[1:]:
        for accumulator, data in zip(total, share, strict=True):
            accumulator += ts.ckks_vector_from(context, data)
    return [vector.serialize() for vector in total]


def raw_add_binding(context: ts.Context, shares: Sequence[list[bytes]]) -> list[bytes]:
    """``raw_add`` through TenSEAL's C++ binding, without its Python wrapper (what ours calls)."""
    native = ts._ts_cpp.CKKSVector
    total = [native(context.data, data) for data in shares[0]]
    for share in shares[1:]:
        for accumulator, data in zip(total, share, strict=True):
            accumulator.add_(native(context.data, data))
    return [vector.serialize() for vector in total]


def raw_decrypt(context: ts.Context, chunks: Sequence[bytes], shape: tuple[int, int]) -> np.ndarray:
    values = np.concatenate([np.asarray(ts.ckks_vector_from(context, c).decrypt()) for c in chunks])
    return values.astype(np.float32).reshape(shape)


def framed_bytes(chunks: Sequence[bytes]) -> int:
    return len(frame_chunks(chunks, key_id=bytes(KEY_ID_BYTES)))


def _shares(rows: int, cols: int, *, count: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(rows * cols)
    return [rng.uniform(-1, 1, size=(rows, cols)).astype(np.float32) for _ in range(count)]


def _max_error(decoded: np.ndarray, shares: Sequence[np.ndarray]) -> float:
    expected = np.sum([share.astype(np.float64) for share in shares], axis=0)
    return float(np.abs(decoded.astype(np.float64) - expected).max())


# ---------------------------------------------------------------------------------------------
# Previous against current parameters (bare TenSEAL on both sides, framed sizes)


@dataclass(frozen=True)
class RawSide:
    secret: ts.Context
    public: ts.Context

    @classmethod
    def of(cls, candidate: Candidate) -> RawSide:
        secret = _raw_context(candidate.poly_modulus_degree, candidate.coeff_mod_bit_sizes)
        secret.global_scale = 2.0**candidate.scale_bits
        return cls(secret, ts.context_from(public_context_bytes(secret), n_threads=1))


def compare_parameters(rows: int, cols: int, *, pairs: int) -> dict[str, object]:
    """Bytes per float and CPU time of encrypt / add 3 / decrypt, previous vs chosen."""
    shares = _shares(rows, cols)
    floats = rows * cols
    sides = {"previous": RawSide.of(PREVIOUS), "chosen": RawSide.of(CHOSEN)}
    uploads = {name: [raw_encrypt(s.secret, x) for x in shares] for name, s in sides.items()}
    sums = {name: raw_add(sides[name].public, uploads[name]) for name in sides}
    result: dict[str, object] = {"rows": rows, "cols": cols}
    for name, side in sides.items():
        result[name] = {
            "chunks": len(uploads[name][0]),
            "bytes_per_float": framed_bytes(uploads[name][0]) / floats,
            "max_abs_error_sum3": _max_error(
                raw_decrypt(side.secret, sums[name], (rows, cols)), shares
            ),
        }

    def stage(name: str) -> dict[str, Callable[[], object]]:
        side = sides[name]
        return {
            "encrypt": lambda: raw_encrypt(side.secret, shares[0]),
            "add3": lambda: raw_add(side.public, uploads[name]),
            "decrypt": lambda: raw_decrypt(side.secret, sums[name], (rows, cols)),
        }

    chosen, previous = stage("chosen"), stage("previous")
    for name in ("encrypt", "add3", "decrypt"):
        timing = interleaved(chosen[name], previous[name], pairs=pairs)
        result[name] = {
            "chosen_cpu_ms": 1e3 * timing["first_cpu_seconds"],
            "previous_cpu_ms": 1e3 * timing["second_cpu_seconds"],
            "calls_per_sample": timing["calls_per_sample"],
            "chosen_over_previous_cpu": timing["ratio"],
        }
    return result


# ---------------------------------------------------------------------------------------------
# Our path vs bare TenSEAL


@dataclass(frozen=True)
class Setup:
    codec: CkksCodec
    cipher: SecretKeyCipher  # the SEAL calls of the codec, without grid, checks or framing
    aggregator: CkksSumAggregator
    secret: ts.Context
    public: ts.Context


def make_setup() -> Setup:
    secret = new_context()
    aggregator = CkksSumAggregator.from_bytes(public_context_bytes(secret))
    public = ts.context_from(public_context_bytes(secret), n_threads=1)
    return Setup(CkksCodec(secret), SecretKeyCipher(secret), aggregator, secret, public)


STAGES = (
    "encrypt",
    "encrypt_bare",
    "aggregate3",
    "aggregate3_binding",
    "aggregate3_vectors",
    "decrypt",
)
STAGE_NOTES = {
    "encrypt": "ours vs bare public-key TenSEAL vectors of the same matrix",
    "encrypt_bare": "ours vs the bare SEAL calls ours makes (our layer's cost)",
    "aggregate3": "the service: validate 3 shares once, running sum, serialize vs bare"
    " deserialize + add + serialize of the same ciphertexts",
    "aggregate3_binding": "the same vs the bare sum through TenSEAL's C++ binding (the calls"
    " ours makes, without the Python wrapper of the bare side above)",
    "aggregate3_vectors": "the service vs the bare sum of TenSEAL's own public-key vectors of"
    " the same matrices (one value per slot, unseeded)",
    "decrypt": "ours vs bare deserialize + decrypt of TenSEAL's own vectors",
}


def bench_shape(setup: Setup, rows: int, cols: int, *, pairs: int) -> dict[str, object]:
    shares = _shares(rows, cols)
    floats = rows * cols
    ours_up = [setup.codec.encode(share) for share in shares]
    ours_chunks = [list(parse_frame(payload).chunks) for payload in ours_up]
    raw_up = [raw_encrypt(setup.secret, share) for share in shares]
    ours_sum = setup.aggregator.add(ours_up, rows=rows, cols=cols)
    raw_sum = raw_add(setup.public, raw_up)
    plain, plain_sum = PlainCodec(), PlainSumAggregator()
    plain_up = [plain.encode(share) for share in shares]
    grid_values = to_grid(np.ascontiguousarray(shares[0], dtype=np.float64).reshape(-1))

    def service_path(aggregator: CkksSumAggregator | PlainSumAggregator, up: list[bytes]) -> bytes:
        """What the service does with 3 shares: validate and parse each once as it is uploaded,
        add it into the running sum, serialize the sum when the last is in."""
        total = aggregator.new_sum(rows=rows, cols=cols)
        for client, payload in enumerate(up):
            total.add(client, aggregator.read_share(payload, rows=rows, cols=cols))
        return total.payload()

    stages = {
        "encrypt": (
            lambda: setup.codec.encode(shares[0]),
            lambda: raw_encrypt(setup.secret, shares[0]),
            lambda: plain.encode(shares[0]),
        ),
        "encrypt_bare": (
            lambda: setup.codec.encode(shares[0]),
            lambda: setup.cipher.encrypt(grid_values),
            lambda: plain.encode(shares[0]),
        ),
        "aggregate3": (
            lambda: service_path(setup.aggregator, ours_up),
            lambda: raw_add(setup.public, ours_chunks),
            lambda: service_path(plain_sum, plain_up),
        ),
        "aggregate3_binding": (
            lambda: service_path(setup.aggregator, ours_up),
            lambda: raw_add_binding(setup.public, ours_chunks),
            lambda: service_path(plain_sum, plain_up),
        ),
        "aggregate3_vectors": (
            lambda: service_path(setup.aggregator, ours_up),
            lambda: raw_add(setup.public, raw_up),
            lambda: service_path(plain_sum, plain_up),
        ),
        "decrypt": (
            lambda: setup.codec.decode_sum(ours_sum, rows=rows, cols=cols),
            lambda: raw_decrypt(setup.secret, raw_sum, (rows, cols)),
            lambda: plain.decode_sum(plain_up[0], rows=rows, cols=cols),
        ),
    }
    result: dict[str, object] = {
        "rows": rows,
        "cols": cols,
        "chunks": len(ours_chunks[0]),
        "bytes_per_float": len(ours_up[0]) / floats,
        "vs_float32": len(ours_up[0]) / floats / FLOAT32_BYTES,
        "sum_bytes_per_float": len(ours_sum) / floats,
        "raw_chunk_bytes_per_float": sum(map(len, raw_up[0])) / floats,
        # CKKS error alone (no grid) of public-key (bare TenSEAL) and of our shares; ours rounds
        # to the share grid and must give exactly the sum of the grid-rounded shares
        "raw_max_abs_error_sum3": _max_error(
            raw_decrypt(setup.secret, raw_sum, (rows, cols)), shares
        ),
        "packed_max_abs_error_sum3": _max_error(
            setup.codec.decrypt_sum(ours_sum, rows=rows, cols=cols),
            [to_grid(share) for share in shares],  # ours are encrypted on the grid
        ),
        "decoded_sum_exact": bool(
            np.array_equal(
                setup.codec.decode_sum(ours_sum, rows=rows, cols=cols),
                np.sum([to_grid(share) for share in shares], axis=0).astype(np.float32),
            )
        ),
    }
    for name, (ours, raw, float32) in stages.items():
        timing = interleaved(ours, raw, pairs=pairs)
        result[name] = {
            "calls_per_sample": timing["calls_per_sample"],
            "ours_cpu_ms": 1e3 * timing["first_cpu_seconds"],
            "raw_tenseal_cpu_ms": 1e3 * timing["second_cpu_seconds"],
            "ours_floats_per_s": floats / timing["first_cpu_seconds"],
            "raw_tenseal_floats_per_s": floats / timing["second_cpu_seconds"],
            "ours_over_raw_cpu": timing["ratio"],
            "float32_floats_per_s": floats / median_cpu_seconds(float32, samples=pairs),
        }
    return result


# ---------------------------------------------------------------------------------------------
# Output


def _ratio(stats: dict[str, float]) -> str:
    return (
        f"{stats['median']:.3f} [{stats['q1']:.3f}-{stats['q3']:.3f}]"
        f" ({stats['min']:.3f}-{stats['max']:.3f})"
    )


def print_sweep(rows: Sequence[dict[str, object]]) -> None:
    print(f"\nParameter sweep: sum of {SWEEP_SHARES} shares, |x| <= 1, ", end="")
    print(f"{SWEEP_SLOTS_PER_SHARE} values per share; 128-bit limits of the HE standard")
    header = f"{'candidate':38} {'bits':>16} {'scale':>5} {'log q':>5} {'TC/PQ':>7}"
    header += f" {'B/float':>8} {'x f32':>6} {'max err':>9} {'bound':>9} {'const16':>9}"
    print(header + f" {'headroom':>9} {'pub ctx':>8}")
    for row in rows:
        bits = str(tuple(row["coeff_mod_bit_sizes"]))
        limits = f"{row['he_standard_128_classical_limit']}/{row['he_standard_128_quantum_limit']}"
        prefix = f"{row['label']:38} {bits:>16} 2^{row['scale_bits']:<3} {row['total_bits']:5}"
        prefix += f" {limits:>7}"
        if "error" in row:
            print(f"{prefix} refused: {row['error']}")
            continue
        print(
            f"{prefix} {row['bytes_per_float']:8.2f} {row['vs_float32']:6.2f}"
            f" {row['max_abs_error_sum16']:9.2e} {row['predicted_error_bound_sum16']:9.2e}"
            f" {row['worst_case_error_sum16']:9.2e} {row['headroom_abs_sum']:9.3g}"
            f" {row['public_context_bytes']:8d}"
        )


def print_comparison(rows: Sequence[dict[str, object]]) -> None:
    print("\nPrevious vs chosen parameters (bare TenSEAL, framed bytes, CPU ms per call)")
    print("chosen/previous CPU time per pair: median [IQR] (min-max)")
    for row in rows:
        shape = f"{row['rows']}x{row['cols']}"
        for name in ("previous", "chosen"):
            side = row[name]
            print(
                f"{shape:>9} {name:>8}: {side['chunks']:3d} chunks,"
                f" {side['bytes_per_float']:6.2f} B/float, max err (sum of 3)"
                f" {side['max_abs_error_sum3']:.2e}"
            )
        for stage in ("encrypt", "add3", "decrypt"):
            n = row[stage]
            ratio = _ratio(n["chosen_over_previous_cpu"])
            print(
                f"{shape:>9} {stage:>8}: previous {n['previous_cpu_ms']:7.2f} ms,"
                f" chosen {n['chosen_cpu_ms']:7.2f} ms, ratio {ratio}"
            )


def print_throughput(rows: Sequence[dict[str, object]]) -> None:
    print("\nOurs vs bare TenSEAL, 3 shares: floats per CPU second (median of interleaved pairs)")
    for stage in STAGES:
        print(f"  {stage}: {STAGE_NOTES[stage]}")
    print("ours/raw CPU time per pair: median [IQR] (min-max)")
    print(
        f"{'shape':>10} {'B/float':>8} {'x f32':>6} {'stage':>18} {'ours':>10} {'raw':>10}"
        f" {'float32':>10}  ours/raw"
    )
    for row in rows:
        shape = f"{row['rows']}x{row['cols']}"
        for stage in STAGES:
            n = row[stage]
            print(
                f"{shape:>10} {row['bytes_per_float']:8.2f} {row['vs_float32']:6.2f} {stage:>18}"
                f" {n['ours_floats_per_s']:10.3g} {n['raw_tenseal_floats_per_s']:10.3g}"
                f" {n['float32_floats_per_s']:10.3g}  {_ratio(n['ours_over_raw_cpu'])}"
            )
    errors = [row["raw_max_abs_error_sum3"] for row in rows]
    packed = [row["packed_max_abs_error_sum3"] for row in rows]
    exact = all(row["decoded_sum_exact"] for row in rows)
    sums = [row["sum_bytes_per_float"] for row in rows]
    print(f"bytes per float of the sums: {min(sums):.2f} to {max(sums):.2f}")
    print(f"CKKS error of the 3-share sums, public-key: {min(errors):.2e} to {max(errors):.2e},")
    print(f"ours (secret key, two values per slot): {min(packed):.2e} to {max(packed):.2e};")
    print(f"our decoded sums equal the grid-rounded plaintext sums exactly: {exact}")


def environment(pairs: int) -> dict[str, object]:
    return {
        "tenseal": ts.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "poly_modulus_degree": POLY_MODULUS_DEGREE,
        "coeff_mod_bit_sizes": list(COEFF_MOD_BIT_SIZES),
        "global_scale_bits": GLOBAL_SCALE_BITS,
        "timing": (
            f"time.process_time, {pairs} interleaved pairs, order alternating, samples of at"
            f" least {MIN_SAMPLE_CPU_SECONDS} s CPU; ratios per pair"
        ),
        "timestamp_unix": math.floor(time.time()),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15, help="interleaved timing pairs")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args(argv)
    if args.pairs < 2:
        parser.error("--pairs must be at least 2")

    report: dict[str, object] = {"environment": environment(args.pairs)}
    if not args.skip_sweep:
        report["sweep"] = [sweep_candidate(candidate) for candidate in CANDIDATES]
        print_sweep(report["sweep"])
        report["mean_on_service"] = mean_on_service()
        print("\nMean on the service instead of sum:", json.dumps(report["mean_on_service"]))
    report["previous_vs_chosen"] = [
        compare_parameters(rows, cols, pairs=args.pairs) for rows, cols in COMPARE_SHAPES
    ]
    print_comparison(report["previous_vs_chosen"])
    setup = make_setup()
    report["public_context_bytes"] = len(public_context_bytes(setup.secret))
    report["secret_context_bytes"] = len(secret_context_bytes(setup.secret))
    report["throughput"] = [
        bench_shape(setup, rows, cols, pairs=args.pairs) for rows, cols in CORA_SHAPES
    ]
    print_throughput(report["throughput"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
