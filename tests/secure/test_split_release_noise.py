"""A party's split share of the noise, keyed per release (secure/release_noise.py;
docs/privacy.md sections 2.2 and 11): exact discrete Gaussians on the share grid, a function of
the release, and a mechanism whose identity covers the split without moving any earlier digest."""

from __future__ import annotations

import numpy as np
import pytest

from secure.aggregation import SHARE_GRID
from secure.privacy import SessionPrivacy
from secure.release_noise import (
    ReleaseKeyedNoise,
    ReleaseMechanism,
    ReleaseSecret,
    SplitReleaseKeyedNoise,
    part_key,
    release_keyed_noise,
    split_share_part,
)
from secure.split_noise import privatize_on_grid

SECRET = ReleaseSecret(bytes(range(32)))
PLAN = dict(epsilon=None, delta=1e-6, noise_multiplier=2.0, clip=1.0, occurrence_cap=1)
SPLIT = SessionPrivacy.plan(**PLAN, clients=3, passes_total=10, encrypted=True, split_noise=True)
UNSPLIT = SessionPrivacy.plan(**PLAN, clients=3, passes_total=10, encrypted=True)
DIGEST = bytes(range(32))


def on_grid(values: np.ndarray) -> bool:
    units = values / SHARE_GRID
    return bool(np.array_equal(units, np.round(units)))


def test_the_split_source_draws_discrete_noise_as_a_function_of_the_release() -> None:
    noise = release_keyed_noise(SECRET, scope="s1/client0", split_noise=True)
    assert isinstance(noise, SplitReleaseKeyedNoise)
    assert type(release_keyed_noise(SECRET, scope="s", split_noise=False)) is ReleaseKeyedNoise
    first = noise.for_release(DIGEST).sample(4096, std=3.0)
    assert on_grid(first) and noise.private
    assert np.array_equal(first, noise.for_release(DIGEST).sample(4096, std=3.0))
    other = noise.for_release(part_key(DIGEST, 1)).sample(4096, std=3.0)
    assert abs(np.corrcoef(first, other)[0, 1]) < 0.1
    assert np.std(first) == pytest.approx(3.0, rel=0.05)
    # another scope (client) or the continuous source: independent draws
    elsewhere = SplitReleaseKeyedNoise(SECRET, scope="s1/client1").for_release(DIGEST)
    assert abs(np.corrcoef(first, elsewhere.sample(4096, std=3.0))[0, 1]) < 0.1
    continuous = ReleaseKeyedNoise(SECRET, scope="s1/client0").for_release(DIGEST)
    assert not on_grid(continuous.sample(64, std=3.0))
    with pytest.raises(RuntimeError, match="for a release only"):
        noise.sample(4, std=1.0)


def test_a_split_share_part_is_clipped_rounded_and_noised_on_the_grid() -> None:
    rng = np.random.default_rng(0)
    clean = rng.normal(size=(256, 16)).astype(np.float32)
    noise = SplitReleaseKeyedNoise(SECRET, scope="s1/client0")
    std = SPLIT.release_noise_std(16)
    args = dict(clip=1.0, noise_std=std, noise=noise, release=DIGEST)
    part0 = split_share_part(clean, part=0, **args)  # type: ignore[arg-type]
    assert on_grid(part0)
    assert np.array_equal(part0, split_share_part(clean, part=0, **args))  # type: ignore[arg-type]
    assert not np.array_equal(part0, split_share_part(clean, part=1, **args))  # type: ignore[arg-type]
    expected = privatize_on_grid(
        clean, clip=1.0, noise_std=std, noise=noise.for_release(part_key(DIGEST, 0))
    )
    assert np.array_equal(part0, expected)
    assert np.std(part0) == pytest.approx(std, rel=0.05)  # no clamp, whatever the std


def test_the_mechanism_covers_the_split_and_keeps_every_earlier_digest() -> None:
    plain = ReleaseMechanism.of(UNSPLIT, width=16, encoding="ckks")
    assert "split_noise" not in plain.canonical()  # the v1 description, byte for byte
    assert ReleaseMechanism.from_canonical(plain.canonical()) == plain
    split = ReleaseMechanism.of(SPLIT, width=16, encoding="ckks")
    assert '"split_noise":true' in split.canonical()
    assert ReleaseMechanism.from_canonical(split.canonical()) == split
    assert split.split_noise and split.digest != plain.digest
    assert split.noise_std == SPLIT.release_noise_std(16)
    assert split.ledger_noise_multiplier == split.noise_multiplier == 2.0
    assert "split_noise: False != True" in plain.differences(split)
