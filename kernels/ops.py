"""Typed torch-level launchers for the Triton kernels: the model code calls `ops.gemv(x, w, out=..., residual=...)`,
never raw pointers or grids.

These launch the `@triton.jit` functions through Triton's own launcher, so the same call runs on a GPU
(JIT) and on the CPU under TRITON_INTERPRET=1 (the CI tests). `kernels/runtime.py` provides the same op names
and arguments backed by the committed cubins. Tiles are the ones the cubins are built with (each kernel
file's `*_TILE(S)` dict, also used by its `KERNELS` entries). Outputs may be preallocated (`out=`) so a
captured CUDA graph reuses the same buffers; positions, lengths and sampler state are device tensors.

Conventions: activations bf16; FP8 tensors are `torch.float8_e4m3fn` with fp32 scales (weights: per output
channel `[N]`, activations: per tensor `[1]`, static); KV caches `[kv_heads, max_pos, head_dim]` bf16 (the
batched ops: `[slots, kv_heads, max_pos, head_dim]`).
"""

from __future__ import annotations

import math

import torch
import triton

from kernels.attention import (
    DECODE_OPTIONS,
    DECODE_TILES,
    LOG2E,
    PREFILL_OPTIONS,
    PREFILL_TILES,
    attn_combine_kernel,
    decode_attn_split_kernel,
    prefill_attn_kernel,
)
from kernels.batch import (
    ROWS,
    SKINNY_SPLIT_K,
    SKINNY_TILES,
    decode_attn_batch_kernel,
    sample_batch_kernel,
    skinny_gemm_kernel,
)
from kernels.common import FP8_MAX
from kernels.fused import GEMV2_TILES, decode_attn_fused_kernel, gemv2_kernel
from kernels.gemm import GEMM_STAGES, GEMM_TILES, gemm_kernel
from kernels.gemv import GEMV_TILES, PROLOGUE_NONE, PROLOGUE_NORM, PROLOGUE_SILU, gemv_kernel
from kernels.head import HEAD_TILES, audio_head_kernel
from kernels.mlp import SILU_TILE, silu_mul_kernel
from kernels.norm import NORM_TILE, rmsnorm_kernel
from kernels.rope_kv import qk_norm_rope_kv_batch_kernel, qk_norm_rope_kv_kernel
from kernels.sampler import SAMPLER_GRID_TILE, SAMPLER_GRID_WARPS, SAMPLER_TILE, sample_grid_kernel, sample_kernel
from kernels.splitk import SPLITK_TILES, gemv_splitk_kernel

FP8 = torch.float8_e4m3fn

# Sampler state layout (int64 device tensor), see kernels/sampler.py.
STATE_STEP, STATE_SEED, STATE_TOP_K, STATE_COUNTDOWN, STATE_DONE = range(5)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.view(1, -1)


# ---------------------------------------------------------------------------------------------- norm / MLP
def rmsnorm(x, w, eps: float, *, out=None, residual=None, scale=None):
    """y = rmsnorm(x (+ residual)) · w over the last dim of x [M, N] (or [N]).

    residual: bf16 like x; the sum x + residual is stored back into `residual` (the residual stream) and is
    what gets normalised. scale: fp32 [1] static activation scale → `out` is FP8 e4m3 of y / scale.
    """
    x2 = _rows(x)
    m, n = x2.shape
    assert n <= NORM_TILE["BLOCK_N"], f"rmsnorm row of {n} exceeds the tile"
    if out is None:
        out = torch.empty(x.shape, dtype=FP8 if scale is not None else x.dtype, device=x.device)
    out2 = _rows(out)
    res2 = _rows(residual) if residual is not None else x2
    rmsnorm_kernel[(m,)](x2, w, out2, res2, scale if scale is not None else w, n, eps, x2.stride(0),
                         out2.stride(0), res2.stride(0), HAS_RESIDUAL=residual is not None,
                         QUANT=scale is not None, num_warps=8, **NORM_TILE)
    return out


def silu_mul(gate_up, *, out=None, scale=None):
    """y = silu(gate) · up for gate_up [M, 2·I] = [gate | up]; FP8 output when `scale` ([1] fp32) is given."""
    gu = _rows(gate_up)
    m, two_i = gu.shape
    inter = two_i // 2
    if out is None:
        shape = (*gate_up.shape[:-1], inter)
        out = torch.empty(shape, dtype=FP8 if scale is not None else gate_up.dtype, device=gate_up.device)
    out2 = _rows(out)
    grid = (m, triton.cdiv(inter, SILU_TILE["BLOCK"]))
    silu_mul_kernel[grid](gu, out2, scale if scale is not None else gu, inter, gu.stride(0), out2.stride(0),
                          QUANT=scale is not None, num_warps=4, **SILU_TILE)
    return out


# ---------------------------------------------------------------------------------------------- linear
def gemv(x, w, *, w_scale=None, x_scale=None, out=None, residual=None, out_dtype=torch.bfloat16):
    """y[N] = x[K] · w[N, K]ᵀ (M = 1 decode path). FP8 weights need `w_scale` [N]; FP8 activations need
    `x_scale` [1]. residual [N] bf16 is added in the epilogue (out may be the residual itself)."""
    n, k = w.shape
    assert x.numel() == k, f"gemv: x has {x.numel()} elements, weight expects {k}"
    if out is None:
        out = torch.empty(n, dtype=out_dtype, device=x.device)
    tiles = GEMV_TILES["fp8" if w.dtype == FP8 else "bf16"]
    grid = (triton.cdiv(n, tiles["BLOCK_N"]),)
    gemv_kernel[grid](x, w, w_scale if w_scale is not None else out, x_scale if x_scale is not None else out,
                      residual if residual is not None else out, out, n, k, w.stride(0),
                      HAS_W_SCALE=w_scale is not None, HAS_X_SCALE=x_scale is not None,
                      HAS_RESIDUAL=residual is not None, num_warps=4, **tiles)
    return out


def gemv2(x, w, *, prologue: str = "none", norm_w=None, eps: float = 0.0, w_scale=None, x_scale=None, out=None,
          residual=None):
    """The v2 GEMV (kernels/fused.py): y[N] = f(x) · w[N, K]ᵀ, bf16 out, where f is
    "none": x [K] as given; "norm": rmsnorm(x [K]) · norm_w, rounded to bf16 or, with `x_scale`, quantised
    to FP8; "silu": x [2K] = [gate | up] → silu(gate)·up, rounded or quantised the same way."""
    n, k = w.shape
    mode = {"none": PROLOGUE_NONE, "norm": PROLOGUE_NORM, "silu": PROLOGUE_SILU}[prologue]
    assert x.numel() == (2 * k if mode == PROLOGUE_SILU else k), f"gemv2: x has {x.numel()} elements for K = {k}"
    if out is None:
        out = torch.empty(n, dtype=torch.bfloat16, device=x.device)
    tiles = GEMV2_TILES["fp8" if w.dtype == FP8 else "bf16"]
    gemv2_kernel[(triton.cdiv(n, tiles["BLOCK_N"]),)](
        x, norm_w if norm_w is not None else out, w, w_scale if w_scale is not None else out,
        x_scale if x_scale is not None else out, residual if residual is not None else out, out, n, k, eps,
        w.stride(0), PROLOGUE=mode, HAS_W_SCALE=w_scale is not None, HAS_X_SCALE=x_scale is not None,
        HAS_RESIDUAL=residual is not None, num_warps=4, **tiles)
    return out


def gemv_splitk_scratch(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials and per-row-block ticket counters for `gemv_splitk` at N ≤ n (counters zero between
    launches: the last program of each row block resets its counter). One scratch serves launches that
    run one after the other on a stream."""
    splits = max(t["SPLIT_K"] for t in SPLITK_TILES.values())
    blocks = max(triton.cdiv(n, t["BLOCK_N"]) for t in SPLITK_TILES.values())
    return (torch.empty(splits * n, dtype=torch.float32, device=device),
            torch.zeros(blocks, dtype=torch.int32, device=device))


def gemv_splitk(x, w, *, residual, scratch, prologue: str = "none", w_scale=None, x_scale=None, out=None):
    """Split-K variant of `gemv2` for the N = 2560 projections (kernels/splitk.py): y[N] = f(x) · w[N, K]ᵀ
    + residual, with f "none" (x [K]) or "silu" (x [2K] = [gate | up] → silu(gate)·up, rounded to bf16 or,
    with `x_scale`, quantised to FP8); a deterministic reduction in split order. `scratch` from
    `gemv_splitk_scratch`; out may be the residual itself."""
    n, k = w.shape
    silu = {"none": False, "silu": True}[prologue]
    assert x.numel() == (2 * k if silu else k), f"gemv_splitk: x has {x.numel()} elements for K = {k}"
    if out is None:
        out = torch.empty(n, dtype=torch.bfloat16, device=x.device)
    tiles = SPLITK_TILES["fp8" if w.dtype == FP8 else "bf16"]
    part, count = scratch
    assert part.numel() >= tiles["SPLIT_K"] * n, "gemv_splitk: scratch too small for this N"
    gemv_splitk_kernel[(triton.cdiv(n, tiles["BLOCK_N"]), tiles["SPLIT_K"])](
        x, w, w_scale if w_scale is not None else out, x_scale if x_scale is not None else out, residual, out,
        part, count, n, k, w.stride(0), SILU=silu, HAS_W_SCALE=w_scale is not None,
        HAS_X_SCALE=x_scale is not None, HAS_RESIDUAL=True, num_warps=4, **tiles)
    return out


def gemm(a, w, *, w_scale=None, a_scale=None, out=None, residual=None):
    """C[M, N] = a[M, K] · w[N, K]ᵀ on the tensor cores (prefill). Scales and residual as in `gemv`."""
    m, k = a.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    kind = "fp8" if a.dtype == FP8 else "bf16"
    tiles = GEMM_TILES[kind]
    res = residual if residual is not None else out
    grid = (triton.cdiv(m, tiles["BLOCK_M"]), triton.cdiv(n, tiles["BLOCK_N"]))
    gemm_kernel[grid](a, w, w_scale if w_scale is not None else out, a_scale if a_scale is not None else out, res,
                      out, m, n, k, a.stride(0), w.stride(0), out.stride(0), res.stride(0),
                      HAS_W_SCALE=w_scale is not None, HAS_A_SCALE=a_scale is not None,
                      HAS_RESIDUAL=residual is not None, num_warps=4, num_stages=GEMM_STAGES[kind], **tiles)
    return out


def skinny_gemm_scratch(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials and per-row-block ticket counters for `skinny_gemm(..., scratch=)` at N ≤ n (counters zero
    between launches: the last program of each row block resets its counter)."""
    blocks = max(triton.cdiv(n, t["BLOCK_N"]) for t in SKINNY_TILES.values())
    return (torch.empty(SKINNY_SPLIT_K * ROWS * n, dtype=torch.float32, device=device),
            torch.zeros(blocks, dtype=torch.int32, device=device))


def skinny_gemm(x, w, *, w_scale=None, x_scale=None, out=None, residual=None, scratch=None):
    """Y[M, N] = x[M, K] · w[N, K]ᵀ for M ≤ 16 decode rows on the tensor cores (kernels/batch.py), each
    row's result independent of M. BF16 x and w; FP8 x and w with `x_scale` [M] (per row) and `w_scale`
    [N] (per output channel); or W8A16: BF16 x, FP8 w with `w_scale` only. residual [M, N] bf16 is added
    in the epilogue (out may be it); `out` may be fp32 (no residual: the audio head's logits).
    `scratch` (from `skinny_gemm_scratch`; with a residual only: o_proj, down) splits K into fixed ranges
    for more programs at small N, reduced in a fixed order."""
    m, k = x.shape
    n = w.shape[0]
    assert m <= ROWS, f"skinny_gemm: {m} rows, at most {ROWS}"
    fp8_w, fp8_x = w.dtype == FP8, x.dtype == FP8
    kind = "fp8" if fp8_x else "w8a16" if fp8_w else "bf16"
    assert (w_scale is not None) == fp8_w and (x_scale is not None) == fp8_x and (fp8_w or not fp8_x), \
        "skinny_gemm: FP8 w needs w_scale, FP8 x needs x_scale (and FP8 w); BF16 takes none"
    assert scratch is None or residual is not None, "skinny_gemm: split-K is built for the residual GEMMs only"
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    res = residual if residual is not None else out
    part, count = scratch if scratch is not None else (out, out)
    split_k = SKINNY_SPLIT_K if scratch is not None else 1
    assert scratch is None or part.numel() >= split_k * ROWS * n, "skinny_gemm: scratch too small for this N"
    tiles = SKINNY_TILES[kind]
    skinny_gemm_kernel[(triton.cdiv(n, tiles["BLOCK_N"]), split_k)](
        x, w, w_scale if fp8_w else out, x_scale if fp8_x else out, res, out, part, count, m, n, k, x.stride(0),
        w.stride(0), out.stride(0), res.stride(0), SPLIT_K=split_k, HAS_W_SCALE=fp8_w, HAS_X_SCALE=fp8_x,
        HAS_RESIDUAL=residual is not None, num_warps=4, num_stages=3, **tiles)
    return out


def linear(x, w, *, w_scale=None, x_scale=None, out=None, residual=None):
    """GEMV for one row, GEMM otherwise."""
    if x.dim() == 1 or x.shape[0] == 1:
        y = gemv(x, w, w_scale=w_scale, x_scale=x_scale, out=None if out is None else out.view(-1),
                 residual=None if residual is None else residual.view(-1))
        return y.view(*x.shape[:-1], w.shape[0])
    return gemm(x, w, w_scale=w_scale, a_scale=x_scale, out=out, residual=residual)


def audio_head(h, w, norm_w, eps: float, *, out=None):
    """fp32 logits [codebooks·vocab] = rmsnorm(h, norm_w) · wᵀ for one hidden row h (the final norm fused)."""
    n, k = w.shape
    if out is None:
        out = torch.empty(n, dtype=torch.float32, device=h.device)
    audio_head_kernel[(triton.cdiv(n, HEAD_TILES["BLOCK_N"]),)](h, norm_w, w, out, n, k, eps, w.stride(0),
                                                                HAS_NORM=True, num_warps=4, **HEAD_TILES)
    return out


# ---------------------------------------------------------------------------------------------- attention
def qk_norm_rope_kv(qkv, q_norm, k_norm, cos, sin, pos, k_cache, v_cache, *, heads: int, kv_heads: int,
                    eps: float, q_out=None):
    """For rows of the fused qkv output [M, (heads + 2·kv_heads)·D]: per-head RMSNorm + NeoX RoPE of q and
    k at positions pos[0] + i; k and v go into the caches [kv_heads, max_pos, D]; returns q [M, heads, D]."""
    qkv2 = _rows(qkv)
    m = qkv2.shape[0]
    d = k_cache.shape[-1]
    assert qkv2.shape[1] == (heads + 2 * kv_heads) * d
    if q_out is None:
        q_out = torch.empty((m, heads, d), dtype=qkv.dtype, device=qkv.device)
    qk_norm_rope_kv_kernel[(m, heads + kv_heads)](
        qkv2, q_norm, k_norm, cos, sin, pos, q_out, k_cache, v_cache, heads, kv_heads, eps, qkv2.stride(0),
        heads * d, k_cache.stride(0), k_cache.stride(1), HEAD_DIM=d, num_warps=1)
    return q_out


def qk_norm_rope_kv_batch(qkv, q_norm, k_norm, cos, sin, slots, positions, k_cache, v_cache, *, heads: int,
                          kv_heads: int, eps: float, q_out=None):
    """`qk_norm_rope_kv` for B decode rows of B takes: row b at position positions[b] of cache slot
    slots[b] (caches [slots, kv_heads, max_pos, D]; slots, positions int32 [B] on the device). A row with
    a negative position is padding: its q is computed at position 0 and it writes no k/v."""
    b = qkv.shape[0]
    d = k_cache.shape[-1]
    assert qkv.shape[1] == (heads + 2 * kv_heads) * d and k_cache.dim() == 4
    if q_out is None:
        q_out = torch.empty((b, heads, d), dtype=qkv.dtype, device=qkv.device)
    qk_norm_rope_kv_batch_kernel[(b, heads + kv_heads)](
        qkv, q_norm, k_norm, cos, sin, slots, positions, q_out, k_cache, v_cache, heads, kv_heads, eps,
        qkv.stride(0), heads * d, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HEAD_DIM=d, num_warps=1)
    return q_out


def attention_scratch(heads: int, head_dim: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Preallocated split-K partials (max, sum, acc) for `decode_attention`."""
    s = DECODE_TILES["NUM_SPLITS"]
    return (torch.empty(heads * s, dtype=torch.float32, device=device),
            torch.empty(heads * s, dtype=torch.float32, device=device),
            torch.empty(heads * s * head_dim, dtype=torch.float32, device=device))


def decode_attention(q, k_cache, v_cache, pos, *, out=None, scratch=None):
    """One query row q [heads, D] (or [1, heads, D]) at position pos[0] against cache positions [0, pos[0]]."""
    kv_heads, _, d = k_cache.shape
    heads = q.numel() // d
    if out is None:
        out = torch.empty((heads, d), dtype=q.dtype, device=q.device)
    m_part, l_part, acc_part = scratch if scratch is not None else attention_scratch(heads, d, q.device)
    qk_scale = LOG2E / math.sqrt(d)
    decode_attn_split_kernel[(kv_heads, DECODE_TILES["NUM_SPLITS"])](
        q, k_cache, v_cache, pos, m_part, l_part, acc_part, qk_scale, heads // kv_heads,
        k_cache.stride(0), k_cache.stride(1), HEAD_DIM=d, **DECODE_OPTIONS, **DECODE_TILES)
    attn_combine_kernel[(heads,)](m_part, l_part, acc_part, out, HEAD_DIM=d,
                                  NUM_SPLITS=DECODE_TILES["NUM_SPLITS"], num_warps=2)
    return out


def fused_attention_scratch(heads: int, kv_heads: int, head_dim: int, device):
    """`attention_scratch` plus the per-kv-head ticket counters of `decode_attention_fused` (zero between
    launches: the last program of each kv head resets its counter)."""
    return (*attention_scratch(heads, head_dim, device), torch.zeros(kv_heads, dtype=torch.int32, device=device))


def decode_attention_fused(qkv, q_norm, k_norm, cos, sin, pos, k_cache, v_cache, *, heads: int, eps: float,
                           scratch, out=None):
    """One decode row in one launch: q/k RMSNorm + RoPE of the fused qkv row [(heads + 2·kv_heads)·D], its
    k/v written into the caches at pos[0], attention over [0, pos[0]] and the split-K combine → [heads, D]."""
    kv_heads, _, d = k_cache.shape
    if out is None:
        out = torch.empty((heads, d), dtype=torch.bfloat16, device=qkv.device)
    m_part, l_part, acc_part, count = scratch
    decode_attn_fused_kernel[(kv_heads, DECODE_TILES["NUM_SPLITS"])](
        qkv, q_norm, k_norm, cos, sin, pos, k_cache, v_cache, m_part, l_part, acc_part, count, out,
        LOG2E / math.sqrt(d), eps, heads // kv_heads, heads, kv_heads, k_cache.stride(0), k_cache.stride(1),
        HEAD_DIM=d, **DECODE_OPTIONS, **DECODE_TILES)
    return out


def decode_attention_batch(q, k_cache, v_cache, slots, lens, *, out=None, scratch=None):
    """B decode rows at once: q [B, heads, D], take b at position lens[b] - 1 against cache positions
    [0, lens[b]) of slot slots[b] (caches [slots, kv_heads, max_pos, D]; lens, slots int32 [B] on the
    device, every lens[b] ≥ 1) → [B, heads, D]. Row b equals `decode_attention` of that take alone."""
    b, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    if out is None:
        out = torch.empty((b, heads, d), dtype=q.dtype, device=q.device)
    m_part, l_part, acc_part = scratch if scratch is not None else attention_scratch(b * heads, d, q.device)
    decode_attn_batch_kernel[(b, kv_heads, DECODE_TILES["NUM_SPLITS"])](
        q, k_cache, v_cache, slots, lens, m_part, l_part, acc_part, LOG2E / math.sqrt(d), heads // kv_heads,
        heads, q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), HEAD_DIM=d, **DECODE_OPTIONS,
        **DECODE_TILES)
    attn_combine_kernel[(b * heads,)](m_part, l_part, acc_part, out, HEAD_DIM=d,
                                      NUM_SPLITS=DECODE_TILES["NUM_SPLITS"], num_warps=2)
    return out


def prefill_attention(q, k_cache, v_cache, pos, *, out=None):
    """Causal attention for q [M, heads, D] at positions pos[0] + i over the cache [0, pos[0] + i]."""
    m, heads, d = q.shape
    kv_heads = k_cache.shape[0]
    if out is None:
        out = torch.empty_like(q)
    grid = (triton.cdiv(m, PREFILL_TILES["BLOCK_M"]), heads)
    prefill_attn_kernel[grid](q, k_cache, v_cache, pos, out, m, LOG2E / math.sqrt(d), heads // kv_heads,
                              q.stride(0), out.stride(0), k_cache.stride(0), k_cache.stride(1), HEAD_DIM=d,
                              **PREFILL_OPTIONS, **PREFILL_TILES)
    return out


# ---------------------------------------------------------------------------------------------- sampling
def sampler_state(seed: int, top_k: int, temperature: float, top_p: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh (state int64[5], params fp32[2]) for a take; `seed` is an unsigned 64-bit value."""
    seed = int(seed) & (2**64 - 1)
    signed = seed - 2**64 if seed >= 2**63 else seed
    state = torch.zeros(5, dtype=torch.int64, device=device)
    state[STATE_SEED], state[STATE_TOP_K], state[STATE_COUNTDOWN] = signed, int(top_k), -1
    params = torch.tensor([float(temperature), float(top_p)], dtype=torch.float32, device=device)
    return state, params


def sample(logits, embed, state, params, rows, x_out):
    """Sample row `state[0]` from fp32 logits [8, 1026] (or flat), store it in rows [max_rows, 8] int32,
    advance step / stop state in `state`, and write the row's fused embedding (embed [8208, hidden]) into
    x_out [hidden] bf16."""
    hidden = embed.shape[1]
    sample_kernel[(1,)](logits, embed, state, params, rows, x_out, hidden, rows.shape[0], num_warps=16,
                        **SAMPLER_TILE)
    return x_out


def sampler_scratch(device, takes: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid sampler's scratch for up to `takes` takes: (picks int32[takes, 8], ticket counters
    int32[takes], zero between launches: each take's last program resets its own). One scratch serves
    launches that run one after the other on a stream."""
    return (torch.empty(takes, SAMPLER_GRID_TILE["CODEBOOKS"], dtype=torch.int32, device=device),
            torch.zeros(takes, dtype=torch.int32, device=device))


def sample_grid(logits, embed, state, params, rows, x_out, scratch):
    """`sample` as one program per codebook (kernels/sampler.py `sample_grid_kernel`, radix thresholds): the
    same picks, state, row and next input; `scratch` from `sampler_scratch`. Also B takes at once in
    `sample_batch`'s layout (logits [B, 8, 1026], state [B, 5], params [B, 2], rows [B, max_rows, 8],
    x_out [B, hidden]): the grid (8, B), each take sampled as it would be alone."""
    takes = state.shape[0] if state.dim() == 2 else 1
    picks, count = scratch
    assert count.numel() >= takes, f"sample_grid: scratch for {count.numel()} takes, {takes} given"
    assert logits.is_contiguous() and state.is_contiguous() and params.is_contiguous() and rows.is_contiguous()
    sample_grid_kernel[(SAMPLER_GRID_TILE["CODEBOOKS"], takes)](
        logits, embed, state, params, rows, x_out, picks, count, embed.shape[1], rows.shape[-2],
        x_out.stride(0) if x_out.dim() == 2 else 0, num_warps=SAMPLER_GRID_WARPS, **SAMPLER_GRID_TILE)
    return x_out


def sampler_states(seeds, top_ks, temperatures, top_ps, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampler_state` for B takes: (state int64[B, 5], params fp32[B, 2]), one row per take."""
    rows = [sampler_state(*a, "cpu") for a in zip(seeds, top_ks, temperatures, top_ps)]
    return torch.stack([r[0] for r in rows]).to(device), torch.stack([r[1] for r in rows]).to(device)


def sample_batch(logits, embed, state, params, rows, x_out):
    """`sample` for B takes in one launch: logits [B, 8, 1026] fp32, state [B, 5], params [B, 2], rows
    [B, max_rows, 8] int32, x_out [B, hidden] bf16; take b's row `state[b, 0]` uses its own settings,
    seed, RNG counter and stop state."""
    b, hidden = x_out.shape
    assert logits[0].numel() == SAMPLER_TILE["CODEBOOKS"] * SAMPLER_TILE["VOCAB"] and logits.is_contiguous()
    assert state.is_contiguous() and params.is_contiguous() and rows.is_contiguous()
    sample_batch_kernel[(b,)](logits, embed, state, params, rows, x_out, embed.shape[1], rows.shape[1],
                              x_out.stride(0), num_warps=16, **SAMPLER_TILE)
    return x_out


# ---------------------------------------------------------------------------------------------- host helpers
def rope_tables(theta: float, head_dim: int, max_pos: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 cos/sin tables [max_pos, head_dim] of SPEC D4: fp32 angles, `cat(freqs, freqs)`, rounded to bf16."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.bfloat16).to(device), emb.sin().to(torch.bfloat16).to(device)


def quantize_weight_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel FP8 e4m3: (w8 [N, K], scale fp32 [N]) with w ≈ w8 · scale[:, None]."""
    amax = w.float().abs().amax(dim=1).clamp(min=1e-12)
    scale = amax / FP8_MAX
    return (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale.contiguous()


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Static per-tensor FP8 e4m3 of x / scale (what the fused norm / silu·mul quantisers compute)."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(FP8)
