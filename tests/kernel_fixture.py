"""Small Triton kernels that exercise the build/SASS/launcher machinery independently of the product
kernels: a bf16 GEMV (wide loads), a bf16 and an fp8 GEMM (tensor cores), and a kernel with a float
and an i64 scalar (mixed parameter packing)."""

import triton
import triton.language as tl

from kernels.spec import KernelSpec


@triton.jit
def fixture_gemv(W, X, Y, N, K, stride_w, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(W + rows[:, None] * stride_w + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < K))
        x = tl.load(X + cols, mask=cols < K)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(Y + rows, acc.to(tl.bfloat16), mask=rows < N)


@triton.jit
def fixture_gemm(A, B, C, a_scale, b_scale, M, N, K, stride_am, stride_bn, stride_cm,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALED: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + rm[:, None] * stride_am + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(B + rn[None, :] * stride_bn + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc)
    if SCALED:
        acc = acc * tl.load(a_scale) * tl.load(b_scale + rn, mask=rn < N)[None, :]
    tl.store(C + rm[:, None] * stride_cm + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def fixture_scale(X, Out, alpha, n, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < n)
    tl.store(Out + offs, x * alpha + (seed % 7).to(tl.float32), mask=offs < n)


_GEMM_SIG = {"A": "*bf16", "B": "*bf16", "C": "*fp32", "a_scale": "*fp32", "b_scale": "*fp32", "M": "i32", "N": "i32",
             "K": "i32", "stride_am": "i32", "stride_bn": "i32", "stride_cm": "i32"}
_FP8_SIG = {**_GEMM_SIG, "A": "*fp8e4nv", "B": "*fp8e4nv"}

KERNELS = [
    KernelSpec("fixture_gemv_bf16", fixture_gemv,
               {"W": "*bf16", "X": "*bf16", "Y": "*bf16", "N": "i32", "K": "i32", "stride_w": "i32"},
               {"BLOCK_N": 16, "BLOCK_K": 256}, divisibility_16=("W", "X", "Y", "K", "stride_w")),
    KernelSpec("fixture_gemm_bf16", fixture_gemm, _GEMM_SIG,
               {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "SCALED": False},
               divisibility_16=("A", "B", "C", "K", "stride_am", "stride_bn", "stride_cm")),
    KernelSpec("fixture_gemm_fp8", fixture_gemm, _FP8_SIG,
               {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "SCALED": True},
               divisibility_16=("A", "B", "C", "K", "stride_am", "stride_bn", "stride_cm")),
    KernelSpec("fixture_scale", fixture_scale, {"X": "*fp32", "Out": "*fp32", "alpha": "fp32", "n": "i32", "seed": "i64"},
               {"BLOCK": 256}, archs=(89, 90, 120)),
]
