"""secure/masking/keys.py and secret_material.py: X25519 pair secrets agree at both ends and are
bound to the pair; pinned keys fit the parties; secrets never show in a repr; key files round-trip
in the alignment's format (clients/cli/keyfiles.py)."""

from __future__ import annotations

import pickle
import stat

import pytest

from clients.cli.errors import CliError
from clients.cli.keyfiles import (
    read_masking_key_pair,
    read_pinned_masking_keys,
    write_masking_key_pair,
)
from secure.masking.keys import MaskingKeyPair, PinnedPeerKeys
from secure.masking.secret_material import SecretBytes


def _pairs(n: int) -> list[MaskingKeyPair]:
    return [MaskingKeyPair.generate() for _ in range(n)]


def test_both_ends_of_a_pair_agree_and_other_pairs_differ() -> None:
    a, b, c = _pairs(3)
    ab = a.pair_secret(party=0, peer=1, peer_public=b.public_bytes())
    ba = b.pair_secret(party=1, peer=0, peer_public=a.public_bytes())
    ac = a.pair_secret(party=0, peer=2, peer_public=c.public_bytes())
    assert ab == ba
    assert ab != ac
    assert len(ab) == 32


def test_the_pair_secret_is_bound_to_the_party_indices() -> None:
    a, b = _pairs(2)
    as_0_1 = a.pair_secret(party=0, peer=1, peer_public=b.public_bytes())
    as_0_2 = a.pair_secret(party=0, peer=2, peer_public=b.public_bytes())
    assert as_0_1 != as_0_2


def test_low_order_and_malformed_peer_keys_are_refused() -> None:
    (a,) = _pairs(1)
    with pytest.raises(ValueError):
        a.pair_secret(party=0, peer=1, peer_public=bytes(32))  # all-zero shared secret
    with pytest.raises(ValueError, match="32 bytes"):
        a.pair_secret(party=0, peer=1, peer_public=bytes(31))
    with pytest.raises(ValueError, match="itself"):
        a.pair_secret(party=0, peer=0, peer_public=a.public_bytes())


def test_secrets_never_show_in_repr_str_or_pickle() -> None:
    pair = MaskingKeyPair.generate()
    private = pair.private_bytes()
    secret = pair.pair_secret(party=0, peer=1, peer_public=MaskingKeyPair.generate().public_bytes())
    for shown in (repr(pair), repr(private), str(private), repr(secret), f"{secret}"):
        assert private.reveal().hex() not in shown
        assert secret.reveal().hex() not in shown
    assert "redacted" in repr(secret)
    with pytest.raises(TypeError):
        pickle.dumps(secret)
    assert SecretBytes(b"x" * 16, kind="a") != SecretBytes(b"x" * 16, kind="b")


def test_pinned_keys_must_cover_every_other_party_and_no_stranger() -> None:
    publics = {m: p.public_bytes() for m, p in enumerate(_pairs(3))}
    PinnedPeerKeys({1: publics[1], 2: publics[2]}).check_parties(3, 0)
    with pytest.raises(ValueError, match=r"no pinned masking key for parties \[2\]"):
        PinnedPeerKeys({1: publics[1]}).check_parties(3, 0)
    with pytest.raises(ValueError, match=r"pinned for parties \[0, 5\]"):
        PinnedPeerKeys({0: publics[0], 1: publics[1], 5: publics[2]}).check_parties(3, 0)
    with pytest.raises(ValueError, match="X25519"):
        PinnedPeerKeys({1: b"short"})


def test_pinned_pair_secrets_cancel_at_both_ends() -> None:
    pairs = _pairs(3)
    pinned = [
        PinnedPeerKeys({j: p.public_bytes() for j, p in enumerate(pairs) if j != m})
        for m in range(3)
    ]
    secrets = [pinned[m].pair_secrets(pairs[m], party=m) for m in range(3)]
    for m in range(3):
        for j in range(3):
            if j != m:
                assert secrets[m][j] == secrets[j][m]


def test_key_files_round_trip_in_the_alignments_format(tmp_path) -> None:
    private_path, public_path = write_masking_key_pair(tmp_path)
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert len(bytes.fromhex(private_path.read_text().strip())) == 32
    loaded = read_masking_key_pair(private_path, "--masking-key")
    assert loaded.public_bytes().hex() == public_path.read_text().strip()
    pinned = read_pinned_masking_keys([(1, public_path)], "--masking-peer-key")
    assert pinned.keys[1] == loaded.public_bytes()
    public_path.write_text("not hex\n")
    with pytest.raises(CliError, match="--masking-peer-key"):
        read_pinned_masking_keys([(1, public_path)], "--masking-peer-key")
