"""The kernels the cubin backend's batched step adds on the CPU interpreter: the W8A16 skinny GEMM
(FP8 weight, BF16 activations: o_proj on the FP8 path), the skinny GEMM with fp32 output (the batched audio
head) and the batched q/k norm + RoPE + KV write with a slot and a position per row. Numerics against float64
with NaN-poisoned outputs, and batch invariance: a row's result is the same bits whatever the batch holds."""

import pytest
import torch

from kernels import ops
from kernels import reference as ref
from tests import interp_rounding

interp_rounding.install()

BF16 = torch.bfloat16
BUCKETS = (1, 4, 8, 16)


def nan_like(shape, dtype=BF16):
    return torch.full(shape, float("nan"), dtype=dtype)


def bits(t):
    return t.view(torch.int16) if t.dtype == BF16 else t.view(torch.int32)


# ---------------------------------------------------------------------------------------------- W8A16 GEMM
def w8a16_inputs(m, n, k, gen):
    x = torch.randn(m, k, generator=gen).to(BF16)
    w8, ws = ops.quantize_weight_fp8(torch.randn(n, k, generator=gen) * 0.05)
    return x, w8, ws


def test_w8a16_split_k_gemm_matches_float64_and_is_batch_invariant():
    """y = x · (w8 · scale)ᵀ rounded to bf16, plus the residual, with K = 1000 giving a partial and an empty
    split; row i bit for bit the same for M = 1, 4, 8, 16 and among other rows; ticket counters back at 0."""
    n, k = 72, 1000
    gen = torch.Generator().manual_seed(5)
    x, w8, ws = w8a16_inputs(16, n, k, gen)
    r = torch.randn(16, n, generator=gen).to(BF16)
    part, count = ops.skinny_gemm_scratch(n, "cpu")
    part.fill_(float("nan"))
    full = ops.skinny_gemm(x, w8, w_scale=ws, residual=r, out=nan_like((16, n)), scratch=(part, count))
    assert not torch.isnan(full.float()).any() and not count.any()
    want = (x.double() @ (w8.double() * ws.double()[:, None]).T).to(BF16).double() + r.double()
    torch.testing.assert_close(full.double(), want, rtol=2 ** -8, atol=2e-2)
    for m in BUCKETS:
        y = ops.skinny_gemm(x[:m], w8, w_scale=ws, residual=r[:m], scratch=(part, count))
        assert torch.equal(bits(y), bits(full[:m])), f"M = {m}"
    other = torch.randn(16, k, generator=gen).to(BF16)
    other[9] = x[9]
    y = ops.skinny_gemm(other, w8, w_scale=ws, residual=r, scratch=(part, count))
    assert torch.equal(bits(y[9]), bits(full[9]))


def test_w8a16_gemm_refuses_an_fp8_activation_without_its_scale():
    gen = torch.Generator().manual_seed(6)
    x, w8, ws = w8a16_inputs(2, 16, 32, gen)
    with pytest.raises(AssertionError, match="x_scale"):
        ops.skinny_gemm(x.to(torch.float8_e4m3fn), w8, w_scale=ws)


# ---------------------------------------------------------------------------------------------- fp32 head
def test_skinny_gemm_fp32_output_is_the_audio_head_of_each_row():
    """rmsnorm(h) (bf16) · W_audioᵀ in fp32 for 1-16 rows, against float64 and bit-identical across M."""
    n, k = 8208, 64                                     # the real head's rows, the tiny hidden size
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(16, k, generator=gen).to(BF16)
    w = (torch.randn(n, k, generator=gen) * 0.05).to(BF16)
    g = (1 + 0.1 * torch.randn(k, generator=gen)).to(BF16)
    xn = ops.rmsnorm(h, g, 1e-6)
    full = ops.skinny_gemm(xn, w, out=nan_like((16, n), torch.float32))
    assert full.dtype == torch.float32 and not torch.isnan(full).any()
    for i in (0, 15):
        want = ref.audio_head_ref(h[i], w, g, 1e-6)
        torch.testing.assert_close(full[i].double(), want.double(), rtol=1e-5, atol=1e-4)
    for m in (1, 4):
        y = ops.skinny_gemm(xn[:m], w, out=nan_like((m, n), torch.float32))
        assert torch.equal(bits(y), bits(full[:m])), f"M = {m}"


# ---------------------------------------------------------------------------------------------- RoPE + KV
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 16), (8, 2, 128)])
def test_batched_rope_kv_writes_each_row_at_its_slot_and_position(heads, kv_heads, d):
    """Rows at their own (slot, position): q against float64, k/v in exactly their cache cells and nowhere
    else (the rest of the NaN-poisoned caches untouched), each row's bits those of the one-take kernel at
    that position; a padding row (position -1) writes nothing."""
    gen = torch.Generator().manual_seed(8)
    slots, positions = [2, 0, 3, 1, 0], [5, 0, 17, 9, -1]
    b, max_pos = len(slots), 24
    qkv = torch.randn(b, (heads + 2 * kv_heads) * d, generator=gen).to(BF16)
    q_norm = (1 + 0.1 * torch.randn(d, generator=gen)).to(BF16)
    k_norm = (1 + 0.1 * torch.randn(d, generator=gen)).to(BF16)
    cos, sin = ops.rope_tables(1e6, d, max_pos)
    kc, vc = nan_like((4, kv_heads, max_pos, d)), nan_like((4, kv_heads, max_pos, d))
    q = ops.qk_norm_rope_kv_batch(qkv, q_norm, k_norm, cos, sin, torch.tensor(slots, dtype=torch.int32),
                                  torch.tensor(positions, dtype=torch.int32), kc, vc, heads=heads,
                                  kv_heads=kv_heads, eps=1e-6, q_out=nan_like((b, heads, d)))
    assert not torch.isnan(q.float()).any()
    at = torch.tensor([max(p, 0) for p in positions])
    want_q, want_k, want_v = ref.qk_norm_rope_ref(qkv, q_norm, k_norm, cos, sin, at, heads, kv_heads, 1e-6)
    torch.testing.assert_close(q.double(), want_q, rtol=2 ** -7, atol=1e-2)
    written = torch.zeros(4, max_pos, dtype=torch.bool)
    for i, (slot, pos) in enumerate(zip(slots, positions)):
        if pos < 0:
            continue
        written[slot, pos] = True
        torch.testing.assert_close(kc[slot, :, pos].double(), want_k[i], rtol=2 ** -7, atol=1e-2)
        assert torch.equal(bits(vc[slot, :, pos]), bits(qkv[i].view(-1, d)[heads + kv_heads:]))
        k1, v1 = nan_like((kv_heads, max_pos, d)), nan_like((kv_heads, max_pos, d))
        q1 = ops.qk_norm_rope_kv(qkv[i], q_norm, k_norm, cos, sin, torch.tensor([pos], dtype=torch.int32), k1, v1,
                                 heads=heads, kv_heads=kv_heads, eps=1e-6)
        assert torch.equal(bits(q1[0]), bits(q[i])) and torch.equal(bits(k1[:, pos]), bits(kc[slot, :, pos]))
    assert torch.isnan(kc.float()).all(-1).all(1).eq(~written).all()   # no other cell was touched
    assert torch.isnan(vc.float()).all(-1).all(1).eq(~written).all()
