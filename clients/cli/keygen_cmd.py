"""``glasu keygen``: the CKKS key pair (a secret context for workers, a public one for the
service)."""

from __future__ import annotations

import argparse

from clients.cli.errors import UsageError, failing_as
from clients.cli.options import add_command, add_output_dir_argument, check_output_dir


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = add_command(
        commands,
        "keygen",
        help="write a CKKS secret context (workers) and public context (service)",
        description="Write secret.context (mode 0600; give it to every worker out of band) and "
        "public.context (the only key material the service may have).",
    )
    add_output_dir_argument(p)
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing key files (every ciphertext made with them is lost)",
    )
    return p


def check(args: argparse.Namespace) -> None:
    check_output_dir(args.out, "--out")
    if args.overwrite:
        return
    from secure.ckks_context import PUBLIC_CONTEXT_NAME, SECRET_CONTEXT_NAME

    existing = [args.out / name for name in (SECRET_CONTEXT_NAME, PUBLIC_CONTEXT_NAME)]
    existing = [path for path in existing if path.exists()]
    if existing:
        raise UsageError(
            f"--out {args.out} holds key files ({', '.join(map(str, existing))}); pass "
            "--overwrite to replace them (every ciphertext made with them is then lost)"
        )


def run(args: argparse.Namespace) -> int:
    from secure.ckks import generate_keys

    with failing_as("cannot write the keys"):
        secret, public = generate_keys(args.out, overwrite=args.overwrite)
    print(f"secret context (workers only): {secret}")
    print(f"public context (service):      {public}")
    return 0
