"""Tests for secure/dp.py and secure/noise.py: clipping, sensitivity, noise, shared noise."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from randomgen import ChaCha
from scipy import stats

from secure import noise
from secure.dp import (
    affected_rows,
    clip_rows,
    effective_noise_multiplier,
    node_sensitivity,
    per_client_noise_std,
    privatize,
    row_count_sensitivity,
)
from secure.noise import GaussianNoise, NoiseSource, NotPrivateNoiseError, require_private_noise

# ------------------------------------------------------------------------------------------
# clipping
# ------------------------------------------------------------------------------------------


def test_clip_rows_bounds_every_row_exactly() -> None:
    rng = np.random.default_rng(0)
    for scale in (1e-6, 0.3, 1.0, 7.0, 1e6):
        m = rng.normal(size=(300, 17)) * scale * rng.exponential(size=(300, 1))
        for clip in (1e-3, 0.5, 1.0, 3.0):
            out = clip_rows(m, clip=clip)
            assert out.dtype == np.float64
            assert out.shape == m.shape
            assert np.all(np.linalg.norm(out, axis=1) <= clip)  # no tolerance


def test_clip_rows_leaves_short_rows_unchanged_and_keeps_direction() -> None:
    rng = np.random.default_rng(1)
    m = rng.normal(size=(200, 8))
    norms = np.linalg.norm(m, axis=1)
    clip = float(np.median(norms))
    out = clip_rows(m, clip=clip)
    short = norms <= clip
    assert np.array_equal(out[short], m[short])
    long_ = ~short
    assert np.allclose(np.linalg.norm(out[long_], axis=1), clip, rtol=1e-12)
    # same direction: positive multiple of the input row
    ratio = out[long_] / m[long_]
    assert np.allclose(ratio, ratio[:, :1])
    assert np.all(ratio > 0)


def test_clip_rows_zero_rows_exact_rows_and_idempotence() -> None:
    m = np.zeros((4, 3))
    m[1] = [3.0, 4.0, 0.0]  # norm 5
    m[2] = [0.6, 0.8, 0.0]  # norm exactly 1
    out = clip_rows(m, clip=1.0)
    assert np.array_equal(out[0], np.zeros(3))
    assert np.array_equal(out[3], np.zeros(3))
    assert np.allclose(out[1], [0.6, 0.8, 0.0])
    assert np.array_equal(out[2], m[2])
    assert np.array_equal(clip_rows(out, clip=1.0), out)


def test_clip_rows_does_not_modify_input_and_accepts_float32() -> None:
    m = np.full((2, 2), 10.0, dtype=np.float32)
    before = m.copy()
    out = clip_rows(m, clip=1.0)
    assert np.array_equal(m, before)
    assert out.dtype == np.float64


def test_clip_rows_empty_matrix() -> None:
    assert clip_rows(np.zeros((0, 5)), clip=1.0).shape == (0, 5)


@pytest.mark.parametrize("clip", [0.0, -1.0, math.inf, math.nan])
def test_clip_rows_rejects_bad_clip(clip: float) -> None:
    with pytest.raises(ValueError):
        clip_rows(np.ones((2, 2)), clip=clip)


def test_clip_rows_rejects_bad_matrices() -> None:
    with pytest.raises(ValueError):
        clip_rows(np.ones(3), clip=1.0)
    with pytest.raises(ValueError):
        clip_rows(np.array([[1.0, np.nan]]), clip=1.0)
    with pytest.raises(ValueError):
        clip_rows(np.array([[1.0, np.inf]]), clip=1.0)
    with pytest.raises(TypeError):
        clip_rows(np.array([["a", "b"]]), clip=1.0)


# ------------------------------------------------------------------------------------------
# sensitivity: formula values
# ------------------------------------------------------------------------------------------


def test_affected_rows_values() -> None:
    assert affected_rows(occurrence_cap=3, depth=2) == 16
    assert affected_rows(occurrence_cap=1, depth=1) == 2
    assert affected_rows(occurrence_cap=0, depth=4) == 1
    assert affected_rows(occurrence_cap=5, depth=0) == 1


def test_node_sensitivity_values() -> None:
    # the calibration prototype's literal recipe: h=2, c=3, C=1 -> Delta = 8
    assert node_sensitivity(clip=1.0, occurrence_cap=3, depth=2) == pytest.approx(8.0)
    assert node_sensitivity(clip=1.0, occurrence_cap=1, depth=1) == pytest.approx(2 * math.sqrt(2))
    assert node_sensitivity(clip=0.5, occurrence_cap=2, depth=3) == pytest.approx(
        2 * 0.5 * math.sqrt(27)
    )
    assert node_sensitivity(clip=2.0, occurrence_cap=7, depth=0) == pytest.approx(4.0)
    # max_rows can only tighten
    assert node_sensitivity(clip=1.0, occurrence_cap=3, depth=2, max_rows=9) == pytest.approx(6.0)
    assert node_sensitivity(clip=1.0, occurrence_cap=3, depth=2, max_rows=10**6) == pytest.approx(8)


def test_add_remove_is_not_smaller_than_replace_here() -> None:
    # Every affected row exists under both datasets, so each may move by 2C (docs/privacy.md).
    for c, h in [(0, 0), (1, 1), (3, 2), (2, 3)]:
        r = node_sensitivity(clip=1.0, occurrence_cap=c, depth=h, adjacency="replace")
        a = node_sensitivity(clip=1.0, occurrence_cap=c, depth=h, adjacency="add-remove")
        assert a == r


def test_row_count_sensitivity_values() -> None:
    assert row_count_sensitivity(clip=1.0, max_rows=265) == pytest.approx(2 * math.sqrt(265))
    assert row_count_sensitivity(clip=0.5, max_rows=1) == pytest.approx(1.0)


def test_sensitivity_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        node_sensitivity(clip=1.0, occurrence_cap=-1, depth=2)
    with pytest.raises(ValueError):
        node_sensitivity(clip=0.0, occurrence_cap=1, depth=2)
    with pytest.raises(TypeError):
        node_sensitivity(clip=1.0, occurrence_cap=1.5, depth=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        node_sensitivity(clip=1.0, occurrence_cap=1, depth=2, adjacency="edge")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        row_count_sensitivity(clip=1.0, max_rows=0)
    with pytest.raises(TypeError):
        node_sensitivity(1.0, 1, 2)  # type: ignore[misc]  # keyword-only


# ------------------------------------------------------------------------------------------
# sensitivity: a brute-force check of the derivation on a tiny message-passing model
# ------------------------------------------------------------------------------------------
# Layer l maps rows S[l-1] -> rows S[l] (S[l] subset of S[l-1]):
#   H_l[u] = tanh(W_l @ mean(H_{l-1}[u], H_{l-1}[w] for w in N_l(u))) + a * P @ H_0[u]
# (self-loop plus a GCNII-style initial residual). The release is clip_rows(H_h[S[h]]).


def _forward(x, layers, rows_per_layer, weights, proj, residual):
    h0 = {u: np.tanh(proj @ x[u]) for u in rows_per_layer[0]}  # row-wise input encoder
    h = h0
    for l_idx, nbrs in enumerate(layers, start=1):
        w = weights[l_idx - 1]
        h = {
            u: np.tanh(w @ np.mean([h[u]] + [h[v] for v in nbrs.get(u, [])], axis=0))
            + residual * h0[u]
            for u in rows_per_layer[l_idx]
        }
    last = rows_per_layer[-1]
    return np.stack([h[u] for u in last])


def _capped_sampling(rng, adj, batch, *, depth, fanout, cap):
    """Backwards layer-wise sampling with the occurrence cap enforced per layer."""
    rows = [sorted(batch)]
    layers = []
    for _ in range(depth):
        targets = rows[0]
        drawn = defaultdict(int)
        nbrs = {}
        for u in rng.permutation(targets):
            cand = [w for w in adj[int(u)] if w != u]
            rng.shuffle(cand)
            picked = []
            for w in cand:
                if len(picked) == fanout:
                    break
                if drawn[w] < cap:
                    drawn[w] += 1
                    picked.append(w)
            nbrs[int(u)] = picked
        assert max(drawn.values(), default=0) <= cap
        layers.insert(0, nbrs)
        rows.insert(0, sorted(set(targets) | {w for p in nbrs.values() for w in p}))
    return layers, rows


@pytest.mark.parametrize(("cap", "depth"), [(1, 1), (2, 2), (3, 2), (1, 3)])
def test_bound_holds_on_random_capped_samples(cap: int, depth: int) -> None:
    rng = np.random.default_rng(10 * cap + depth)
    n, d_in, width = 120, 6, 5
    # a graph with hubs: the fanout does not bound how often a hub is drawn, the cap does
    adj = {u: set() for u in range(n)}
    for u in range(n):
        for w in rng.choice(n, size=4, replace=False):
            if w != u:
                adj[u].add(int(w))
                adj[int(w)].add(u)
    for hub in range(3):
        for u in range(n):
            if u != hub:
                adj[hub].add(u)
                adj[u].add(hub)
    adj = {u: sorted(v) for u, v in adj.items()}
    clip = 0.3
    bound_rows = affected_rows(occurrence_cap=cap, depth=depth)
    delta_ = node_sensitivity(clip=clip, occurrence_cap=cap, depth=depth)
    worst = 0
    for trial in range(6):
        batch = rng.choice(n, size=12, replace=False).tolist()
        layers, rows = _capped_sampling(rng, adj, batch, depth=depth, fanout=3, cap=cap)
        weights = [rng.normal(size=(width, width)) * 2 for _ in range(depth)]
        proj = rng.normal(size=(width, d_in))
        x = rng.normal(size=(n, d_in))
        base = clip_rows(_forward(x, layers, rows, weights, proj, 0.2), clip=clip)
        for v in [*rows[0][:: max(1, len(rows[0]) // 25)], 0, 1, 2]:
            if v not in rows[0]:
                continue
            x2 = x.copy()
            x2[v] = rng.normal(size=d_in) * 5
            out = clip_rows(_forward(x2, layers, rows, weights, proj, 0.2), clip=clip)
            changed = int(np.sum(np.any(out != base, axis=1)))
            worst = max(worst, changed)
            assert changed <= bound_rows, (trial, v, changed, bound_rows)
            assert np.linalg.norm(out - base) <= delta_ + 1e-12
    assert worst >= 2  # the check is not vacuous


@pytest.mark.parametrize(("cap", "depth"), [(1, 2), (2, 2), (3, 1), (2, 3)])
def test_bound_is_attained_by_a_tree(cap: int, depth: int) -> None:
    """A computation graph in which v is drawn by `cap` fresh targets at every layer, and so is
    every node it reached: exactly (cap + 1) ** depth rows change, so the bound is tight."""
    nodes = [0]
    reached = [0]
    layers = []
    for _ in range(depth):
        nbrs = {}
        new_reached = list(reached)
        for w in reached:
            for _ in range(cap):
                t = len(nodes)
                nodes.append(t)
                nbrs[t] = [w]
                new_reached.append(t)
        layers.append(nbrs)
        reached = new_reached
    rows = [nodes] * (depth + 1)  # every node is computed at every layer (self-loops)
    rng = np.random.default_rng(0)
    width = 4
    weights = [rng.normal(size=(width, width)) for _ in range(depth)]
    proj = rng.normal(size=(width, 3))
    x = rng.normal(size=(len(nodes), 3))
    base = clip_rows(_forward(x, layers, rows, weights, proj, 0.0), clip=1.0)
    x2 = x.copy()
    x2[0] += 1.0
    out = clip_rows(_forward(x2, layers, rows, weights, proj, 0.0), clip=1.0)
    changed = int(np.sum(np.any(out != base, axis=1)))
    assert changed == affected_rows(occurrence_cap=cap, depth=depth) == len(reached)


def test_weights_trained_on_features_void_the_occurrence_bound() -> None:
    """Documenting the assumption: if the weights below the release depend on the private
    features (one local gradient-like step), one node's change moves every row."""
    rng = np.random.default_rng(3)
    n, d = 30, 4
    x = rng.normal(size=(n, d))
    layers = [{u: [(u + 1) % n] for u in range(n)}]  # cap 1, depth 1
    rows = [list(range(n))] * 2
    proj = np.eye(d)

    def release(feats):
        w = np.eye(d) - 0.1 * feats.T @ feats / n  # "trained" on the clean features
        return clip_rows(_forward(feats, layers, rows, [w], proj, 0.0), clip=10.0)

    x2 = x.copy()
    x2[5] += 3.0
    changed = int(np.sum(np.any(release(x2) != release(x), axis=1)))
    assert changed > affected_rows(occurrence_cap=1, depth=1)
    assert changed == n  # only row_count_sensitivity covers this


# ------------------------------------------------------------------------------------------
# noise
# ------------------------------------------------------------------------------------------


def test_gaussian_noise_is_a_noise_source() -> None:
    assert isinstance(GaussianNoise(), NoiseSource)


def test_privatize_noise_has_the_requested_std() -> None:
    rng = np.random.default_rng(5)
    m = rng.normal(size=(1000, 400)) * 3
    clip, std = 1.5, 2.7
    out = privatize(m, clip=clip, noise_std=std, noise=GaussianNoise())
    assert out.dtype == np.float64
    noise = out - clip_rows(m, clip=clip)
    emp_std = noise.std()
    # 400k samples: the relative s.e. of the std is ~0.11%; allow 2%
    assert emp_std == pytest.approx(std, rel=0.02)
    assert abs(noise.mean()) < 5 * std / math.sqrt(noise.size)
    # and it looks Gaussian (seeded for a deterministic test)
    seeded = GaussianNoise(seed=123).sample(20000, std=std)
    assert stats.kstest(seeded, "norm", args=(0.0, std)).pvalue > 1e-3


def test_privatize_without_noise_is_clipping() -> None:
    m = np.array([[3.0, 4.0], [0.1, 0.0]])
    out = privatize(m, clip=1.0, noise_std=0.0, noise=GaussianNoise(seed=0))
    assert np.array_equal(out, clip_rows(m, clip=1.0))


def test_unseeded_noise_differs_and_seeded_noise_reproduces() -> None:
    a, b = GaussianNoise(), GaussianNoise()
    assert not a.reproducible
    x1, x2, y = a.sample((64, 8), std=1.0), a.sample((64, 8), std=1.0), b.sample((64, 8), std=1.0)
    assert not np.array_equal(x1, y)
    assert not np.array_equal(x1, x2)  # fresh stream per call
    s1, s2 = GaussianNoise(seed=42), GaussianNoise(seed=42)
    assert s1.reproducible
    assert np.array_equal(s1.sample((5, 3), std=2.0), s2.sample((5, 3), std=2.0))
    assert np.array_equal(s1.sample(7, std=1.0), s2.sample(7, std=1.0))
    assert not np.array_equal(GaussianNoise(seed=1).sample(5, std=1), s1.sample(5, std=1))
    assert s1.sample((2, 2), std=1.0).dtype == np.float64


def test_noise_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        GaussianNoise().sample(3, std=-1.0)
    with pytest.raises(ValueError):
        GaussianNoise().sample(3, std=math.nan)
    with pytest.raises(ValueError):
        GaussianNoise(seed=-1)
    with pytest.raises(TypeError):
        GaussianNoise(seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        privatize(np.ones((2, 2)), clip=1.0, noise_std=-0.1, noise=GaussianNoise())


def test_unseeded_noise_is_private_and_runs_on_chacha20() -> None:
    noise = GaussianNoise()
    assert noise.private and not noise.reproducible
    bit_generators = [noise._generator().bit_generator for _ in range(2)]
    for bg in bit_generators:
        assert isinstance(bg, ChaCha)
        assert bg.state["state"]["rounds"] == 20
    # a fresh 256-bit key per call
    keys = [tuple(bg.state["state"]["keysetup"]) for bg in bit_generators]
    assert keys[0] != keys[1]


def test_unseeded_noise_is_keyed_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    key = 0x0123456789ABCDEF_FEDCBA9876543210_0F1E2D3C4B5A6978_8796A5B4C3D2E1F0
    calls: list[int] = []

    def randbits(k: int) -> int:
        calls.append(k)
        return key

    monkeypatch.setattr(noise.secrets, "randbits", randbits)
    got = GaussianNoise().sample((300, 7), std=1.5)
    assert calls == [256]
    expected = noise._standard_normal(np.random.Generator(ChaCha(key=key, counter=0)), (300, 7))
    assert np.array_equal(got, 1.5 * expected)


def test_randomgen_chacha_is_the_chacha20_keystream() -> None:
    # RFC 7539 (ChaCha20), appendix A.1, test vector 1: all-zero key, nonce and counter.
    first_block = (
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    )
    raw = ChaCha(key=0, counter=0, rounds=20).random_raw(8)
    assert raw.astype("<u8").tobytes().hex() == first_block


def test_seeded_noise_is_not_private() -> None:
    noise = GaussianNoise(seed=5)
    assert noise.reproducible and not noise.private
    assert isinstance(noise._generator().bit_generator, np.random.PCG64DXSM)


def test_noise_mean_and_std_on_a_large_sample() -> None:
    n, std = 2_000_000, 3.0
    x = GaussianNoise().sample(n, std=std)
    assert x.shape == (n,) and x.dtype == np.float64
    assert abs(x.std() - std) < 5 * std / math.sqrt(2 * n)
    assert abs(x.mean()) < 5 * std / math.sqrt(n)
    # the tail (re-drawn at full resolution) has the right weight
    for t in (2.0, noise._TAIL_START, 4.5):
        p = 2 * stats.norm.sf(t)
        frac = float(np.mean(np.abs(x) >= t * std))
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), t


def test_seeded_noise_is_gaussian_in_bulk_and_tail() -> None:
    z = GaussianNoise(seed=11).sample(1_000_000, std=1.0)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    tail = z[z >= noise._TAIL_START]
    assert tail.size > 100
    assert stats.kstest(tail, stats.truncnorm(noise._TAIL_START, np.inf).cdf).pvalue > 1e-3
    assert np.mean(z < 0) == pytest.approx(0.5, abs=5 * 0.5 / math.sqrt(z.size))


@pytest.mark.parametrize("start", [noise._TAIL_START, 8.0])
def test_gaussian_tail_is_the_conditional_gaussian(start: float) -> None:
    gen = np.random.Generator(np.random.PCG64DXSM(21))
    t = noise._gaussian_tail(gen, 50_000, start)
    assert t.min() >= start
    assert stats.kstest(t, stats.truncnorm(start, np.inf).cdf).pvalue > 1e-3


def test_uniform_open_is_uniform_with_fine_resolution_near_zero() -> None:
    gen = np.random.Generator(np.random.PCG64DXSM(4))
    u = noise._uniform_open(gen, 1_000_000)
    assert u.min() > 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    # binade j = floor(-log2 u) has probability 2^-(j+1)
    binade = np.floor(-np.log2(u)).astype(int)
    counts = np.bincount(binade, minlength=8)[:8]
    expected = u.size * 0.5 ** np.arange(1, 9)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_uniform_open_counts_leading_zeros_across_words() -> None:
    class Scripted:
        """Two all-zero 32-bit words, then 1 (31 more leading zeros), mantissa 2^51."""

        def __init__(self) -> None:
            self.words = [np.zeros(3, dtype=np.uint32)] * 2 + [np.ones(3, dtype=np.uint32)]

        def integers(self, low: int, high: int, *, size: int, dtype: type) -> np.ndarray:
            if dtype is np.uint32:
                return self.words.pop(0)[:size]
            return np.full(size, 2**51, dtype=np.int64)

    u = noise._uniform_open(Scripted(), 3)  # type: ignore[arg-type]
    # e = 32 + 32 + 31 leading zeros: U = 1.5 * 2^-96
    assert np.array_equal(u, np.full(3, 1.5 * 2.0**-96))


def test_require_private_noise() -> None:
    assert require_private_noise(GaussianNoise()) is True
    with pytest.raises(NotPrivateNoiseError, match="not private"):
        require_private_noise(GaussianNoise(seed=1))
    assert require_private_noise(GaussianNoise(seed=1), allow_reproducible=True) is False

    class Other(NoiseSource):
        def sample(self, shape: int | tuple[int, ...], *, std: float) -> np.ndarray:
            return np.zeros(shape)

    assert not Other().private  # a source that does not say so is not private
    with pytest.raises(NotPrivateNoiseError):
        require_private_noise(Other())


# ------------------------------------------------------------------------------------------
# noise shared between clients
# ------------------------------------------------------------------------------------------


def test_per_client_noise_std_values() -> None:
    assert per_client_noise_std(
        noise_multiplier=2.0, sensitivity=8.0, clients=4, shared=False
    ) == pytest.approx(16.0)
    assert per_client_noise_std(
        noise_multiplier=2.0, sensitivity=8.0, clients=4, shared=True
    ) == pytest.approx(8.0)
    assert per_client_noise_std(
        noise_multiplier=2.0, sensitivity=8.0, clients=1, shared=True
    ) == pytest.approx(16.0)
    with pytest.raises(ValueError):
        per_client_noise_std(noise_multiplier=1.0, sensitivity=1.0, clients=0, shared=True)


def test_effective_noise_multiplier_values() -> None:
    assert effective_noise_multiplier(noise_multiplier=3.0, clients=3, shared=False) == 3.0
    assert effective_noise_multiplier(noise_multiplier=3.0, clients=3, shared=True) == (
        pytest.approx(3.0 * math.sqrt(2 / 3))
    )
    assert effective_noise_multiplier(noise_multiplier=3.0, clients=2, shared=True) == (
        pytest.approx(3.0 / math.sqrt(2))
    )
    assert effective_noise_multiplier(
        noise_multiplier=3.0, clients=4, shared=True, colluding=3
    ) == pytest.approx(1.5)
    assert effective_noise_multiplier(noise_multiplier=3.0, clients=1, shared=True) == 3.0
    with pytest.raises(ValueError):
        effective_noise_multiplier(noise_multiplier=3.0, clients=3, shared=True, colluding=3)


def test_shared_noise_sum_and_what_a_peer_sees() -> None:
    """Each of M shares carries sigma^2 / M: the sum carries sigma^2; a peer that removes its
    own share is left with sigma^2 (M - 1) / M, i.e. multiplier z * sqrt((M - 1) / M)."""
    z, sens, m, n = 1.5, 2.0, 4, 200_000
    std = per_client_noise_std(noise_multiplier=z, sensitivity=sens, clients=m, shared=True)
    noise = GaussianNoise(seed=9)
    shares = [noise.sample(n, std=std) for _ in range(m)]
    total = np.sum(shares, axis=0)
    assert total.std() == pytest.approx(z * sens, rel=0.01)
    seen_by_peer = total - shares[0]
    z_eff = effective_noise_multiplier(noise_multiplier=z, clients=m, shared=True)
    assert seen_by_peer.std() / sens == pytest.approx(z_eff, rel=0.01)
