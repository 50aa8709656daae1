"""The batched decode kernels (kernels/batch.py) on the CPU interpreter: numerics against float64 / the
D6 reference with NaN-poisoned outputs, and batch invariance — a row's result is bit for bit the same
whatever the batch size and whatever the other rows hold."""

import pytest
import torch

from engine import sampling
from kernels import ops
from kernels import reference as ref
from tests import interp_rounding
from tests.helpers import SAMPLER_TAKES, nan_like

interp_rounding.install()

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
BUCKETS = (1, 4, 8, 16)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def gemm_inputs(m, n, k, fp8, gen=None):
    """(x, w, x_scale, w_scale): bf16, or FP8 quantised outside the kernel with per-row / per-channel scales."""
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * 0.05
    if not fp8:
        return x.to(BF16), w.to(BF16), None, None
    w8, ws = ops.quantize_weight_fp8(w)
    xs = (x.abs().amax(dim=1) / 448.0).clamp(min=1e-12)
    return (x / xs[:, None]).clamp(-448, 448).to(FP8), w8, xs, ws


def product(x, w, xs=None, ws=None, residual=None):
    """float64 x·wᵀ (· scales), rounded to bf16 before the residual add — the kernel's contract."""
    y = x.double() @ w.double().T
    if ws is not None:
        y = y * ws.double()[None, :] * xs.double()[:, None]
    if residual is not None:
        y = y.to(BF16).double() + residual.double()
    return y


# ---------------------------------------------------------------------------------------------- skinny GEMM
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_skinny_gemm_matches_float64(fp8, m):
    n, k = 100, 300                     # neither is a multiple of the tile: masked edges, several K steps
    x, w, xs, ws = gemm_inputs(m, n, k, fp8)
    y = ops.skinny_gemm(x, w, w_scale=ws, x_scale=xs, out=nan_like((m, n)))
    want = product(x, w, xs, ws)
    assert not torch.isnan(y.float()).any()
    torch.testing.assert_close(y.double(), want, rtol=2 ** -8, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
def test_skinny_gemm_residual_in_place(fp8):
    m, n, k = 3, 70, 130
    x, w, xs, ws = gemm_inputs(m, n, k, fp8)
    r = torch.randn(m, n).to(BF16)
    want = product(x, w, xs, ws, residual=r)
    ops.skinny_gemm(x, w, w_scale=ws, x_scale=xs, out=r, residual=r)
    torch.testing.assert_close(r.double(), want, rtol=2 ** -8, atol=2e-2)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
def test_skinny_gemm_row_is_independent_of_batch_size_and_neighbours(fp8):
    """Row i of Y is bit for bit the same for M = 1, 4, 8 and 16, and when the other rows hold other data."""
    n, k = 72, 520
    gen = torch.Generator().manual_seed(3)
    x, w, xs, ws = gemm_inputs(16, n, k, fp8, gen)
    other, _, other_s, _ = gemm_inputs(16, n, k, fp8, gen)
    full = ops.skinny_gemm(x, w, w_scale=ws, x_scale=xs)
    for m in BUCKETS:
        y = ops.skinny_gemm(x[:m], w, w_scale=ws, x_scale=None if xs is None else xs[:m])
        assert torch.equal(y.view(torch.int16), full[:m].view(torch.int16)), f"M = {m}"
    for i in (0, 7, 15):
        mixed, mixed_s = other.clone(), None if other_s is None else other_s.clone()
        mixed[i] = x[i]
        if mixed_s is not None:
            mixed_s[i] = xs[i]
        y = ops.skinny_gemm(mixed, w, w_scale=ws, x_scale=mixed_s)
        assert torch.equal(y[i].view(torch.int16), full[i].view(torch.int16)), f"row {i} among other rows"


def split_scratch(n):
    part, count = ops.skinny_gemm_scratch(n, "cpu")
    part.fill_(float("nan"))                            # every partial is written before it is read
    return part, count


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
def test_skinny_gemm_split_k_matches_float64_and_is_batch_invariant(fp8):
    """The split-K variant (o_proj, down): float64 numerics with the residual, K = 1000 giving a partial
    and an empty split; row i bit for bit the same for M = 1, 4, 8, 16; ticket counters back at zero."""
    n, k = 72, 1000
    gen = torch.Generator().manual_seed(4)
    x, w, xs, ws = gemm_inputs(16, n, k, fp8, gen)
    r = torch.randn(16, n, generator=gen).to(BF16)
    scratch = split_scratch(n)
    full = ops.skinny_gemm(x, w, w_scale=ws, x_scale=xs, residual=r, scratch=scratch, out=nan_like((16, n)))
    assert not torch.isnan(full.float()).any() and not scratch[1].any()
    want = product(x, w, xs, ws, residual=r)
    torch.testing.assert_close(full.double(), want, rtol=2 ** -8, atol=2e-2)
    for m in BUCKETS:
        y = ops.skinny_gemm(x[:m], w, w_scale=ws, x_scale=None if xs is None else xs[:m], residual=r[:m],
                            scratch=scratch)
        assert torch.equal(y.view(torch.int16), full[:m].view(torch.int16)), f"M = {m}"


# ---------------------------------------------------------------------------------------------- attention
def batch_cache(slots, kv_heads, max_pos, d):
    kc = nan_like((slots, kv_heads, max_pos, d))         # NaN beyond each take's length: must never be read
    vc = nan_like((slots, kv_heads, max_pos, d))
    return kc, vc


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 16), (8, 2, 128)])
def test_decode_attention_batch_per_sequence_lengths(heads, kv_heads, d):
    lens = [1, 37, 130, 64]
    slots = [2, 0, 3, 1]                                # rows need not sit in their own slot number
    kc, vc = batch_cache(4, kv_heads, 136, d)
    for slot, length in zip(slots, lens):
        kc[slot, :, :length] = torch.randn(kv_heads, length, d).to(BF16)
        vc[slot, :, :length] = torch.randn(kv_heads, length, d).to(BF16)
    q = torch.randn(len(lens), heads, d).to(BF16)
    out = ops.decode_attention_batch(q, kc, vc, torch.tensor(slots, dtype=torch.int32),
                                     torch.tensor(lens, dtype=torch.int32), out=nan_like((len(lens), heads, d)))
    assert not torch.isnan(out.float()).any()
    for b, (slot, length) in enumerate(zip(slots, lens)):
        want = ref.attention_ref(q[b:b + 1], kc[slot], vc[slot], torch.tensor([length - 1]))[0]
        torch.testing.assert_close(out[b].double(), want, rtol=2 ** -7, atol=1e-2)
        # Batch invariance: the same take decoded alone by the one-take kernel gives the same bits.
        alone = ops.decode_attention(q[b], kc[slot], vc[slot], torch.tensor([length - 1], dtype=torch.int32))
        assert torch.equal(out[b].view(torch.int16), alone.view(torch.int16)), f"take {b}"


# ---------------------------------------------------------------------------------------------- sampler
def run_batch(logits, takes, hidden=24):
    b = len(takes)
    embed = torch.randn(8 * 1026, hidden).to(BF16)
    state, params = ops.sampler_states([t[3] for t in takes], [t[1] for t in takes], [t[0] for t in takes],
                                       [t[2] for t in takes], "cpu")
    for i, (_, _, _, _, step, countdown, done) in enumerate(takes):
        state[i, 0], state[i, 3], state[i, 4] = step, countdown, done
    max_rows = max(t[4] for t in takes) + 3
    rows = torch.full((b, max_rows, 8), -1, dtype=torch.int32)
    x = nan_like((b, hidden))
    ops.sample_batch(logits, embed, state, params, rows, x)
    return rows, state, x, embed


def test_batched_sampler_matches_d6_per_take():
    gen = torch.Generator().manual_seed(11)
    spread = torch.tensor([1.0, 3.0, 2.0, 5.0, 1.0])[:, None, None]
    logits = torch.randn(len(SAMPLER_TAKES), 8, 1026, generator=gen) * spread
    logits[2, 0, 1025] = 30.0                           # take 2 draws EOC on codebook 0 (no effect: in its tail)
    rows, state, x, embed = run_batch(logits, SAMPLER_TAKES)
    for b, (temperature, top_k, top_p, seed, step, countdown, done) in enumerate(SAMPLER_TAKES):
        want = ref.sample_row_ref(logits[b], step=step, seed=seed, temperature=temperature, top_k=top_k,
                                  top_p=top_p)
        assert rows[b, step].tolist() == want, b
        engine_row = sampling.sample(logits[b], sampling.uniforms(seed, step), temperature, top_k, top_p)
        engine_row[step + 1:] = 1024                    # the delay window (D5)
        assert rows[b, step].tolist() == engine_row.tolist(), b
        assert (rows[b, :step] == -1).all() and (rows[b, step + 1:] == -1).all(), "only row `step` is written"
        assert int(state[b, 0]) == step + 1
        assert (int(state[b, 3]), int(state[b, 4])) == ref.stop_state_ref(step, want[0], countdown, done), b
        emb = sum(embed[c + 1026 * k].float() for k, c in enumerate(want))
        assert torch.equal(x[b], emb.to(BF16)), b


def test_batched_sampler_row_equals_the_one_take_kernel():
    """Each take in a batch samples exactly what the one-take sampler gives it alone."""
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(len(SAMPLER_TAKES), 8, 1026, generator=gen) * 2
    rows, state, x, embed = run_batch(logits, SAMPLER_TAKES)
    for b, (temperature, top_k, top_p, seed, step, countdown, done) in enumerate(SAMPLER_TAKES):
        one_state, one_params = ops.sampler_state(seed, top_k, temperature, top_p, "cpu")
        one_state[0], one_state[3], one_state[4] = step, countdown, done
        one_rows = torch.full(rows.shape[1:], -1, dtype=torch.int32)
        one_x = nan_like((x.shape[1],))
        ops.sample(logits[b], embed, one_state, one_params, one_rows, one_x)
        assert torch.equal(rows[b], one_rows) and torch.equal(state[b], one_state), b
        assert torch.equal(x[b].view(torch.int16), one_x.view(torch.int16)), b


def test_batched_sampler_eoc_starts_one_takes_tail_only():
    """EOC on codebook 0 at step ≥ 8 starts the 6-row tail of that take; the neighbour is untouched."""
    logits = torch.zeros(2, 8, 1026)
    logits[:, :, 5] = 4.0
    logits[0, 0, 1025] = 9.0
    takes = [(0.0, 30, 0.8, 1, 12, -1, 0), (0.0, 30, 0.8, 1, 12, -1, 0)]
    rows, state, _, _ = run_batch(logits, takes)
    assert rows[0, 12, 0] == 1025 and rows[1, 12, 0] == 5
    assert state[0, 3:].tolist() == [6, 0] and state[1, 3:].tolist() == [-1, 0]


# ---------------------------------------------------------------------------------------------- cubin path
def test_committed_manifests_serve_every_batch_op():
    """The cubin runtime's copy of ops (kernels.runtime.cubin_ops) finds a committed cubin, per arch, for
    each batch op call (constexprs, warps, stages, pointer dtypes) and gives the same bits as ops."""
    from kernels import manifest as mf
    from kernels.runtime import InterpretedKernels, cubin_ops

    x, w, xs, ws = gemm_inputs(4, 80, 144, True)      # K and N multiples of 16, as the cubins assume
    xb, wb, _, _ = gemm_inputs(4, 80, 144, False)
    kc, vc = batch_cache(2, 2, 40, 16)
    kc[:, :, :33] = torch.randn(2, 2, 33, 16).to(BF16)
    vc[:, :, :33] = torch.randn(2, 2, 33, 16).to(BF16)
    q = torch.randn(2, 4, 16).to(BF16)
    slots, lens = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([33, 5], dtype=torch.int32)
    logits = torch.randn(2, 8, 1026)
    takes = [(0.8, 30, 0.8, 1, 9, -1, 0), (0.0, 30, 0.8, 2, 2, -1, 0)]
    r = torch.randn(4, 80).to(BF16)

    def run(o):
        rows_x = run_batch_with(o, logits, takes)
        scratch = o.skinny_gemm_scratch(80, "cpu")
        return [o.skinny_gemm(x, w, w_scale=ws, x_scale=xs), o.skinny_gemm(xb, wb, residual=r.clone()),
                o.skinny_gemm(x, w, w_scale=ws, x_scale=xs, residual=r.clone()), o.skinny_gemm(xb, wb),
                o.skinny_gemm(xb, wb, residual=r.clone(), scratch=scratch),
                o.skinny_gemm(x, w, w_scale=ws, x_scale=xs, residual=r.clone(), scratch=scratch),
                o.decode_attention_batch(q, kc, vc, slots, lens), *rows_x]

    want = run(ops)
    for cc in mf.TARGETS:
        kernels = InterpretedKernels(mf.load(cc))
        got = run(cubin_ops(kernels))
        assert all(torch.equal(a, b) for a, b in zip(got, want)), mf.TARGETS[cc]
        assert {"gemm_skinny_w8a8", "gemm_skinny_bf16_res", "gemm_skinny_w8a8_res", "gemm_skinny_bf16",
                "gemm_skinny_bf16_res_split", "gemm_skinny_w8a8_res_split", "decode_attn_batch_d16",
                "attn_combine_d16", "sample_embed_batch"} == set(kernels.launches)


def run_batch_with(o, logits, takes, hidden=32):
    gen = torch.Generator().manual_seed(5)
    embed = torch.randn(8 * 1026, hidden, generator=gen).to(BF16)
    state, params = o.sampler_states([t[3] for t in takes], [t[1] for t in takes], [t[0] for t in takes],
                                     [t[2] for t in takes], "cpu")
    for i, t in enumerate(takes):
        state[i, 0] = t[4]
    rows = torch.full((len(takes), 12, 8), -1, dtype=torch.int32)
    x = o.sample_batch(logits, embed, state, params, rows, nan_like((len(takes), hidden)))
    return rows, state, x
