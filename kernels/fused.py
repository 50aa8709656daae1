"""The v2 decode step's kernels: five launches per layer instead of ten.

    gemv(rmsnorm(h) -> x)  | attention(q/k norm + RoPE + KV write, split-K, combine) | gemv o_proj (+ h)
    gemv(rmsnorm(h) -> x)  | gemv down(silu(gate)·up -> x) (+ h)

`gemv2_kernel` is the GEMV of kernels/gemv.py with a prologue that builds its input chunk in registers
instead of reading a tensor a separate kernel wrote: PROLOGUE_NORM recomputes rstd from the 2560-wide
residual row (5 KB from L2, as the audio head does) and normalises (and, for W8A8, quantises) each chunk;
PROLOGUE_SILU reads the gate and up halves of gate_up and forms silu(gate)·up (quantised for W8A8). The
rounding points are the unfused kernels': the normalised row and the activation are rounded to bf16, or
quantised from fp32 straight to e4m3, exactly where rmsnorm_kernel / silu_mul_kernel store them. Each
loop step streams BLOCK_N × BLOCK_K weights, 64 bytes per thread, and the loop is software-pipelined by
hand: step i+1's four independent 16-byte weight loads are issued before step i's input chunk is built
and accumulated (v1: two loads, issued after the x chunk's shared-memory shuffle and its two barriers;
tests/test_kernels_fused_sass.py checks the SASS). The weights are not split over K: each program owns
whole rows, so the reduction order of every output is fixed.

`decode_attn_fused_kernel` does the work of qk_norm_rope_kv + decode_attn_split + attn_combine in one
launch. Every (kv head, split) program normalises and rotates its group's query heads and the new key
itself (a few hundred FLOPs, redundant across splits); the split that owns position `pos` writes the new
k/v into the cache and attends to the new token from registers, and no program reads cache position
`pos`, so there is no race on it. The split-K combine is done by the last program of each kv head to
finish: each program stores its partial, then takes a ticket from a per-kv-head counter (atomic,
acquire-release); the one that draws NUM_SPLITS - 1 reads all partials through L2 (.cg) in split order,
writes the head outputs and resets the counter for the next launch. The reduction order is fixed (split
0, 1, ...), so the result does not depend on which program finishes last.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention import DECODE_OPTIONS, DECODE_TILES, _attend_block
from kernels.gemv import PROLOGUE_NONE, PROLOGUE_NORM, PROLOGUE_SILU, _gemv_epilogue, _gemv_loop
from kernels.spec import KernelSpec


@triton.jit
def gemv2_kernel(X, G, W, W_SCALE, X_SCALE, R, Y, N, K, eps, stride_w,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr,
                 HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    rstd = 1.0
    if PROLOGUE == 1:
        ss = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            h = tl.load(X + k0 + cols, mask=(k0 + cols) < K, other=0.0).to(tl.float32)
            ss += h * h
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    acc = _gemv_loop(X, G, W, X_SCALE, rows, rmask, cols, 0, K, K, rstd, stride_w, BLOCK_N, BLOCK_K, PROLOGUE,
                     HAS_X_SCALE, PIPELINE=True)
    _gemv_epilogue(tl.sum(acc, axis=1), W_SCALE, X_SCALE, R, Y, rows, rmask, HAS_W_SCALE, HAS_X_SCALE,
                   HAS_RESIDUAL)


@triton.jit
def _norm_rope_rows(SRC, W, COS, SIN, eps, rows, rmask, HEAD_DIM: tl.constexpr):
    """Heads `rows` of SRC ([*, HEAD_DIM] bf16): per-head RMSNorm (rounded to bf16) then NeoX RoPE, in fp32,
    as kernels/rope_kv.py computes them; returns the rotated heads rounded to bf16, as fp32."""
    HALF: tl.constexpr = HEAD_DIM // 2
    d = tl.arange(0, HEAD_DIM)
    partner = (d + HALF) % HEAD_DIM
    x = tl.load(SRC + rows[:, None] * HEAD_DIM + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    xp = tl.load(SRC + rows[:, None] * HEAD_DIM + partner[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)
    x = (x * rstd[:, None] * tl.load(W + d).to(tl.float32)[None, :]).to(tl.bfloat16).to(tl.float32)
    xp = (xp * rstd[:, None] * tl.load(W + partner).to(tl.float32)[None, :]).to(tl.bfloat16).to(tl.float32)
    c = tl.load(COS + d).to(tl.float32)[None, :]
    s = tl.load(SIN + d).to(tl.float32)[None, :]
    rot = tl.where((d < HALF)[None, :], x * c - xp * s, x * c + xp * s)
    return rot.to(tl.bfloat16).to(tl.float32)


@triton.jit
def decode_attn_fused_kernel(QKV, Q_NORM, K_NORM, COS, SIN, POS, K_CACHE, V_CACHE, M_PART, L_PART, ACC_PART,
                             COUNT, OUT, qk_scale, eps, group, n_heads, n_kv_heads, stride_ch, stride_cs,
                             HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                             NUM_SPLITS: tl.constexpr):
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    pos = tl.load(POS)
    seq_len = pos + 1
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_S) * BLOCK_S
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    owner = (start <= pos) & (pos < end)        # exactly one split holds the new position
    g = tl.arange(0, BLOCK_G)
    gmask = g < group
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * group + g
    cos, sin = COS + pos.to(tl.int64) * HEAD_DIM, SIN + pos.to(tl.int64) * HEAD_DIM
    q = _norm_rope_rows(QKV, Q_NORM, cos, sin, eps, heads, gmask, HEAD_DIM)
    one = tl.arange(0, 1)
    k_new = _norm_rope_rows(QKV, K_NORM, cos, sin, eps, n_heads + kvh + one, one < 1, HEAD_DIM)   # [1, D]
    v_new = tl.load(QKV + (n_heads + n_kv_heads + kvh) * HEAD_DIM + d).to(tl.float32)
    base = kvh.to(tl.int64) * stride_ch
    if owner:
        slot = base + pos.to(tl.int64) * stride_cs
        tl.store(K_CACHE + slot + d[None, :], k_new.to(tl.bfloat16))
        tl.store(V_CACHE + slot + d, v_new.to(tl.bfloat16))
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    cached_end = tl.minimum(end, pos)           # the cache up to, not including, the new position
    q16 = q.to(tl.bfloat16)
    for s0 in range(start, cached_end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < cached_end
        offs = base + s.to(tl.int64)[:, None] * stride_cs + d[None, :]
        m, l_sum, acc = _attend_block(q16, K_CACHE, V_CACHE, offs, smask, smask[None, :], qk_scale, m, l_sum, acc)
    if owner:
        score = tl.sum(q * k_new, axis=1) * qk_scale
        m_new = tl.maximum(m, score)
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(score - m_new)
        m, l_sum, acc = m_new, l_sum * alpha + p, acc * alpha[:, None] + p[:, None] * v_new[None, :]
    part = heads * NUM_SPLITS + split
    tl.store(M_PART + part, m, mask=gmask)
    tl.store(L_PART + part, l_sum, mask=gmask)
    tl.store(ACC_PART + part.to(tl.int64)[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])
    tl.debug_barrier()                          # every thread's partial is stored before the ticket is taken
    ticket = tl.atomic_add(COUNT + kvh, 1, sem="acq_rel")
    if ticket == NUM_SPLITS - 1:
        m_max = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        for sp in tl.static_range(NUM_SPLITS):
            m_max = tl.maximum(m_max, tl.load(M_PART + heads * NUM_SPLITS + sp, mask=gmask, other=0.0,
                                              cache_modifier=".cg"))
        num = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
        den = tl.zeros((BLOCK_G,), tl.float32)
        for sp in tl.static_range(NUM_SPLITS):
            idx = heads * NUM_SPLITS + sp
            w = tl.exp2(tl.load(M_PART + idx, mask=gmask, other=0.0, cache_modifier=".cg") - m_max)  # empty: 0
            den += tl.load(L_PART + idx, mask=gmask, other=0.0, cache_modifier=".cg") * w
            num += tl.load(ACC_PART + idx.to(tl.int64)[:, None] * HEAD_DIM + d[None, :], mask=gmask[:, None],
                           other=0.0, cache_modifier=".cg") * w[:, None]
        den = tl.where(gmask, den, 1.0)         # padding rows of the group tile: never stored, kept finite
        tl.store(OUT + heads[:, None] * HEAD_DIM + d[None, :], (num / den[:, None]).to(OUT.dtype.element_ty),
                 mask=gmask[:, None])
        tl.store(COUNT + kvh, 0)


# Register caps per head dim and arch (see DECODE_MAXNREG in kernels/attention.py): the fused prologue
# (q/k norm + RoPE) and the combine keep more live than the split kernel alone. For d128, sm_89 and sm_90a
# spilled 8 B at 104 and at 128 and none at 168, while sm_120a spilled 16 B at 168 and none at 128.
# 74 KB of shared memory and a one-wave grid bound occupancy, not registers.
FUSED_ATTN_MAXNREG = {128: {89: 168, 90: 168, 120: 128}, 16: {89: 184, 90: 184, 120: 184}}

# Four 16-byte weight loads per thread per loop step (8 rows × 64 bytes × 128 threads = 8 KB per CTA in
# flight, twice v1's): N = 2560 still gives 320 programs.
GEMV2_TILES = {"bf16": dict(BLOCK_N=8, BLOCK_K=512), "fp8": dict(BLOCK_N=8, BLOCK_K=1024)}


def _gemv(name, x, w, *, prologue, w_scale, x_scale, residual):
    tiles = GEMV2_TILES["fp8" if w == "*fp8e4nv" else "bf16"]
    return KernelSpec(
        name=name, fn=gemv2_kernel,
        signature={"X": x, "G": "*bf16", "W": w, "W_SCALE": "*fp32", "X_SCALE": "*fp32", "R": "*bf16",
                   "Y": "*bf16", "N": "i32", "K": "i32", "eps": "fp32", "stride_w": "i32"},
        constexprs=dict(tiles, PROLOGUE=prologue, HAS_W_SCALE=w_scale, HAS_X_SCALE=x_scale, HAS_RESIDUAL=residual),
        num_warps=4, divisibility_16=("X", "G", "W", "Y", "K", "stride_w"))


def _attn(head_dim):
    return KernelSpec(
        name=f"decode_attn_fused_d{head_dim}", fn=decode_attn_fused_kernel,
        signature={"QKV": "*bf16", "Q_NORM": "*bf16", "K_NORM": "*bf16", "COS": "*bf16", "SIN": "*bf16",
                   "POS": "*i32", "K_CACHE": "*bf16", "V_CACHE": "*bf16", "M_PART": "*fp32", "L_PART": "*fp32",
                   "ACC_PART": "*fp32", "COUNT": "*i32", "OUT": "*bf16", "qk_scale": "fp32", "eps": "fp32",
                   "group": "i32", "n_heads": "i32", "n_kv_heads": "i32", "stride_ch": "i32", "stride_cs": "i32"},
        constexprs=dict(DECODE_TILES, HEAD_DIM=head_dim), **DECODE_OPTIONS, maxnreg=FUSED_ATTN_MAXNREG[head_dim],
        divisibility_16=("QKV", "K_CACHE", "V_CACHE", "ACC_PART", "OUT", "stride_ch", "stride_cs"))


KERNELS = [
    _gemv("gemv2_bf16_res", "*bf16", "*bf16", prologue=PROLOGUE_NONE, w_scale=False, x_scale=False, residual=True),
    _gemv("gemv2_w8a16_res", "*bf16", "*fp8e4nv", prologue=PROLOGUE_NONE, w_scale=True, x_scale=False, residual=True),
    _gemv("gemv2_norm_bf16", "*bf16", "*bf16", prologue=PROLOGUE_NORM, w_scale=False, x_scale=False, residual=False),
    _gemv("gemv2_norm_w8a8", "*bf16", "*fp8e4nv", prologue=PROLOGUE_NORM, w_scale=True, x_scale=True, residual=False),
    _gemv("gemv2_silu_bf16_res", "*bf16", "*bf16", prologue=PROLOGUE_SILU, w_scale=False, x_scale=False,
          residual=True),
    _gemv("gemv2_silu_w8a8_res", "*bf16", "*fp8e4nv", prologue=PROLOGUE_SILU, w_scale=True, x_scale=True,
          residual=True),
    _attn(128), _attn(16),
]
