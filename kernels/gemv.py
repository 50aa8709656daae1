"""M = 1 GEMV for the decode step: y[n] = Σ_k x[k]·W[n, k] (· scales) (+ residual[n]).

Decode is weight-bandwidth bound (every weight byte is read once per step), so this kernel exists to stream W
at full bandwidth: each program owns BLOCK_N output rows and walks K in BLOCK_K chunks whose per-thread
slices are 16-byte vector loads (8 bf16 or 16 fp8 values); the product is accumulated elementwise in fp32 and
reduced once at the end. Variants: BF16 weights, FP8 e4m3 weights with per-output-channel fp32 scales
(weight-only: bf16 activations) and W8A8 (fp8 activations with a static per-tensor scale, as written by the
fused norm / silu·mul quantisers). The epilogue optionally adds the residual stream (in place is fine: each
element is read and written by the same program), which removes the separate add kernel after o_proj and
down_proj. The product is rounded to the output dtype before the residual add, as an unfused
`residual + linear(x)` would.

The loop (`_gemv_loop`, with its input prologues `_gemv_input`) and the epilogue (`_gemv_epilogue`) are
written once here: kernels/fused.py's gemv2 runs the same loop software-pipelined behind a norm or silu·mul
prologue, and kernels/splitk.py runs it over one K range per program. They are inlined, so each kernel's
cubin is what its own copy of the loop compiled to.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common import to_e4m3
from kernels.spec import KernelSpec

PROLOGUE_NONE, PROLOGUE_NORM, PROLOGUE_SILU = 0, 1, 2


@triton.jit
def _gemv_input(X, G, X_SCALE, k0, cols, kmask, K, rstd, PROLOGUE: tl.constexpr, HAS_X_SCALE: tl.constexpr):
    """The input chunk x[k0 + cols] in fp32 (inlined). PROLOGUE_NONE reads X as it is; PROLOGUE_NORM
    normalises the residual row X (by `rstd`, times the norm weight G) and PROLOGUE_SILU forms
    silu(gate)·up from X's two halves [gate | up], each K wide. A built input is rounded where the
    unfused kernels (rmsnorm_kernel, silu_mul_kernel) store it: to bf16, or quantised to e4m3 at X_SCALE."""
    if PROLOGUE == 0:
        x = tl.load(X + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
    else:
        if PROLOGUE == 1:
            h = tl.load(X + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
            x = h * rstd * tl.load(G + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
        else:
            g = tl.load(X + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
            u = tl.load(X + K + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
            x = g / (1.0 + tl.exp(-g)) * u
        if HAS_X_SCALE:
            x = to_e4m3(x / tl.load(X_SCALE)).to(tl.float32)
        else:
            x = x.to(tl.bfloat16).to(tl.float32)
    return x


@triton.jit
def _gemv_loop(X, G, W, X_SCALE, rows, rmask, cols, k_start, k_end, K, rstd, stride_w,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr, HAS_X_SCALE: tl.constexpr,
               PIPELINE: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K] fp32 = Σ over k in [k_start, k_end) of W[rows, k] · x[k], elementwise per
    column slot (reduce it with tl.sum(acc, axis=1)); inlined. With PIPELINE the loop is software-pipelined
    by hand: the next step's weight tile is requested before this step's input chunk is built and
    multiplied, so a weight load's latency overlaps a whole loop step. `cols` is tl.arange(0, BLOCK_K),
    made by the caller before its own K bounds (that order is the one the committed cubins were built in)."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    w_ptrs = W + rows.to(tl.int64)[:, None] * stride_w + cols[None, :]
    if PIPELINE:
        w_next = tl.load(w_ptrs + k_start, mask=rmask[:, None] & ((k_start + cols) < k_end)[None, :], other=0.0)
    for k0 in range(k_start, k_end, BLOCK_K):
        if PIPELINE:
            w = w_next.to(tl.float32)
            w_next = tl.load(w_ptrs + k0 + BLOCK_K, mask=rmask[:, None] & ((k0 + BLOCK_K + cols) < k_end)[None, :],
                             other=0.0)
        kmask = (k0 + cols) < k_end
        x = _gemv_input(X, G, X_SCALE, k0, cols, kmask, K, rstd, PROLOGUE, HAS_X_SCALE)
        if not PIPELINE:
            w = tl.load(w_ptrs + k0, mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
    return acc


@triton.jit
def _gemv_epilogue(y, W_SCALE, X_SCALE, R, Y, rows, rmask,
                   HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Scales, the residual (the product rounded to the output dtype first, as an unfused add) and the
    store of y [BLOCK_N] fp32, the rows' sums (inlined)."""
    if HAS_W_SCALE:
        y = y * tl.load(W_SCALE + rows, mask=rmask, other=0.0)
    if HAS_X_SCALE:
        y = y * tl.load(X_SCALE)
    if HAS_RESIDUAL:
        r = tl.load(R + rows, mask=rmask, other=0.0).to(tl.float32)
        y = y.to(Y.dtype.element_ty).to(tl.float32) + r
    tl.store(Y + rows, y.to(Y.dtype.element_ty), mask=rmask)


@triton.jit
def gemv_kernel(X, W, W_SCALE, X_SCALE, R, Y, N, K, stride_w,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = _gemv_loop(X, X, W, X_SCALE, rows, rmask, cols, 0, K, K, 1.0, stride_w, BLOCK_N, BLOCK_K,
                     PROLOGUE=0, HAS_X_SCALE=False, PIPELINE=False)
    _gemv_epilogue(tl.sum(acc, axis=1), W_SCALE, X_SCALE, R, Y, rows, rmask, HAS_W_SCALE, HAS_X_SCALE,
                   HAS_RESIDUAL)


# 8 rows per program: N = 2560 (o_proj, down) gives 320 programs, ≥ 2 per SM on 132 SMs, so no SM idles
# behind a 1.2-wave tail (16 rows would give 160); qkv (6144) 768, gate_up (19456) 2432. Per loop step each
# of the 128 threads issues two 16-byte loads (8×256 bf16 or 8×512 fp8 = 4 KB per step). Not yet tuned on a
# GPU: BLOCK_N / BLOCK_K / num_warps are the knobs, and only KERNELS + this dict change.
GEMV_TILES = {"bf16": dict(BLOCK_N=8, BLOCK_K=256), "fp8": dict(BLOCK_N=8, BLOCK_K=512)}


def _spec(name, x, w, y, *, w_scale, x_scale, residual):
    tiles = GEMV_TILES["fp8" if w == "*fp8e4nv" else "bf16"]
    return KernelSpec(
        name=name, fn=gemv_kernel,
        signature={"X": x, "W": w, "W_SCALE": "*fp32", "X_SCALE": "*fp32", "R": "*bf16", "Y": y,
                   "N": "i32", "K": "i32", "stride_w": "i32"},
        constexprs=dict(tiles, HAS_W_SCALE=w_scale, HAS_X_SCALE=x_scale, HAS_RESIDUAL=residual),
        num_warps=4, divisibility_16=("X", "W", "Y", "K", "stride_w"))


KERNELS = [
    _spec("gemv_bf16", "*bf16", "*bf16", "*bf16", w_scale=False, x_scale=False, residual=False),
    _spec("gemv_bf16_res", "*bf16", "*bf16", "*bf16", w_scale=False, x_scale=False, residual=True),
    _spec("gemv_bf16_f32out", "*bf16", "*bf16", "*fp32", w_scale=False, x_scale=False, residual=False),
    _spec("gemv_w8a16", "*bf16", "*fp8e4nv", "*bf16", w_scale=True, x_scale=False, residual=False),
    _spec("gemv_w8a16_res", "*bf16", "*fp8e4nv", "*bf16", w_scale=True, x_scale=False, residual=True),
    _spec("gemv_w8a8", "*fp8e4nv", "*fp8e4nv", "*bf16", w_scale=True, x_scale=True, residual=False),
    _spec("gemv_w8a8_res", "*fp8e4nv", "*fp8e4nv", "*bf16", w_scale=True, x_scale=True, residual=True),
]
