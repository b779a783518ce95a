"""Ed25519 key files, as ``glasu align keygen`` and ``glasu report keygen`` write them: the
32-byte seed in hex (mode 0600) and the 32-byte public key in hex beside it."""

from __future__ import annotations

from pathlib import Path

from clients.cli.errors import CliError, failing_as
from clients.cli.options import write_private_file

KEY_BYTES = 32


def write_key_pair(out: Path, private_name: str, public_name: str) -> tuple[Path, Path]:
    """A fresh key pair in ``out``: (the signing key's file, the public key's)."""
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    with failing_as(f"cannot write --out {out}"):
        out.mkdir(parents=True, exist_ok=True)
        write_private_file(out / private_name, bytes(key).hex())
        (out / public_name).write_text(bytes(key.verify_key).hex() + "\n")
    return out / private_name, out / public_name


def read_key_bytes(path: Path, flag: str, *, made_by: str) -> bytes:
    """The 32 key bytes of a key file; :class:`CliError` naming ``flag`` otherwise."""
    with failing_as(f"cannot read the key file given by {flag}"):
        text = path.read_text(encoding="utf-8").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise CliError(f"{flag} {path} is not a key of `{made_by}` (32 bytes, hex)")
    return key
