"""``glasu keygen``: the shared homomorphic key of a federation (a secret context for workers, a
public one; CKKS by default, BFV for sessions with masked secure aggregation), or with
``--masking-key`` one organisation's X25519 key pair for the pairwise masks."""

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
        "public.context (the only key material the service may have). With --scheme bfv, the "
        "shared BFV key of sessions with --secure-aggregation masks: bfv-secret.context (every "
        "worker's) and bfv-public.context (the service needs neither). With --masking-key, this "
        "organisation's own X25519 key pair for the pairwise masks: masking.key (mode 0600, "
        "this organisation's worker only) and masking.pub (give it to the other organisations, "
        "who pin it with --masking-peer-keys).",
    )
    add_output_dir_argument(p)
    p.add_argument(
        "--scheme",
        choices=("ckks", "bfv"),
        default="ckks",
        help="ckks: the key of encrypted sessions; bfv: the key of masked sessions (default: ckks)",
    )
    p.add_argument(
        "--masking-key",
        action="store_true",
        help="write this organisation's X25519 masking key pair instead",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing key files (every ciphertext made with them is lost)",
    )
    return p


def _key_files(args: argparse.Namespace) -> tuple[str, str]:
    if args.masking_key:
        from secure.masking.keys import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE

        return PRIVATE_KEY_FILE, PUBLIC_KEY_FILE
    if args.scheme == "bfv":
        from secure.masking.codec import PUBLIC_CONTEXT_NAME, SECRET_CONTEXT_NAME

        return SECRET_CONTEXT_NAME, PUBLIC_CONTEXT_NAME
    from secure.ckks_context import PUBLIC_CONTEXT_NAME, SECRET_CONTEXT_NAME

    return SECRET_CONTEXT_NAME, PUBLIC_CONTEXT_NAME


def check(args: argparse.Namespace) -> None:
    check_output_dir(args.out, "--out")
    if args.masking_key and args.scheme != "ckks":
        raise UsageError("--masking-key writes an X25519 key pair: give it without --scheme")
    if args.overwrite:
        return
    existing = [args.out / name for name in _key_files(args)]
    existing = [path for path in existing if path.exists()]
    if existing:
        raise UsageError(
            f"--out {args.out} holds key files ({', '.join(map(str, existing))}); pass "
            "--overwrite to replace them (every ciphertext made with them is then lost)"
        )


def run(args: argparse.Namespace) -> int:
    if args.masking_key:
        from clients.cli.keyfiles import write_masking_key_pair

        private, public = write_masking_key_pair(args.out)
        print(f"masking key (this organisation's worker only): {private}")
        print(f"masking public key (the other organisations):  {public}")
        return 0
    if args.scheme == "bfv":
        from secure.masking.codec import generate_bfv_keys as generate_keys
    else:
        from secure.ckks import generate_keys
    with failing_as("cannot write the keys"):
        secret, public = generate_keys(args.out, overwrite=args.overwrite)
    print(f"secret context (workers only): {secret}")
    print(f"public context (service):      {public}" if args.scheme == "ckks" else
          f"public context (not needed):   {public}")  # fmt: skip
    return 0
