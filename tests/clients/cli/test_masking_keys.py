"""The keys of masked sessions on the command line: ``glasu keygen --scheme bfv`` (the shared BFV
key) and ``--masking-key`` (one organisation's X25519 pair), and how a worker reads them with
its peers' pinned public keys (``clients/cli/worker_cmd.py`` ``worker_codec``)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from clients.cli.errors import EXIT_USAGE, CliError
from clients.cli.main import main
from clients.cli.worker_cmd import worker_codec
from clients.settings import WorkerSettings
from secure.ckks import CkksCodec
from secure.masking.codec import MaskedBfvCodec


def keygen(*argv: str) -> int:
    try:
        return main(["keygen", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    assert keygen("--scheme", "bfv", "--out", str(root / "bfv")) == 0
    assert keygen("--out", str(root / "ckks")) == 0
    for m in range(3):
        assert keygen("--masking-key", "--out", str(root / f"party-{m}")) == 0
    return root


def settings(keys: Path, **fields: object) -> WorkerSettings:
    token = keys / "token"
    token.write_text("t" * 32)
    return WorkerSettings(
        server="http://127.0.0.1:9", session="s-1", client=0, token_file=token,
        data=keys, **fields,
    )  # fmt: skip


def pins(keys: Path, *parties: int) -> str:
    return ",".join(f"{m}={keys / f'party-{m}' / 'masking.pub'}" for m in parties)


def test_keygen_writes_the_bfv_key_and_a_masking_key_pair_private(keys: Path) -> None:
    for private in (keys / "bfv" / "bfv-secret.context", keys / "party-0" / "masking.key"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert (keys / "party-0" / "masking.pub").read_text().strip() != (
        keys / "party-1" / "masking.pub"
    ).read_text().strip()
    assert keygen("--masking-key", "--out", str(keys / "party-0")) == EXIT_USAGE  # no overwrite
    assert keygen("--masking-key", "--scheme", "bfv", "--out", str(keys / "x")) == EXIT_USAGE


def test_a_worker_with_masking_keys_masks_and_one_without_does_not(keys: Path) -> None:
    masked = worker_codec(
        settings(
            keys, secret_context=keys / "bfv" / "bfv-secret.context",
            masking_key=keys / "party-0" / "masking.key", masking_peer_keys=pins(keys, 1, 2),
        ),
        parties=3,
    )  # fmt: skip
    assert isinstance(masked, MaskedBfvCodec) and masked.encoding == "bfv-masked"
    assert (masked.party, masked.parties, masked.session_id) == (0, 3, "s-1")
    plain = worker_codec(settings(keys, secret_context=keys / "ckks" / "secret.context"), parties=3)
    assert isinstance(plain, CkksCodec)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"masking_peer_keys": "1=a.pub"}, "--masking-peer-keys pins the peers' masking keys"),
        ({"masking_key": "party-0/masking.key"}, "--masking-key needs --secret-context"),
        (
            {"masking_key": "party-0/masking.key", "secret_context": "ckks/secret.context"},
            "make the key with `glasu keygen --scheme bfv`",
        ),
        (
            {"masking_key": "party-0/masking.key", "secret_context": "bfv/bfv-secret.context",
             "masking_peer_keys": "PINS-1"},
            "--masking-peer-keys: no pinned masking key for parties [2]",
        ),
        (
            {"masking_key": "bfv/bfv-secret.context", "secret_context": "bfv/bfv-secret.context"},
            "--masking-key",
        ),
    ],
)  # fmt: skip
def test_masking_keys_that_do_not_fit_are_refused_in_one_sentence(
    keys: Path, fields: dict[str, str], says: str
) -> None:
    values: dict[str, object] = {}
    for name, value in fields.items():
        if value == "PINS-1":
            values[name] = pins(keys, 1)
        elif name == "masking_peer_keys":
            values[name] = value
        else:
            values[name] = keys / value
    with pytest.raises(CliError) as refused:
        worker_codec(settings(keys, **values), parties=3)
    assert says in str(refused.value)


def test_peer_keys_must_be_client_index_and_path_pairs(keys: Path) -> None:
    with pytest.raises(ValueError, match="give M=PATH,M=PATH"):
        settings(keys, masking_peer_keys="a.pub")
    with pytest.raises(ValueError, match="pinned twice"):
        settings(keys, masking_peer_keys="1=a.pub,1=b.pub")
