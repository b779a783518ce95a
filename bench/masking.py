"""The cost of secure aggregation's pairwise masks (secure/masking/, docs/secure-aggregation.md):
CPU per 8192 values to expand mask streams and a party's mask, and to encrypt under BFV against
today's CKKS codec, and bytes per value of a share and of a sum of three in each scheme.

    python -m bench.masking [--repeats 30] [--out bench/results/masking.json]

Timings are CPU time (``time.process_time``) of this process, the median of ``--repeats``
samples; one-thread contexts. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from secure.aggregation import to_grid
from secure.ckks import CkksCodec, CkksSumAggregator
from secure.ckks_context import new_context, public_context_bytes
from secure.masking import bfv
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.streams import MaskSlot, mask_stream, party_mask, slot_seeds

VALUES = 8192
SHARES = 3
DEFAULT_OUT = Path(__file__).parent / "results" / "masking.json"
SLOT = MaskSlot("bench", pass_index=0, layer=0, part=0)


def _cpu_ms(call: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        samples.append(time.process_time() - start)
    return 1000 * statistics.median(samples)


def _secrets(parties: int) -> dict:
    pairs = [MaskingKeyPair.generate() for _ in range(parties)]
    peers = PinnedPeerKeys({j: p.public_bytes() for j, p in enumerate(pairs) if j})
    return peers.pair_secrets(pairs[0], party=0)


def measure(repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    share = to_grid(rng.normal(0, 1, VALUES))
    seed = next(iter(slot_seeds(_secrets(2), SLOT, party=0).values()))
    results: dict[str, float] = {
        "stream_ms_per_8192": _cpu_ms(
            lambda: mask_stream(seed, count=VALUES, modulus=bfv.PLAIN_MODULUS), repeats
        )
    }
    for parties in (3, 16):
        secrets = _secrets(parties)
        results[f"party_mask_ms_per_8192_m{parties}"] = _cpu_ms(
            lambda s=secrets: party_mask(s, SLOT, party=0, count=VALUES, modulus=bfv.PLAIN_MODULUS),
            repeats,
        )

    context = bfv.new_bfv_context()
    encoded = bfv.encode_share(share)
    results["bfv_encrypt_ms_per_8192"] = _cpu_ms(lambda: bfv.encrypt(context, encoded), repeats)
    chunks = bfv.encrypt(context, encoded)
    total = bfv.add_encrypted(bfv.public_bfv_context(context), [chunks] * SHARES)
    results["bfv_share_bytes_per_value"] = sum(map(len, chunks)) / VALUES
    results["bfv_sum_bytes_per_value"] = sum(map(len, total)) / VALUES

    ckks = new_context()
    codec = CkksCodec(ckks)
    matrix = share.reshape(64, VALUES // 64)
    results["ckks_encode_ms_per_8192"] = _cpu_ms(lambda: codec.encode(matrix), repeats)
    payload = codec.encode(matrix)
    aggregator = CkksSumAggregator.from_bytes(public_context_bytes(ckks))
    summed = aggregator.add([payload] * SHARES, rows=64, cols=VALUES // 64)
    results["ckks_share_bytes_per_value"] = len(payload) / VALUES
    results["ckks_sum_bytes_per_value"] = len(summed) / VALUES
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    results = measure(args.repeats)
    for name, value in results.items():
        print(f"{name:36s} {value:9.3f}")
    record = {"machine": platform.platform(), "repeats": args.repeats, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
