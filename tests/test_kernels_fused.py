"""The v2 decode kernels (kernels/fused.py) against float64 references on the CPU interpreter, outputs
NaN-poisoned before each launch; shapes not tile-aligned, production tiles. The rounding points are the
unfused kernels', so the references round where those kernels store (bf16, or e4m3 for W8A8 inputs)."""

import math

import pytest
import torch

from kernels import ops
from tests import interp_rounding
from tests.helpers import gemv_reference, gemv_weights, nan_like, rel_err

interp_rounding.install()

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
EPS = 1e-6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rms_normed(h, g):
    """fp32 math of rmsnorm_kernel: h·rstd·g (the caller rounds it)."""
    h = h.float()
    return h * torch.rsqrt(h.pow(2).mean() + EPS) * g.float()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
@pytest.mark.parametrize("n,k", [(37, 1184), (24, 2080)])
def test_gemv2_norm_prologue(fp8, n, k):
    h = (torch.randn(k) * 3).to(BF16)
    g = (1 + 0.1 * torch.randn(k)).to(BF16)
    w, ws = gemv_weights(n, k, fp8)
    y_ref = rms_normed(h, g)
    if fp8:
        xs = (y_ref.abs().max() * 1.5 / 448).reshape(1)
        x = ops.quantize_fp8(y_ref, xs).float()         # the fp8 rmsnorm output the unfused path stores
    else:
        xs = None
        x = y_ref.to(BF16).float()
    y = ops.gemv2(h, w, prologue="norm", norm_w=g, eps=EPS, w_scale=ws, x_scale=xs, out=nan_like((n,)))
    assert not torch.isnan(y.float()).any()
    want = gemv_reference(x, w.float(), ws, xs)
    assert rel_err(y, want) < 5e-3                      # one bf16 rounding of the output
    # the same as the unfused pair (rmsnorm kernel, then the v1 GEMV), up to a flipped rounding of x
    xn = ops.rmsnorm(h, g, EPS, scale=xs)
    assert rel_err(y, ops.gemv(xn, w, w_scale=ws, x_scale=xs)) < 1e-2


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
def test_gemv2_silu_prologue_and_residual_in_place(fp8):
    n, inter = 40, 1552
    gu = (torch.randn(2 * inter) * 2).to(BF16)
    w, ws = gemv_weights(n, inter, fp8)
    g, u = gu.float().chunk(2)
    act = torch.nn.functional.silu(g) * u
    xs = (act.abs().max() * 1.5 / 448).reshape(1) if fp8 else None
    x = ops.quantize_fp8(act, xs).float() if fp8 else act.to(BF16).float()
    h = torch.randn(n).to(BF16)
    want = gemv_reference(x, w.float(), ws, xs, residual=h)
    y = ops.gemv2(gu, w, prologue="silu", w_scale=ws, x_scale=xs, residual=h, out=h)
    assert y is h and not torch.isnan(h.float()).any()
    assert rel_err(h, want) < 5e-3


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a16"])
def test_gemv2_plain_with_residual(fp8):
    n, k = 29, 4112
    x = torch.randn(k).to(BF16)
    w, ws = gemv_weights(n, k, fp8)
    r = torch.randn(n).to(BF16)
    y = ops.gemv2(x, w, w_scale=ws, residual=r, out=nan_like((n,)))
    assert not torch.isnan(y.float()).any()
    assert rel_err(y, gemv_reference(x, w.float(), ws, residual=r)) < 5e-3


def reference_attention(qkv, q_norm, k_norm, cos, sin, kc, vc, pos, heads, kv_heads, d):
    """float64: per-head norm (rounded to bf16), RoPE (rounded to bf16), softmax attention over the cache
    [0, pos) plus the new k/v at pos."""
    def norm_rope(t, w):
        t = t.float()
        t = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(BF16).double()
        rot = torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1)
        return (t * cos[pos].double() + rot * sin[pos].double()).to(BF16).double()

    rows = qkv.view(-1, d)
    q = norm_rope(rows[:heads], q_norm)
    k_new = norm_rope(rows[heads:heads + kv_heads], k_norm)
    v_new = rows[heads + kv_heads:].double()
    keys = torch.cat([kc[:, :pos].double(), k_new[:, None]], 1).repeat_interleave(heads // kv_heads, 0)
    vals = torch.cat([vc[:, :pos].double(), v_new[:, None]], 1).repeat_interleave(heads // kv_heads, 0)
    p = torch.softmax(torch.einsum("hd,htd->ht", q, keys) / math.sqrt(d), -1)
    return torch.einsum("ht,htd->hd", p, vals), k_new, v_new


@pytest.mark.parametrize("heads,kv_heads,d,pos", [(4, 2, 16, 0), (4, 2, 16, 37), (8, 2, 128, 300)])
def test_decode_attention_fused(heads, kv_heads, d, pos):
    max_pos = pos + 9
    qkv = torch.randn((heads + 2 * kv_heads) * d).to(BF16)
    q_norm, k_norm = (1 + 0.1 * torch.randn(d)).to(BF16), (1 + 0.1 * torch.randn(d)).to(BF16)
    cos, sin = ops.rope_tables(1e6, d, max_pos)
    kc, vc = nan_like((kv_heads, max_pos, d)), nan_like((kv_heads, max_pos, d))   # NaN where never read
    kc[:, :pos], vc[:, :pos] = torch.randn(kv_heads, pos, d).to(BF16), torch.randn(kv_heads, pos, d).to(BF16)
    want, k_new, v_new = reference_attention(qkv, q_norm, k_norm, cos, sin, kc, vc, pos, heads, kv_heads, d)
    scratch = ops.fused_attention_scratch(heads, kv_heads, d, "cpu")
    for s in scratch[:3]:
        s.fill_(float("nan"))                       # partials are written before they are read
    for _ in range(2):                              # the ticket counters are reset for the next launch
        out = ops.decode_attention_fused(qkv, q_norm, k_norm, cos, sin, torch.tensor([pos], dtype=torch.int32),
                                         kc, vc, heads=heads, eps=EPS, scratch=scratch, out=nan_like((heads, d)))
        assert not torch.isnan(out.float()).any()
        assert rel_err(out, want) < 5e-3
        assert (scratch[3] == 0).all()
    assert torch.equal(kc[:, pos].double(), k_new) and torch.equal(vc[:, pos].double(), v_new)
    assert torch.isnan(kc[:, pos + 1:].float()).all() and torch.isnan(vc[:, pos + 1:].float()).all()


def test_decode_attention_fused_equals_the_three_v1_kernels():
    """Same inputs through qk_norm_rope_kv + decode_attention (split + combine): the same cache rows and,
    up to fp32 summation order, the same output."""
    heads, kv_heads, d, pos, max_pos = 8, 2, 128, 130, 140
    qkv = torch.randn((heads + 2 * kv_heads) * d).to(BF16)
    q_norm, k_norm = (1 + 0.1 * torch.randn(d)).to(BF16), (1 + 0.1 * torch.randn(d)).to(BF16)
    cos, sin = ops.rope_tables(1e6, d, max_pos)
    p = torch.tensor([pos], dtype=torch.int32)
    k1, v1 = torch.randn(kv_heads, max_pos, d).to(BF16), torch.randn(kv_heads, max_pos, d).to(BF16)
    k2, v2 = k1.clone(), v1.clone()
    q = ops.qk_norm_rope_kv(qkv[None], q_norm, k_norm, cos, sin, p, k1, v1, heads=heads, kv_heads=kv_heads, eps=EPS)
    old = ops.decode_attention(q[0], k1, v1, p)
    new = ops.decode_attention_fused(qkv, q_norm, k_norm, cos, sin, p, k2, v2, heads=heads, eps=EPS,
                                     scratch=ops.fused_attention_scratch(heads, kv_heads, d, "cpu"))
    assert torch.equal(k1, k2) and torch.equal(v1, v2)
    assert rel_err(new, old.float()) < 1e-2
