"""``glasu keygen``: the CKKS key pair (a secret context for workers, a public one for the
service)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "keygen",
        help="write a CKKS secret context (workers) and public context (service)",
        description="Write secret.context (mode 0600; give it to every worker out of band) and "
        "public.context (the only key material the service may have).",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing key files (every ciphertext made with them is lost)",
    )


def run(args: argparse.Namespace) -> int:
    from secure.he import generate_keys

    secret, public = generate_keys(args.out, overwrite=args.overwrite)
    print(f"secret context (workers only): {secret}")
    print(f"public context (service):      {public}")
    return 0
