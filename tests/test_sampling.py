"""Sampling (SPEC D6): counter RNG, greedy, temperature / top-k / top-p, validation."""

import numpy as np
import pytest
import torch

from engine.sampling import sample, splitmix64, uniform, uniforms
from engine.types import check_options, new_seed

M = (1 << 64) - 1


def test_splitmix64_known_vectors():
    # The published splitmix64 stream seeded with 0: its first two outputs.
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def ref_u(seed, step, k):
    """Independent spelling of SPEC D6's u(seed, step, k) with explicit modular arithmetic."""
    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) % 2**64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
        return x ^ (x >> 31)
    return float(mix(mix(seed) ^ (step * 8 + k)) >> 40) / 2**24


@pytest.mark.parametrize("seed", [0, 1, 42, 2**63 - 1, 123456789012345])
def test_uniform_matches_independent_code(seed):
    for step in (0, 1, 7, 100, 2047):
        row = uniforms(seed, step)
        assert row.dtype == torch.float32
        for k in range(8):
            want = ref_u(seed, step, k)
            assert uniform(seed, step, k) == want
            assert float(row[k]) == want  # 24-bit values are exact in fp32
    table = uniforms(seed, 5, steps=4)
    assert torch.equal(table[2], uniforms(seed, 7))


def test_uniform_range_and_spread():
    u = uniforms(7, 0, steps=4000).flatten().numpy()
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005


def test_greedy_is_raw_argmax_with_low_index_ties():
    logits = torch.zeros(8, 1026)
    logits[0, 5] = logits[0, 3] = 2.0
    logits[1, 1025] = 1.0
    out = sample(logits, uniforms(0, 0), 0.0, 30, 0.8)
    assert out[0] == 3 and out[1] == 1025 and out[2] == 0


def ref_sample(logits, u, temperature, top_k, top_p):
    """Literal per-row reading of SPEC D6 in numpy float32."""
    out = []
    for row, uk in zip(logits.numpy().astype(np.float32), u.numpy()):
        x = row / np.float32(temperature)
        e = np.exp(x - x.max())
        p = (e / e.sum()).astype(np.float32)
        order = sorted(range(len(p)), key=lambda i: (-p[i], i))
        kept = order[:top_k] if 0 < top_k < len(p) else order
        if top_p < 1:
            m = np.array([p[i] for i in kept], dtype=np.float32)
            m = m / m.sum()
            run, n = np.float32(0), 0
            for n, mi in enumerate(m, 1):
                run = np.float32(run + mi)
                if run >= np.float32(top_p):
                    break
            kept = kept[:n]
        kept = sorted(kept)
        total = np.float32(sum(p[i] for i in kept))
        run, pick = np.float32(0), kept[-1]
        for i in kept:
            run = np.float32(run + p[i])
            if run / total > uk:
                pick = i
                break
        out.append(pick)
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 30, 0.8), (1.0, 0, 1.0), (1.3, 5, 1.0),
                                                      (0.5, 0, 0.5), (1.0, 1026, 0.95), (2.0, 3, 0.3)])
def test_sample_matches_literal_reference(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(3)
    for step in range(6):
        logits = torch.randn(8, 1026, generator=g) * 3
        u = uniforms(99, step)
        assert sample(logits, u, temperature, top_k, top_p).tolist() == ref_sample(logits, u, temperature, top_k, top_p)


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = torch.randn(8, 1026, generator=torch.Generator().manual_seed(1))
    greedy = logits.argmax(-1)
    for step in range(20):
        assert torch.equal(sample(logits, uniforms(5, step), 1.0, 1, 1.0), greedy)
        assert torch.equal(sample(logits, uniforms(5, step), 1.0, 0, 1e-6), greedy)


def test_top_k_ties_keep_lower_index():
    logits = torch.full((1, 1026), -30.0)
    logits[0, [10, 20, 30]] = 1.0  # three-way tie; top_k=2 keeps 10 and 20
    picks = {int(sample(logits, uniforms(1, s, 1), 1.0, 2, 1.0)) for s in range(200)}
    assert picks == {10, 20}


def test_top_p_keeps_shortest_prefix_reaching_mass():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.full((1, 1026), -1e4)
    logits[0, :4] = p.log()
    picks = {int(sample(logits, uniforms(2, s, 1), 1.0, 0, 0.8)) for s in range(300)}
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.8
    picks = {int(sample(logits, uniforms(2, s, 1), 1.0, 0, 0.81)) for s in range(300)}
    assert picks == {0, 1, 2}


def test_distribution_follows_probabilities():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.full((8, 1026), -1e4)
    logits[:, :4] = p.log()
    counts = np.zeros(4)
    for s in range(1500):
        counts += np.bincount(sample(logits, uniforms(11, s), 1.0, 0, 1.0).numpy(), minlength=4)
    freq = counts / counts.sum()
    assert np.abs(freq - p.numpy()).max() < 0.015


def test_same_seed_same_draws_other_seed_differs():
    logits = torch.randn(8, 1026, generator=torch.Generator().manual_seed(4))
    a = [sample(logits, uniforms(8, s), 0.9, 30, 0.9) for s in range(10)]
    b = [sample(logits, uniforms(8, s), 0.9, 30, 0.9) for s in range(10)]
    c = [sample(logits, uniforms(9, s), 0.9, 30, 0.9) for s in range(10)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_validation_messages():
    for bad in (-0.1, float("nan"), "hot", 2.01):
        with pytest.raises(ValueError, match="temperature"):
            check_options(bad, 30, 0.8)
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            check_options(0.8, 30, bad)
    for bad in (2.5, -1):
        with pytest.raises(ValueError, match="top_k"):
            check_options(0.8, bad, 0.8)
    check_options(0, 0, 1.0)
    check_options(2, 5000, 1.0)


def test_drawn_seeds_are_exact_in_the_browser():
    seeds = {new_seed() for _ in range(50)}
    assert len(seeds) == 50 and all(0 <= s < 2**31 for s in seeds)


def test_top_k_threshold_ties_fill_by_index():
    from engine.sampling import top_k_mask
    p = torch.zeros(2, 1026)
    p[0, 50] = 0.4
    p[0, [10, 20, 30]] = 0.2  # k=3: 50 is above the threshold, then the two lowest tied indices
    p[1, [7, 3, 900]] = 0.3
    mask = top_k_mask(p, 3)
    assert mask[0].nonzero().flatten().tolist() == [10, 20, 50]
    assert mask[1].nonzero().flatten().tolist() == [3, 7, 900]
    assert top_k_mask(p, 2)[1].nonzero().flatten().tolist() == [3, 7]


def test_kept_indices_are_the_masks_indices_in_ascending_order():
    """The fixed-shape index list `sample` builds (no host sync) against `nonzero`, including masks whose
    kept entries sit at the first and last index and next to each other."""
    from engine.sampling import kept_indices, top_k_mask
    gen = torch.Generator().manual_seed(5)
    for k in (1, 2, 30, 1025):
        for trial in range(20):
            p = torch.randint(0, 3, (8, 1026), generator=gen).float() if trial % 2 else torch.rand(8, 1026)
            p[trial % 8, [0, 1025]] = 9.0
            mask = top_k_mask(p, k)
            assert torch.equal(kept_indices(mask, k), mask.nonzero()[:, 1].view(8, k)), (k, trial)


def test_top_p_ties_order_by_lower_index():
    logits = torch.full((1, 1026), -1e4)
    logits[0, [40, 5]] = 0.0  # two equal halves: top_p 0.5 keeps only the lower index
    picks = {int(sample(logits, uniforms(3, s, 1), 1.0, 0, 0.5)) for s in range(100)}
    assert picks == {5}
    picks = {int(sample(logits, uniforms(3, s, 1), 1.0, 2, 0.5)) for s in range(100)}
    assert picks == {5}


def test_extreme_u_picks_kept_entries():
    logits = torch.full((2, 1026), float("-inf"))
    logits[:, [3, 700]] = torch.tensor([[0.0, 0.0], [5.0, -5.0]])
    top = torch.tensor([1 - 2.0 ** -24, 1 - 2.0 ** -24])
    assert sample(logits, top, 1.0, 0, 1.0).tolist() == [700, 700]
    assert sample(logits, torch.zeros(2), 1.0, 0, 1.0).tolist() == [3, 3]
    assert sample(logits, top, 1.0, 1, 1.0).tolist() == [3, 3]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 30, 0.8), (1.0, 50, 0.95), (0.7, 0, 0.9), (0.0, 30, 0.8)])
def test_agrees_with_kernel_reference_sampler(temperature, top_k, top_p):
    """The GPU sampler's sequential reference (kernels/reference.py) picks the same codes (SPEC D6)."""
    reference = pytest.importorskip("kernels.reference")
    g = torch.Generator().manual_seed(11)
    for step in range(8, 14):
        logits = torch.randn(8, 1026, generator=g) * 2.5
        ours = sample(logits, uniforms(77, step), temperature, top_k, top_p).tolist()
        assert ours == reference.sample_row_ref(logits, step=step, seed=77, temperature=temperature,
                                                top_k=top_k, top_p=top_p)
