"""Launch arguments packed exactly as the driver receives them: tensors as device pointers, ints range-checked,
floats as fp32, then Triton's two hidden scratch pointers. Pure Python over a manifest entry (no driver), so
the CPU tests compare the packing with each cubin's own parameter table.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kernels import manifest as mf

# Triton pointer type -> torch dtype name, to refuse a tensor of the wrong dtype before it reaches a kernel.
POINTER_DTYPES = {"*bf16": "bfloat16", "*fp16": "float16", "*fp32": "float32", "*fp8e4nv": "float8_e4m3fn",
                  "*i64": "int64", "*i32": "int32", "*i16": "int16", "*i8": "int8", "*u8": "uint8", "*i1": "bool"}
_INT_RANGES = {"i32": (-2**31, 2**31), "u32": (0, 2**32), "i64": (-2**63, 2**63), "u64": (0, 2**64)}


@dataclass
class Packed:
    values: list            # Python ints / floats in parameter order, scratch pointers last
    format: str             # struct codes, one per value (what PyCUDA's prepare() takes)

    def buffer(self) -> bytes:
        """The argument buffer as the driver receives it from PyCUDA (native alignment)."""
        return struct.pack("@" + self.format, *self.values)


def pack_args(entry: mf.KernelEntry, args, scratch=(0, 0), device_type: str = "cuda",
              strict_dtypes: bool = True) -> Packed:
    """Typed launch arguments for `entry`: tensors -> device pointers, None -> null pointer, ints ->
    range-checked integers, floats -> fp32; then Triton's two hidden scratch pointers.

    Checks what would otherwise corrupt memory silently: the argument count, a tensor's device, the
    16-divisibility the cubin was compiled to assume, and (strict_dtypes) each tensor's dtype. Triton's
    own launcher does not check dtypes either; `ops.py` passes placeholder tensors for pointers a
    variant never reads, so the ops shim resolves variants by dtype and packs with strict_dtypes=False."""
    params = entry.user_params
    if len(args) != len(params):
        raise TypeError(f"{entry.name} takes {len(params)} arguments ({', '.join(p.name for p in params)}), "
                        f"got {len(args)}")
    values = []
    for p, a in zip(params, args):
        if p.type.startswith("*"):
            if a is None:
                values.append(0)
                continue
            dtype = getattr(a, "dtype", None)
            if dtype is None or not hasattr(a, "data_ptr"):
                raise TypeError(f"{entry.name}.{p.name} ({p.type}) needs a tensor, got {type(a).__name__}")
            want = POINTER_DTYPES.get(p.type)
            if strict_dtypes and want and str(dtype).removeprefix("torch.") != want:
                raise TypeError(f"{entry.name}.{p.name} expects {want}, got {dtype}")
            if a.device.type != device_type:
                raise TypeError(f"{entry.name}.{p.name} is on {a.device}, expected a {device_type} tensor")
            if p.name in entry.divisibility_16 and a.data_ptr() % 16:
                raise ValueError(f"{entry.name}.{p.name} must be 16-byte aligned (the cubin assumes it)")
            values.append(a.data_ptr())
        elif p.type in _INT_RANGES:
            if isinstance(a, bool) or not isinstance(a, int):
                raise TypeError(f"{entry.name}.{p.name} ({p.type}) needs an int, got {type(a).__name__}")
            lo, hi = _INT_RANGES[p.type]
            if not lo <= a < hi:
                raise OverflowError(f"{entry.name}.{p.name}={a} does not fit {p.type}")
            if p.name in entry.divisibility_16 and a % 16:
                raise ValueError(f"{entry.name}.{p.name}={a} must be a multiple of 16 (the cubin assumes it)")
            values.append(a)
        elif p.type in ("fp32", "fp64"):
            values.append(float(a))
        else:
            raise TypeError(f"{entry.name}.{p.name}: unsupported parameter type {p.type}")
    values += list(scratch)
    return Packed(values, entry.struct_format)


def grid3(grid) -> tuple[int, int, int]:
    g = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(g) <= 3 or any(int(x) < 1 for x in g):
        raise ValueError(f"grid must be 1-3 positive ints, got {grid}")
    return tuple(int(x) for x in g) + (1,) * (3 - len(g))
