"""RMSNorm over rows, optionally fused with the residual add before it and with static FP8 quantisation after it.

Fuses (1) `h = x + residual` (written back to the residual stream in place), (2) `y = h·rsqrt(mean(h²)+eps)·w`
and (3) `y8 = e4m3(y / scale)` for the W8A8 path. Unfused, each of these is a separate pass over the
2560-wide hidden state per layer; on the decode path those launches, not bytes, dominate, so one kernel per
norm. One program per row; the whole row fits one tile (BLOCK_N ≥ hidden), statistics in fp32.
Rounding matches the torch reference: `h` is rounded to the residual dtype before it is normalised.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common import to_e4m3
from kernels.spec import KernelSpec


@triton.jit
def rmsnorm_kernel(X, W, Y, RES, SCALE, N, eps, stride_x, stride_y, stride_r,
                   BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(RES + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(RES.dtype.element_ty)
        tl.store(RES + row * stride_r + cols, h, mask=mask)
        x = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    if QUANT:
        y = to_e4m3(y / tl.load(SCALE))
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


# The whole row in one tile: 4096 covers hidden 2560 (and head_dim-sized norms trivially).
NORM_TILE = dict(BLOCK_N=4096)


def _spec(name, y, has_res, quant):
    return KernelSpec(
        name=name, fn=rmsnorm_kernel,
        signature={"X": "*bf16", "W": "*bf16", "Y": y, "RES": "*bf16", "SCALE": "*fp32", "N": "i32", "eps": "fp32",
                   "stride_x": "i32", "stride_y": "i32", "stride_r": "i32"},
        constexprs=dict(NORM_TILE, HAS_RESIDUAL=has_res, QUANT=quant), num_warps=8,
        divisibility_16=("X", "W", "Y", "RES", "N", "stride_x", "stride_y", "stride_r"))


KERNELS = [
    _spec("rmsnorm_bf16", "*bf16", False, False),
    _spec("rmsnorm_add_bf16", "*bf16", True, False),
    _spec("rmsnorm_fp8", "*fp8e4nv", False, True),
    _spec("rmsnorm_add_fp8", "*fp8e4nv", True, True),
]
