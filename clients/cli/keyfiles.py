"""Key files, as ``glasu align keygen`` and ``glasu report keygen`` write them: the 32-byte
private key (an Ed25519 seed, or an X25519 key for the pairwise masks) in hex (mode 0600) and the
32-byte public key in hex beside it; and the keys a worker pins (its peers' masking keys, the
answering party's signing key of an online session)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clients.cli.errors import CliError, UsageError, failing_as
from clients.cli.options import write_private_file

if TYPE_CHECKING:
    from clients.request_signing import RequestCheck
    from clients.settings import WorkerSettings
    from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys

KEY_BYTES = 32
MASKING_KEYGEN = "glasu keygen --masking-key"  # named in errors


def write_key_pair(out: Path, private_name: str, public_name: str) -> tuple[Path, Path]:
    """A fresh Ed25519 key pair in ``out``: (the signing key's file, the public key's)."""
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    return _write_key_files(out, private_name, public_name, bytes(key), bytes(key.verify_key))


def write_masking_key_pair(out: Path) -> tuple[Path, Path]:
    """A fresh X25519 masking key pair in ``out``: (the private key's file, the public key's)."""
    from secure.masking.keys import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, MaskingKeyPair

    pair = MaskingKeyPair.generate()
    private = pair.private_bytes().reveal()
    return _write_key_files(out, PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, private, pair.public_bytes())


def _write_key_files(
    out: Path, private_name: str, public_name: str, private: bytes, public: bytes
) -> tuple[Path, Path]:
    with failing_as(f"cannot write --out {out}"):
        out.mkdir(parents=True, exist_ok=True)
        write_private_file(out / private_name, private.hex())
        (out / public_name).write_text(public.hex() + "\n")
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


def read_masking_key_pair(path: Path, flag: str) -> MaskingKeyPair:
    """This organisation's masking key pair from its private key file."""
    from secure.masking.keys import MaskingKeyPair

    return MaskingKeyPair.from_private_bytes(read_key_bytes(path, flag, made_by=MASKING_KEYGEN))


def read_pinned_masking_keys(peer_keys: list[tuple[int, Path]], flag: str) -> PinnedPeerKeys:
    """The peers' public masking keys, pinned by party index (``flag M=PATH`` each)."""
    from secure.masking.keys import PinnedPeerKeys

    return PinnedPeerKeys(
        {m: read_key_bytes(path, flag, made_by=MASKING_KEYGEN) for m, path in peer_keys}
    )


def online_request_check(settings: WorkerSettings) -> RequestCheck:
    """What an online worker checks of each request (``clients/request_signing.py``): the
    signature of the answering party its owner pinned; with neither a pinned key nor
    ``--accept-unsigned-requests``, online mode is refused (:class:`UsageError`)."""
    from nacl.signing import VerifyKey

    from clients.request_signing import RequestCheck

    pinned = settings.pinned_answering_key()
    if pinned is None:
        if not settings.accept_unsigned_requests:
            raise UsageError(
                "--online needs --answering-party-key M=PATH (the answering party's "
                "alignment-signing.pub of `glasu align keygen`), so that only requests it signed "
                "are answered; "
                "--accept-unsigned-requests takes part in any request the service opens"
            )
        return RequestCheck(online_id=settings.session)
    party, path = pinned
    key = read_key_bytes(path, "--answering-party-key", made_by="glasu align keygen")
    return RequestCheck(
        online_id=settings.session,
        party=party,
        key=VerifyKey(key),
        max_age_seconds=settings.request_max_age_seconds,
    )
