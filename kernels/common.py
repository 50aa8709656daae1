"""Device helpers shared by several kernel files (no kernels of their own).

`to_e4m3` quantises fp32 to FP8 e4m3 by rounding to the e4m3 grid *in fp32 first* (round-to-nearest-even,
subnormals, saturation to ±448) and only then casting. On hardware the cast of an on-grid value is exact,
so the result equals `cvt.rn.satfinite.e4m3x2.f32`; under TRITON_INTERPRET=1 it also sidesteps the
interpreter's fp32→fp8 rounding bug (shared/KERNELS.md §2: 97/4096 codes wrong, e.g. 1.97 → 1.0), so the
CPU tests can check in-kernel quantisation bit for bit against torch. Cost: ~10 ALU ops per element in
memory-bound kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@triton.jit
def to_e4m3(v):
    """fp32 tensor → float8e4nv, round-to-nearest-even with saturation (matches torch's `.to(float8_e4m3fn)`
    for finite inputs once clamped to ±448)."""
    v = tl.minimum(tl.maximum(v, -448.0), 448.0)
    bits = v.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127                   # unbiased exponent of |v|
    e = tl.maximum(e, -6)                             # below 2^-6 the grid is the subnormal step 2^-9
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)   # 3 mantissa bits → step 2^(e-3)
    # Round v/step to an integer with ties to even: |v/step| < 16, so adding 1.5·2^23 leaves an exact
    # integer in the fp32 mantissa (the classic magic-number rint).
    r = tl.abs((v / step + 12582912.0) - 12582912.0) * step
    return tl.where(v < 0, -r, r).to(tl.float8e4nv)      # keep the sign of values that round to zero
