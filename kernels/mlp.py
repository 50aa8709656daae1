"""SwiGLU activation: y = silu(gate) · up, read from the fused gate_up projection output, optionally quantised
to FP8 e4m3 with a static per-tensor scale for the W8A8 down projection.

Fusing the activation, the product and the quantisation means the 9728-wide intermediate is written once
(1 byte per element on the fp8 path) instead of three times. `gate_up` rows are `[gate (I) | up (I)]`, as
the fused gate_up weight `cat([gate_proj, up_proj])` produces. Computed in fp32, rounded once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.common import to_e4m3
from kernels.spec import KernelSpec


@triton.jit
def silu_mul_kernel(GU, Y, SCALE, inter, stride_gu, stride_y, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    base = GU + row.to(tl.int64) * stride_gu
    g = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(base + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    if QUANT:
        y = to_e4m3(y / tl.load(SCALE))
    tl.store(Y + row.to(tl.int64) * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


# 1024 columns per program: 10 programs per row for I = 9728 (decode), many rows in prefill.
SILU_TILE = dict(BLOCK=1024)


def _spec(name, y, quant):
    return KernelSpec(
        name=name, fn=silu_mul_kernel,
        signature={"GU": "*bf16", "Y": y, "SCALE": "*fp32", "inter": "i32", "stride_gu": "i32", "stride_y": "i32"},
        constexprs=dict(SILU_TILE, QUANT=quant), num_warps=4,
        divisibility_16=("GU", "Y", "inter", "stride_gu", "stride_y"))


KERNELS = [_spec("silu_mul_bf16", "*bf16", False), _spec("silu_mul_fp8", "*fp8e4nv", True)]
