"""Make Triton 3.9's CPU interpreter do bf16 arithmetic the way the GPU does.

The interpreter converts fp32 → bf16 by *truncating* the mantissa (`interpreter._convert_float` with no
rounding mode: 4890 of 10000 random values differ from torch's round-to-nearest-even), and its fp32 → fp8
path loses the carry into the exponent (shared/KERNELS.md §2). On hardware both casts are `cvt.rn`
(round to nearest even). Every kernel stores bf16, so without this fix a CPU test would compare against the
wrong rounding; with it the interpreter rounds exactly like torch (and like the GPU).

Second defect: `tl.dot` on bf16 operands multiplies the raw uint16 storage as integers (numpy has no
bf16; fp8 operands are decoded first, bf16 ones are not), giving values ~1e11 for O(1) inputs. The fix
decodes bf16 operands to fp32 (exact) before the matmul, which is what the tensor cores compute
(exact products, fp32 accumulation). Upstream: triton-lang/triton#11584 (fix PR #11585 closed unmerged,
"we just don't support it yet"); Triton's debugging guide says the interpreter does not support bf16
arithmetic — so every kernel here converts bf16 to fp32 before any arithmetic, and only tl.dot needs this.
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

_TORCH = {tl.bfloat16: (torch.bfloat16, torch.int16, np.uint16), tl.float16: (torch.float16, torch.int16, np.uint16),
          tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8, np.uint8)}
_original = interpreter._convert_float


def _convert_float(input, input_dtype, output_dtype, rounding_mode):
    if input_dtype == tl.float32 and output_dtype in _TORCH:
        dst, as_int, np_out = _TORCH[output_dtype]
        x = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
        return x.to(dst).view(as_int).numpy().view(np_out).reshape(input.shape)
    return _original(input, input_dtype, output_dtype, rounding_mode)


_original_dot = interpreter.InterpreterBuilder.create_dot


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    def decode(t):
        if t.dtype.scalar == tl.bfloat16:
            data = _original(t.data, tl.bfloat16, tl.float32, None).view(np.float32)   # exact upcast
            return interpreter.TensorHandle(data, tl.float32)
        return t
    return _original_dot(self, decode(a), decode(b), d, input_precision, max_num_imprecise_acc)


def install() -> None:
    interpreter._convert_float = _convert_float
    interpreter.InterpreterBuilder.create_dot = _create_dot
