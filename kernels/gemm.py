"""Prefill GEMM: C[M, N] = A[M, K] · W[N, K]ᵀ (· scales) (+ residual), BF16 or FP8 W8A8 (also FP8 weights
with bf16 activations, the weight converted to bf16 in registers, exact).

Prefill is compute bound, so this is the tensor-core path: tl.dot on 64×128 tiles (64 rows so that Triton
emits wgmma/QGMMA on SM90 — with fewer rows Hopper falls back to mma.sync, and fp8 mma.sync is emulated
there; KERNELS.md §1), fp32 accumulation, per-output-channel weight scale and per-tensor activation scale in
the epilogue, optional residual add (product rounded to the output dtype first, as an unfused add).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.spec import KernelSpec


@triton.jit
def gemm_kernel(A, W, W_SCALE, A_SCALE, R, C, M, N, K, stride_am, stride_wn, stride_cm, stride_rm,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                HAS_W_SCALE: tl.constexpr, HAS_A_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    mmask = rm < M
    nmask = rn < N
    a_ptrs = A + rm.to(tl.int64)[:, None] * stride_am + rk[None, :]
    w_ptrs = W + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]          # [BLOCK_K, BLOCK_N] view of Wᵀ
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + rk) < K
        a = tl.load(a_ptrs + k0, mask=mmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(w_ptrs + k0, mask=kmask[:, None] & nmask[None, :], other=0.0)
        # On sm_90 Triton's default (2**30) lets FP8 wgmma accumulate in its reduced-precision
        # accumulator over all of K; BLOCK_K promotes into the fp32 acc after every K tile, as
        # DeepSeek-V3 §3.3.2 found necessary for K in the thousands. Ignored for bf16 and off Hopper.
        acc = tl.dot(a, w.to(a.dtype), acc, max_num_imprecise_acc=BLOCK_K)
    if HAS_W_SCALE:
        acc = acc * tl.load(W_SCALE + rn, mask=nmask, other=0.0)[None, :]
    if HAS_A_SCALE:
        acc = acc * tl.load(A_SCALE)
    cmask = mmask[:, None] & nmask[None, :]
    if HAS_RESIDUAL:
        r = tl.load(R + rm.to(tl.int64)[:, None] * stride_rm + rn[None, :], mask=cmask, other=0.0).to(tl.float32)
        acc = acc.to(C.dtype.element_ty).to(tl.float32) + r
    tl.store(C + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :], acc.to(C.dtype.element_ty), mask=cmask)


GEMM_TILES = {"bf16": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64), "fp8": dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128)}
# Software-pipeline depth per activation type. bf16 with 3 stages sat at 168 registers on sm_120a and
# spilled 16 B (gemm_bf16); 2 stages take 140 registers and 24 KB of shared memory, so three CTAs fit per
# SM where 48 KB allowed two. sm_90a keeps its 64x128 HGMMA.
GEMM_STAGES = {"bf16": 2, "fp8": 3}


def _spec(name, a, w, *, w_scale, a_scale, residual):
    kind = "fp8" if a == "*fp8e4nv" else "bf16"
    tiles = GEMM_TILES[kind]
    return KernelSpec(
        name=name, fn=gemm_kernel,
        signature={"A": a, "W": w, "W_SCALE": "*fp32", "A_SCALE": "*fp32", "R": "*bf16", "C": "*bf16",
                   "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_wn": "i32", "stride_cm": "i32",
                   "stride_rm": "i32"},
        constexprs=dict(tiles, HAS_W_SCALE=w_scale, HAS_A_SCALE=a_scale, HAS_RESIDUAL=residual),
        num_warps=4, num_stages=GEMM_STAGES[kind],
        divisibility_16=("A", "W", "C", "K", "stride_am", "stride_wn", "stride_cm"))


KERNELS = [
    _spec("gemm_bf16", "*bf16", "*bf16", w_scale=False, a_scale=False, residual=False),
    _spec("gemm_bf16_res", "*bf16", "*bf16", w_scale=False, a_scale=False, residual=True),
    _spec("gemm_w8a16", "*bf16", "*fp8e4nv", w_scale=True, a_scale=False, residual=False),
    _spec("gemm_w8a16_res", "*bf16", "*fp8e4nv", w_scale=True, a_scale=False, residual=True),
    _spec("gemm_w8a8", "*fp8e4nv", "*fp8e4nv", w_scale=True, a_scale=True, residual=False),
    _spec("gemm_w8a8_res", "*fp8e4nv", "*fp8e4nv", w_scale=True, a_scale=True, residual=True),
]
