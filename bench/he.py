"""CKKS benchmark: parameter sweep (bytes per float, decoding error) and the throughput of our
codec/aggregator against bare TenSEAL calls on the matrices a Cora round sends.

    python bench/he.py [--repeats 5] [--out bench/results/he.json] [--skip-sweep]

Prints tables and writes JSON. Ratios are measured in one run (same machine, same load).
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

from secure.aggregation import PlainCodec, PlainSumAggregator
from secure.he import (
    COEFF_MOD_BIT_SIZES,
    GLOBAL_SCALE_BITS,
    POLY_MODULUS_DEGREE,
    CkksCodec,
    CkksSumAggregator,
    new_context,
    parse_frame,
    public_context_bytes,
)

FLOAT32_BYTES = 4
CORA_SHAPES = ((182, 128), (265, 128), (16, 128), (2708, 16))
SWEEP_SHARES = 16
SWEEP_SLOTS_PER_SHARE = 32_768
DEFAULT_OUT = Path(__file__).parent / "results" / "he.json"


# ---------------------------------------------------------------------------------------------
# Parameter sweep


@dataclass(frozen=True)
class Candidate:
    label: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    scale_bits: int


CANDIDATES = (
    Candidate("N=1024, two primes (infeasible)", 1024, (14, 13), 10),
    Candidate("N=2048, 32-bit data prime", 2048, (32, 22), 26),
    Candidate("N=2048, 32-bit data prime", 2048, (32, 22), 27),
    Candidate("N=2048, 34-bit data prime", 2048, (34, 20), 28),
    Candidate("N=2048, 40-bit data prime (chosen)", 2048, (40, 14), 29),
    Candidate("N=4096, brief's example", 4096, (40, 20, 40), 20),
    Candidate("N=4096, 40-bit data prime", 4096, (40, 40), 29),
    Candidate("N=8192, TenSEAL tutorial", 8192, (60, 40, 40, 60), 40),
)


def sweep_candidate(candidate: Candidate) -> dict[str, object]:
    """Bytes per float and max abs error of a sum of SWEEP_SHARES shares with |x| <= 1."""
    row: dict[str, object] = asdict(candidate)
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

    That needs a second data prime (for the rescale), which does not fit N = 2048 at 128 bits.
    """
    context = _raw_context(4096, (40, 29, 40))
    context.global_scale = 2.0**29
    shares = _sweep_shares(seed=7)[:3, :2048]
    uploads = [ts.ckks_vector(context, share.tolist()).serialize() for share in shares]
    vectors = [ts.ckks_vector_from(context, data) for data in uploads]
    total = vectors[0] + vectors[1] + vectors[2]
    started = time.perf_counter()
    mean = total * (1.0 / len(vectors))
    multiply_seconds = time.perf_counter() - started
    download = mean.serialize()
    error = float(np.abs(np.asarray(mean.decrypt()) - shares.mean(axis=0)).max())
    return {
        "parameters": "N=4096, coeff_mod_bit_sizes=(40, 29, 40), scale 2^29",
        "upload_bytes_per_float": len(uploads[0]) / 2048,
        "download_bytes_per_float": len(download) / 2048,
        "max_abs_error_mean3": error,
        "multiply_rescale_seconds_per_chunk": multiply_seconds,
    }


def _raw_context(poly_modulus_degree: int, bits: Sequence[int]) -> ts.Context:
    return ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=poly_modulus_degree,
        coeff_mod_bit_sizes=list(bits),
        n_threads=1,
    )


# ---------------------------------------------------------------------------------------------
# Throughput: our path vs bare TenSEAL


@dataclass(frozen=True)
class Setup:
    codec: CkksCodec
    aggregator: CkksSumAggregator
    secret: ts.Context
    public: ts.Context


def make_setup() -> Setup:
    secret = new_context()
    aggregator = CkksSumAggregator.from_bytes(public_context_bytes(secret))
    public = ts.context_from(public_context_bytes(secret), n_threads=1)
    return Setup(CkksCodec(secret), aggregator, secret, public)


def raw_encrypt(context: ts.Context, matrix: np.ndarray) -> list[bytes]:
    values = matrix.astype(np.float64).reshape(-1)
    slots = POLY_MODULUS_DEGREE // 2
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


def raw_decrypt(context: ts.Context, chunks: Sequence[bytes], shape: tuple[int, int]) -> np.ndarray:
    values = np.concatenate([np.asarray(ts.ckks_vector_from(context, c).decrypt()) for c in chunks])
    return values.astype(np.float32).reshape(shape)


def best_seconds(action: Callable[[], object], *, repeats: int) -> float:
    """Median wall time of ``repeats`` runs after one warm-up."""
    action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_shape(setup: Setup, rows: int, cols: int, *, repeats: int) -> dict[str, object]:
    rng = np.random.default_rng(rows * cols)
    shares = [rng.uniform(-1, 1, size=(rows, cols)).astype(np.float32) for _ in range(3)]
    floats = rows * cols
    ours_up = [setup.codec.encode(share) for share in shares]
    raw_up = [raw_encrypt(setup.secret, share) for share in shares]
    ours_sum = setup.aggregator.add(ours_up, rows=rows, cols=cols)
    raw_sum = raw_add(setup.public, raw_up)
    plain, plain_sum = PlainCodec(), PlainSumAggregator()
    plain_up = [plain.encode(share) for share in shares]

    timings = {
        "encrypt": (
            lambda: setup.codec.encode(shares[0]),
            lambda: raw_encrypt(setup.secret, shares[0]),
            lambda: plain.encode(shares[0]),
        ),
        "aggregate3": (
            lambda: setup.aggregator.add(ours_up, rows=rows, cols=cols),
            lambda: raw_add(setup.public, raw_up),
            lambda: plain_sum.add(plain_up, rows=rows, cols=cols),
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
        "chunks": len(parse_frame(ours_up[0]).chunks),
        "bytes_per_float": len(ours_up[0]) / floats,
        "vs_float32": len(ours_up[0]) / floats / FLOAT32_BYTES,
        "raw_chunk_bytes_per_float": sum(map(len, raw_up[0])) / floats,
        "max_abs_error_sum3": float(
            np.abs(
                setup.codec.decode_sum(ours_sum, rows=rows, cols=cols)
                - np.sum([s.astype(np.float64) for s in shares], axis=0)
            ).max()
        ),
    }
    for name, (ours, raw, float32) in timings.items():
        ours_seconds = best_seconds(ours, repeats=repeats)
        raw_seconds = best_seconds(raw, repeats=repeats)
        plain_seconds = best_seconds(float32, repeats=repeats)
        result[name] = {
            "ours_floats_per_s": floats / ours_seconds,
            "raw_tenseal_floats_per_s": floats / raw_seconds,
            "ours_over_raw_throughput": raw_seconds / ours_seconds,
            "float32_floats_per_s": floats / plain_seconds,
        }
    return result


# ---------------------------------------------------------------------------------------------
# Output


def print_sweep(rows: Sequence[dict[str, object]]) -> None:
    print(f"\nParameter sweep: sum of {SWEEP_SHARES} shares, |x| <= 1, ", end="")
    print(f"{SWEEP_SLOTS_PER_SHARE} values per share")
    header = f"{'candidate':38} {'bits':>16} {'scale':>5} {'B/float':>8} {'x f32':>6}"
    print(header + f" {'max err':>9} {'const16':>9} {'headroom':>9} {'pub ctx':>8}")
    for row in rows:
        bits = str(tuple(row["coeff_mod_bit_sizes"]))
        prefix = f"{row['label']:38} {bits:>16} 2^{row['scale_bits']:<3}"
        if "error" in row:
            print(f"{prefix} refused: {row['error']}")
            continue
        print(
            f"{prefix} {row['bytes_per_float']:8.2f} {row['vs_float32']:6.2f}"
            f" {row['max_abs_error_sum16']:9.2e} {row['worst_case_error_sum16']:9.2e}"
            f" {row['headroom_abs_sum']:9.3g}"
            f" {row['public_context_bytes']:8d}"
        )


def print_throughput(rows: Sequence[dict[str, object]]) -> None:
    print("\nThroughput (floats/s, median), ours vs bare TenSEAL, 3 shares")
    print(
        f"{'shape':>10} {'B/float':>8} {'x f32':>6} {'stage':>10} {'ours':>11} {'raw':>11}", end=""
    )
    print(f" {'ours/raw':>8} {'float32':>11}")
    for row in rows:
        shape = f"{row['rows']}x{row['cols']}"
        for stage in ("encrypt", "aggregate3", "decrypt"):
            n = row[stage]
            print(
                f"{shape:>10} {row['bytes_per_float']:8.2f} {row['vs_float32']:6.2f} {stage:>10}"
                f" {n['ours_floats_per_s']:11.3g} {n['raw_tenseal_floats_per_s']:11.3g}"
                f" {n['ours_over_raw_throughput']:8.2f} {n['float32_floats_per_s']:11.3g}"
            )


def environment() -> dict[str, object]:
    return {
        "tenseal": ts.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "poly_modulus_degree": POLY_MODULUS_DEGREE,
        "coeff_mod_bit_sizes": list(COEFF_MOD_BIT_SIZES),
        "global_scale_bits": GLOBAL_SCALE_BITS,
        "timestamp_unix": math.floor(time.time()),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args(argv)

    report: dict[str, object] = {"environment": environment()}
    if not args.skip_sweep:
        report["sweep"] = [sweep_candidate(candidate) for candidate in CANDIDATES]
        print_sweep(report["sweep"])
        report["mean_on_service"] = mean_on_service()
        print("\nMean on the service instead of sum:", json.dumps(report["mean_on_service"]))
    setup = make_setup()
    report["public_context_bytes"] = len(public_context_bytes(setup.secret))
    report["throughput"] = [
        bench_shape(setup, rows, cols, repeats=args.repeats) for rows, cols in CORA_SHAPES
    ]
    print_throughput(report["throughput"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
