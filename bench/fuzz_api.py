"""A longer schema-based fuzzing run of the service API than the test suite's (Schemathesis,
in process): the same test with many more examples per operation. Prints and writes the outcome
(operations, examples, failures, seconds) to bench/results/api_fuzz.json.

    python -m bench.fuzz_api [--examples 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = ROOT / "tests" / "service" / "test_schemathesis.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per operation")
    args = parser.parse_args()
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TEST)],
        cwd=ROOT,
        env={**os.environ, "API_FUZZ_EXAMPLES": str(args.examples)},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    result = {
        "examples_per_operation": args.examples,
        "outcome": summary,
        "exit_code": done.returncode,
        "seconds": round(seconds, 1),
    }
    print(json.dumps(result, indent=2))
    if done.returncode:
        print(done.stdout[-5000:], file=sys.stderr)
    out = ROOT / "bench" / "results" / "api_fuzz.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
