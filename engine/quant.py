"""Weight-only quantised projection matrices for the CPU path: int8 per output channel and int4 in groups
of 128, multiplied by torch's own CPU kernels with bf16 activations.

Why: a decode step reads every projection weight once, so on a CPU it is bound by memory bandwidth at one
row and, on CPUs without native bf16 (AMD Zen 3, AVX2), by bf16 arithmetic at several rows. Halving the
bytes (int8) roughly halves the step; the kernels below convert in registers and keep the fp32 sums.

- `Int8Weight`: W ≈ q · s, q int8 [N, K] symmetric in [−127, 127], s [N] (bf16) the row's max |w| / 127.
  `aten._weight_int8pack_mm(x[M, K] bf16, q, s)` is vectorised (AVX2 / AVX-512) for bf16 inputs only.
- `Int4Weight`: W ≈ (q − 8) · scale + zero per group of 128 along K (64 or 32 for the narrow matrices of
  small test models), q in [0, 15], asymmetric (the group's min and max). `aten._convert_weight_to_int4pack_for_cpu` packs q in a layout that depends on the CPU's
  ISA, so packing happens at load, never in a file; `aten._weight_int4pack_mm_for_cpu` multiplies.

Both kernels compute each output row from its own input row alone: a row's result does not depend on M
(checked by `HiggsModel.calibrate_rows` like every GEMM of the step). The embeddings, norms and the audio
head are not quantised (TTS fidelity, cloning above all, suffers first from a coarse head)."""

from __future__ import annotations

import ctypes
import os

import torch
import torch.nn.functional as F

INT4_GROUP = 128
# The precisions whose projection matrices are stored packed (activations and everything else run bf16).
QUANTIZED = ("int8", "int4")


class Int8Weight:
    """An int8 weight-only matrix; `w(x)` is `x @ W.T` for bf16 x [M, K]."""

    kind = "int8"

    def __init__(self, q: torch.Tensor, scales: torch.Tensor):
        self.q, self.scales = q, scales
        self.shape = tuple(q.shape)

    @classmethod
    def from_float(cls, w: torch.Tensor) -> "Int8Weight":
        w = w.float()
        scales = _bf16_at_least((w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.bfloat16).tiny))
        # Rounded against the bf16 scale the kernel multiplies by, so |w − q·s| ≤ s/2 exactly as stored.
        q = torch.round(w / scales.float()[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scales)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scales)

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scales.float()[:, None]

    def dequantized_into(self, scratch: torch.Tensor) -> torch.Tensor:
        """q · s in `scratch`'s dtype (one rounding of the exact product), as a view of its first N·K
        elements: a prefill multiplies that with one GEMM (`linear`). In two vectorised passes: q is exact in
        bf16 (|q| ≤ 127), so the in-place product rounds once, as a mixed int8 · bf16 `mul` does, at a fifth
        of that op's time (its type promotion runs a scalar loop: 84 against 17 ms for the 4B model's gate/up
        matrix on an AVX-512 CPU)."""
        n, k = self.shape
        out = scratch[:n * k].view(n, k)
        out.copy_(self.q)
        return out.mul_(self.scales[:, None])

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes


class Int4Weight:
    """An int4 weight-only matrix in groups of `group` (`INT4_GROUP` where K allows) along K, packed for
    this CPU."""

    kind = "int4"

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor, shape: tuple[int, int], group: int):
        self.packed, self.scales_zeros, self.shape, self.group = packed, scales_zeros, shape, group

    @classmethod
    def from_float(cls, w: torch.Tensor) -> "Int4Weight":
        n, k = w.shape
        group = next((g for g in (INT4_GROUP, 64, 32) if k % g == 0), None)  # the kernel's group sizes
        if group is None or n % 16:
            raise ValueError(f"int4 needs the input width ({k}) to be a multiple of 32 and the output width ({n}) "
                             "a multiple of 16")
        g = w.float().view(n, k // group, group)
        low, high = g.amin(-1), g.amax(-1)
        scale = _bf16_at_least(((high - low) / 15).clamp(min=torch.finfo(torch.bfloat16).tiny))
        # (q − 8)·scale + zero = q·scale + low  ⇔  zero = low + 8·scale, both as the bf16 the kernel reads.
        zero = (low + 8 * scale.float()).to(torch.bfloat16)
        q = torch.round((g - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp_(0, 15)
        q = q.to(torch.int32).view(n, k)
        scales_zeros = torch.stack([scale.t(), zero.t()], -1).contiguous()  # [K/group, N, 2]
        inner_k_tiles = 8 if k % (8 * 16) == 0 else 2
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, inner_k_tiles)
        return cls(packed, scales_zeros, (n, k), group)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group, self.scales_zeros)

    def dequantized(self) -> torch.Tensor:
        """The matrix the kernel multiplies by (from the kernel itself, so the packing is covered too)."""
        eye = torch.eye(self.shape[1], dtype=torch.bfloat16)
        return self(eye).float().t()

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes


PACKED = {"int8": Int8Weight, "int4": Int4Weight}


def _bf16_at_least(x: torch.Tensor) -> torch.Tensor:
    """x in bf16, rounded up where rounding to nearest went down (a scale must cover the range it scales)."""
    b = x.to(torch.bfloat16)
    return torch.where(b.float() < x, torch.nextafter(b, torch.full_like(b, float("inf"))), b)


def quantize(w: torch.Tensor, kind: str):
    """A float [N, K] matrix as the `kind` ("int8" / "int4") weight-only matrix."""
    return PACKED[kind].from_float(w)


def linear(x: torch.Tensor, w, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ w.T` for a float weight or a packed one (the model's one spelling of a projection). With
    `scratch` (a prefill's many rows, `HiggsModel.gemm_rows`) a packed int8 matrix is dequantised into it
    and multiplied by one GEMM in the scratch's dtype: the packed kernel runs a GEMV per row block, which at
    40 rows costs 2.7× a bf16 GEMM on a CPU with native bf16 (docs/PERFORMANCE.md)."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w)
    if scratch is not None and isinstance(w, Int8Weight):
        return F.linear(x, w.dequantized_into(scratch))
    return w(x)


def weight_bytes(w) -> int:
    return w.nbytes if not isinstance(w, torch.Tensor) else w.numel() * w.element_size()


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_PAGEOUT = 21  # Linux ≥ 5.4: reclaim these pages; the contents stay what they were
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):
    _libc = None


def release_pages(tensor: torch.Tensor) -> None:
    """Ask the kernel to drop the resident pages under `tensor` once it has been read for the last time.

    A checkpoint's tensors are views of a memory-mapped file: every page read while quantising stays
    resident (and counts in the process's RSS) for as long as the file is mapped, which is as long as any
    of its tensors lives. MADV_PAGEOUT reclaims them without changing what the memory holds: file pages are
    simply read again if touched, and anonymous memory without swap stays. Where the call is missing
    (not Linux, older kernels) this does nothing."""
    if not hasattr(_libc, "madvise") or tensor.device.type != "cpu":
        return
    start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    low = -(-start // _PAGE) * _PAGE
    high = (start + size) // _PAGE * _PAGE
    if high > low:
        _libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), _MADV_PAGEOUT)


__all__ = ["Int8Weight", "Int4Weight", "QUANTIZED", "INT4_GROUP", "quantize", "linear", "weight_bytes",
           "release_pages"]
