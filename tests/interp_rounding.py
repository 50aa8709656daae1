"""Make Triton 3.9's CPU interpreter do bf16 arithmetic the way the GPU does.

The interpreter converts fp32 → bf16 by *truncating* the mantissa (`interpreter._convert_float` with no
rounding mode: 4890 of 10000 random values differ from torch's round-to-nearest-even), and its fp32 → fp8
path loses the carry into the exponent (shared/KERNELS.md §2). On hardware both casts are `cvt.rn`
(round to nearest even). Every kernel stores bf16, so without this fix a CPU test would compare against the
wrong rounding; with it the interpreter rounds exactly like torch (and like the GPU). The bf16 rounding is
torch's formula in numpy (no round trip through torch tensors), NaNs aside, which torch itself converts.

Second defect: `tl.dot` on bf16 operands multiplies the raw uint16 storage as integers (numpy has no
bf16; fp8 operands are decoded first, bf16 ones are not), giving values ~1e11 for O(1) inputs. The fix
decodes bf16 operands to fp32 (exact) before the matmul, which is what the tensor cores compute
(exact products, fp32 accumulation). Upstream: triton-lang/triton#11584 (fix PR #11585 closed unmerged,
"we just don't support it yet"); Triton's debugging guide says the interpreter does not support bf16
arithmetic — so every kernel here converts bf16 to fp32 before any arithmetic, and only tl.dot needs this.

Not a defect but a cost: the interpreter patches `triton.language` (inspect.getmembers over tl, tl.tensor,
tl.math, ...) at every kernel launch and again at every call of a @triton.jit helper inside it, once per
program and loop step. The launch's patch is still in force during those calls, so re-patching changes
nothing; `install()` skips it for a helper called on the launching thread whose language modules are
already patched in this launch (a quarter of the kernel tests' time). Two smaller costs go the same way,
each bit for bit what the interpreter computed: its bf16 → fp32 upcast (a bit-by-bit decode, run for every
bf16 load) is one shift where no bf16 subnormal is present (those keep the interpreter's own path), and its
numpy dtype lookup (a dict rebuilt at every call) is a table. `speed_ups()` installs these three alone.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

_TORCH = {tl.bfloat16: (torch.bfloat16, torch.int16, np.uint16), tl.float16: (torch.float16, torch.int16, np.uint16),
          tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8, np.uint8)}
_original = interpreter._convert_float


def _convert_float(input, input_dtype, output_dtype, rounding_mode):
    if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
        bits = np.asarray(input).view(np.uint32)
        if not np.isnan(bits.view(np.float32)).any():  # torch's round to nearest even, as numpy (NaNs: torch's)
            return ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16, order="C").reshape(input.shape)
    if input_dtype == tl.float32 and output_dtype in _TORCH:
        dst, as_int, np_out = _TORCH[output_dtype]
        x = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
        return x.to(dst).view(as_int).numpy().view(np_out).reshape(input.shape)
    return _exact_convert_float(input, input_dtype, output_dtype, rounding_mode)


def _exact_convert_float(input, input_dtype, output_dtype, rounding_mode):
    """The interpreter's own conversion, its bf16 → fp32 upcast as one shift where that is bit-identical."""
    if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
        bits = np.asarray(input).view(np.uint16)
        if not (((bits & 0x7F80) == 0) & ((bits & 0x7F) != 0)).any():
            return (bits.astype(np.uint32, order="C") << 16).reshape(input.shape)
    return _original(input, input_dtype, output_dtype, rounding_mode)


_original_np_dtype = interpreter._get_np_dtype
_NP_DTYPES = {t: _original_np_dtype(t) for t in (
    tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32,
    tl.int64, tl.uint64, tl.bfloat16, tl.float8e5, tl.float8e5b16, tl.float8e4nv, tl.float8e4b8, tl.float8e4b15)}
_U64 = np.dtype(np.uint64)


def _get_np_dtype(tt_dtype):
    if isinstance(tt_dtype, tl.block_type):
        tt_dtype = tt_dtype.element_ty
    if isinstance(tt_dtype, tl.pointer_type):
        return _U64
    found = _NP_DTYPES.get(tt_dtype)
    return _original_np_dtype(tt_dtype) if found is None else found


_original_dot = interpreter.InterpreterBuilder.create_dot


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    def decode(t):
        if t.dtype.scalar == tl.bfloat16:
            data = _exact_convert_float(t.data, tl.bfloat16, tl.float32, None).view(np.float32)  # exact
            return interpreter.TensorHandle(data, tl.float32)
        return t
    return _original_dot(self, decode(a), decode(b), d, input_precision, max_num_imprecise_acc)


_original_patch_lang = interpreter._patch_lang
_original_launch = interpreter.GridExecutor.__call__
_launches = threading.local()   # per thread: one entry per running launch, the language modules it patched


def _langs(fn) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


class _AlreadyPatched:
    def restore(self) -> None:   # a helper's call never restores its scope (InterpretedFunction.__call__)
        pass


def _patch_lang(fn):
    stack = getattr(_launches, "stack", None)
    langs = _langs(fn)
    if stack and stack[-1] is not None and langs <= stack[-1]:
        return _AlreadyPatched()
    scope = _original_patch_lang(fn)
    if stack:   # the launch's own patch (made first), or a helper's that also reached tl.core (tl.standard's)
        stack[-1] = langs | (stack[-1] or frozenset())
    return scope


def _launch(self, *args, **kwargs):
    stack = _launches.__dict__.setdefault("stack", [])
    stack.append(None)
    try:
        return _original_launch(self, *args, **kwargs)
    finally:
        stack.pop()


def speed_ups() -> None:
    """The speed-ups alone, no arithmetic changed (tests/interp_python.py gives them to a subprocess)."""
    interpreter._convert_float = _exact_convert_float
    interpreter._get_np_dtype = _get_np_dtype
    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = _launch


def install() -> None:
    speed_ups()
    interpreter._convert_float = _convert_float
    interpreter.InterpreterBuilder.create_dot = _create_dot
