"""Audio head with the final RMSNorm fused in: logits[8·1026] = rmsnorm(h, g) · Wᵀ in fp32, W = the fused
[8208, hidden] audio embedding (tied head, SPEC Part 2 §3.3).

The head is the biggest single GEMV after the MLP (8208 rows); fusing the final norm saves a launch and a
round trip of h: every program recomputes rstd from the 2560-wide h (5 KB from L2) before streaming its
rows of W. The normalised h is rounded to bf16 before the product, exactly as an unfused
`head(norm(h))` in bf16 sees it, and logits are written in fp32 for the sampler (SPEC D4).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.spec import KernelSpec


@triton.jit
def audio_head_kernel(H, NORM_W, W, Y, N, K, eps, stride_w,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_NORM: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    cols = tl.arange(0, BLOCK_K)
    rstd = 1.0
    if HAS_NORM:
        ss = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(H + k0 + cols, mask=(k0 + cols) < K, other=0.0).to(tl.float32)
            ss += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    w_ptrs = W + rows.to(tl.int64)[:, None] * stride_w + cols[None, :]
    for k0 in range(0, K, BLOCK_K):
        kmask = (k0 + cols) < K
        x = tl.load(H + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
        if HAS_NORM:
            g = tl.load(NORM_W + k0 + cols, mask=kmask, other=0.0).to(tl.float32)
            x = (x * rstd * g).to(tl.bfloat16).to(tl.float32)
        w = tl.load(w_ptrs + k0, mask=rmask[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
    tl.store(Y + rows, tl.sum(acc, axis=1), mask=rmask)


# 16 rows per program → 513 programs for 8208 rows; 16-byte bf16 loads.
HEAD_TILES = dict(BLOCK_N=16, BLOCK_K=256)

KERNELS = [
    KernelSpec(
        name="audio_head_norm_bf16", fn=audio_head_kernel,
        signature={"H": "*bf16", "NORM_W": "*bf16", "W": "*bf16", "Y": "*fp32", "N": "i32", "K": "i32",
                   "eps": "fp32", "stride_w": "i32"},
        constexprs=dict(HEAD_TILES, HAS_NORM=True), num_warps=4, divisibility_16=("H", "W", "K", "stride_w")),
]
