"""Split-K GEMVs for the N = 2560 projections of the decode step (o_proj, down): the cubin backend's
variant "v3", otherwise the v2 step of kernels/fused.py.

With whole rows per program, o_proj and down launch only 320 programs of 8 rows: about 10 KB of weights
in flight per SM where ~30 KB cover HBM latency. Here each row block is also split over K into SPLIT_K
fixed ranges (multiples of BLOCK_K, the same for every launch of a shape), so the grid has SPLIT_K times
the programs. Each program streams its range exactly as gemv2_kernel streams a row (the next tile's
weight loads issued before this tile's input is built; the silu·mul prologue, rounded to bf16 or
quantised to e4m3 at the static scale where silu_mul_kernel stores it) and stores an fp32 partial per
row. The reduction is deterministic with no float atomics: after storing, each program takes a ticket
from its row block's int32 counter (acquire-release), and the one that draws SPLIT_K - 1 adds the
partials in split order 0, 1, ... (read through L2), applies the scales and the residual, stores the
rows and resets the counter for the next launch. The sum order is fixed, so the result does not depend
on which program finishes last; it differs from v2's (one accumulation over all of K) by fp32 rounding.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.gemv import _gemv_epilogue, _gemv_loop
from kernels.spec import KernelSpec


@triton.jit
def gemv_splitk_kernel(X, W, W_SCALE, X_SCALE, R, Y, PART, COUNT, N, K, stride_w,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, SILU: tl.constexpr,
                       HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    k_chunk = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = split * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    acc = _gemv_loop(X, X, W, X_SCALE, rows, rmask, cols, k_start, k_end, K, 1.0, stride_w, BLOCK_N, BLOCK_K,
                     PROLOGUE=2 if SILU else 0, HAS_X_SCALE=HAS_X_SCALE, PIPELINE=True)
    tl.store(PART + split * N + rows, tl.sum(acc, axis=1), mask=rmask)
    tl.debug_barrier()                          # every thread's partial is stored before the ticket is taken
    ticket = tl.atomic_add(COUNT + pid, 1, sem="acq_rel")
    if ticket == SPLIT_K - 1:
        y = tl.zeros((BLOCK_N,), tl.float32)
        for sp in tl.static_range(SPLIT_K):
            y += tl.load(PART + sp * N + rows, mask=rmask, other=0.0, cache_modifier=".cg")
        _gemv_epilogue(y, W_SCALE, X_SCALE, R, Y, rows, rmask, HAS_W_SCALE, HAS_X_SCALE, HAS_RESIDUAL)
        tl.store(COUNT + pid, 0)


# v2's tiles (kernels/fused.py: four 16-byte weight loads per thread per step) and 4 splits: N = 2560 gives
# 1280 programs. Not tuned on a GPU yet: SPLIT_K and the tiles are the knobs.
SPLITK_TILES = {"bf16": dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=4), "fp8": dict(BLOCK_N=8, BLOCK_K=1024, SPLIT_K=4)}


def _spec(name, w, *, silu, w_scale, x_scale):
    return KernelSpec(
        name=name, fn=gemv_splitk_kernel,
        signature={"X": "*bf16", "W": w, "W_SCALE": "*fp32", "X_SCALE": "*fp32", "R": "*bf16", "Y": "*bf16",
                   "PART": "*fp32", "COUNT": "*i32", "N": "i32", "K": "i32", "stride_w": "i32"},
        constexprs=dict(SPLITK_TILES["fp8" if w == "*fp8e4nv" else "bf16"], SILU=silu, HAS_W_SCALE=w_scale,
                        HAS_X_SCALE=x_scale, HAS_RESIDUAL=True),
        num_warps=4, divisibility_16=("X", "W", "Y", "PART", "K", "stride_w"))


KERNELS = [
    _spec("gemv3_bf16_res", "*bf16", silu=False, w_scale=False, x_scale=False),
    _spec("gemv3_w8a16_res", "*fp8e4nv", silu=False, w_scale=True, x_scale=False),
    _spec("gemv3_silu_bf16_res", "*bf16", silu=True, w_scale=False, x_scale=False),
    _spec("gemv3_silu_w8a8_res", "*fp8e4nv", silu=True, w_scale=True, x_scale=True),
]
