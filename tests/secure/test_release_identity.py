"""A release's identity (secure/release_noise.py): its digest, hence its noise key, covers every
input of the release and every parameter of the mechanism that noises it, so the same inputs at
two noise levels never share a noise draw (2 r1 - r2 would be the clean release)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np
import pytest

from secure.privacy import SessionPrivacy
from secure.release_noise import ReleaseKeyedNoise, ReleaseMechanism, ReleaseSecret, release_digest

SECRET = ReleaseSecret(bytes(range(32)))
PRIVACY = SessionPrivacy.plan(
    epsilon=None, delta=1e-6, noise_multiplier=2.0, clip=1.0, occurrence_cap=2,
    clients=3, passes_total=10, encrypted=True,
)  # fmt: skip
MECHANISM = ReleaseMechanism.of(PRIVACY, width=8, encoding="ckks")
rng = np.random.default_rng(0)
INPUTS: dict[str, Any] = dict(
    pass_index=3,
    layer=1,
    output_nodes=np.arange(5, dtype=np.int64),
    rows=np.arange(12, dtype=np.int64),
    clean=rng.normal(size=(12, 8)).astype(np.float32),
    part_rows=131072,
    presence=None,
)


def digest_of(**changed: Any) -> bytes:
    inputs = {**INPUTS, "mechanism": MECHANISM, **changed}
    return release_digest(**inputs)


def noise_of(digest: bytes) -> np.ndarray:
    return ReleaseKeyedNoise(SECRET, scope="s1/client0").for_release(digest).sample(64, std=1.0)


#: one other value per parameter of the mechanism
OTHER_MECHANISM = {
    "layer": 2,
    "width": 16,
    "clients": 4,
    "noise_multiplier": 4.0,
    "ledger_noise_multiplier": 4.0,
    "noise_std": MECHANISM.noise_std * 2,
    "clip": 2.0,
    "sensitivity": MECHANISM.sensitivity * 2,
    "occurrence_cap": 3,
    "shared_noise": True,
    "encoding": "none",
    "split_noise": True,
    "release": "degree-normalised",
    "degree_floor": 4,
}


def test_the_mechanism_names_every_parameter_of_the_release() -> None:
    assert set(OTHER_MECHANISM) == {f.name for f in dataclasses.fields(ReleaseMechanism)}
    assert MECHANISM.noise_multiplier == 2.0 and MECHANISM.clients == 3
    assert MECHANISM.sensitivity == PRIVACY.sensitivity
    assert MECHANISM.noise_std == PRIVACY.client_noise_std
    assert ReleaseMechanism.from_canonical(MECHANISM.canonical()) == MECHANISM


@pytest.mark.parametrize(("name", "value"), sorted(OTHER_MECHANISM.items()))
def test_changing_any_mechanism_parameter_changes_the_digest_and_the_noise(
    name: str, value: Any
) -> None:
    other = dataclasses.replace(MECHANISM, **{name: value})
    assert other.digest != MECHANISM.digest
    assert MECHANISM.differences(other) == [f"{name}: {getattr(MECHANISM, name)!r} != {value!r}"]
    first, second = digest_of(), digest_of(mechanism=other)
    assert first != second
    # independent draws: r2 - 2 r1 keeps noise, nothing cancels
    a, b = noise_of(first), noise_of(second)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.5 and not np.allclose(a, b)


@pytest.mark.parametrize(
    "changed",
    [
        {"pass_index": 4},
        {"layer": 2},
        {"output_nodes": np.arange(1, 6, dtype=np.int64)},
        {"rows": np.arange(1, 13, dtype=np.int64)},
        {"clean": INPUTS["clean"] + np.float32(1e-3)},
        {"part_rows": 100},
        {"presence": np.ones((12, 1), dtype=np.float32)},
    ],
    ids=lambda changed: next(iter(changed)),
)
def test_changing_any_input_changes_the_digest(changed: dict[str, Any]) -> None:
    assert digest_of(**changed) != digest_of()


def test_the_same_release_under_the_same_mechanism_draws_the_same_noise() -> None:
    again = ReleaseMechanism.of(PRIVACY, width=8, encoding="ckks")
    assert digest_of(mechanism=again) == digest_of()
    np.testing.assert_array_equal(noise_of(digest_of(mechanism=again)), noise_of(digest_of()))


def test_z_times_two_is_another_mechanism_and_another_draw() -> None:
    """The attack of issue 35: the session described again with z x 2, every input the same."""
    doubled = SessionPrivacy.restore(
        {**PRIVACY.settings(), "noise_multiplier": 4.0}, clients=3, passes_total=10, encrypted=True
    )
    other = ReleaseMechanism.of(doubled, width=8, encoding="ckks")
    assert "noise_multiplier: 2.0 != 4.0" in MECHANISM.differences(other)
    assert digest_of(mechanism=other) != digest_of()


def test_keys_of_the_earlier_derivation_never_equal_these() -> None:
    """The personalisation is glasu-noise-v2: the same secret, scope and digest bytes give
    another key than under glasu-noise-v1."""
    digest = digest_of()
    scope = b"s1/client0"
    v1 = hashlib.blake2b(key=SECRET.to_bytes(), digest_size=32, person=b"glasu-noise-v1")
    v1.update(len(scope).to_bytes(4, "big") + scope + digest)
    assert SECRET.derive(scope="s1/client0", release=digest) != int.from_bytes(v1.digest(), "big")
