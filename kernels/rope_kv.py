"""Per-head q/k RMSNorm + NeoX RoPE + KV-cache write, for one decode row or a batch of prefill rows.

Qwen3 normalises every q and k head (q_norm / k_norm), rotates them, and the step then needs k and v in the
cache: unfused that is three passes and a copy per layer. Here one program handles one (row, head) of the
fused qkv projection output: a q head goes to `q_out`, a kv head writes its rotated k and its v straight
into the cache. The position is read from DEVICE memory (`pos[0]` + row index), not passed as a scalar, so
one captured CUDA graph serves every decode step and a prefill segment can start at any cache offset.
cos/sin are the bf16-rounded tables of SPEC D4 ([max_pos, head_dim], `cat(freqs, freqs)` layout); the
normalised head is rounded to bf16 (as the reference's bf16 q_norm output) and rotated in fp32.
Cache layout: [kv_heads, max_pos, head_dim] per layer, so attention streams each kv head contiguously.

`qk_norm_rope_kv_batch_kernel` is the batched decode step's form: row b of the qkv output is one
take's next row, at its own position POS[b] in its own cache slot SLOTS[b] of caches [slots, kv_heads,
max_pos, head_dim]. One program per (row, head) as above, so a row's q, k and v do not depend on the other
rows. A row with POS[b] < 0 is a bucket's padding row: its q is computed at position 0 (finite, discarded)
and it writes nothing, so it cannot touch a take's cache.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.spec import KernelSpec


@triton.jit
def _norm_rope(src, w_ptr, cos_ptr, sin_ptr, dst, eps, HALF: tl.constexpr):
    i = tl.arange(0, HALF)
    x1 = tl.load(src + i).to(tl.float32)
    x2 = tl.load(src + HALF + i).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
    x1 = (x1 * rstd * tl.load(w_ptr + i).to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    x2 = (x2 * rstd * tl.load(w_ptr + HALF + i).to(tl.float32)).to(tl.bfloat16).to(tl.float32)
    c1 = tl.load(cos_ptr + i).to(tl.float32)
    c2 = tl.load(cos_ptr + HALF + i).to(tl.float32)
    s1 = tl.load(sin_ptr + i).to(tl.float32)
    s2 = tl.load(sin_ptr + HALF + i).to(tl.float32)
    tl.store(dst + i, (x1 * c1 - x2 * s1).to(dst.dtype.element_ty))
    tl.store(dst + HALF + i, (x2 * c2 + x1 * s2).to(dst.dtype.element_ty))


@triton.jit
def qk_norm_rope_kv_kernel(QKV, Q_NORM, K_NORM, COS, SIN, POS, Q_OUT, K_CACHE, V_CACHE,
                           n_heads, n_kv_heads, eps, stride_qkv, stride_q, stride_ch, stride_cs,
                           HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0..n_heads-1: q heads; then n_kv_heads kv heads
    pos = tl.load(POS) + row
    src = QKV + row.to(tl.int64) * stride_qkv + head * HEAD_DIM   # k head j sits right after the q heads
    cos = COS + pos.to(tl.int64) * HEAD_DIM
    sin = SIN + pos.to(tl.int64) * HEAD_DIM
    if head < n_heads:
        _norm_rope(src, Q_NORM, cos, sin, Q_OUT + row.to(tl.int64) * stride_q + head * HEAD_DIM, eps,
                   HALF=HEAD_DIM // 2)
    else:
        kvh = head - n_heads
        dst = kvh.to(tl.int64) * stride_ch + pos.to(tl.int64) * stride_cs
        _norm_rope(src, K_NORM, cos, sin, K_CACHE + dst, eps, HALF=HEAD_DIM // 2)
        d = tl.arange(0, HEAD_DIM)
        v = tl.load(src + n_kv_heads * HEAD_DIM + d)
        tl.store(V_CACHE + dst + d, v)


@triton.jit
def qk_norm_rope_kv_batch_kernel(QKV, Q_NORM, K_NORM, COS, SIN, SLOTS, POS, Q_OUT, K_CACHE, V_CACHE,
                                 n_heads, n_kv_heads, eps, stride_qkv, stride_q, stride_cslot, stride_ch,
                                 stride_cs, HEAD_DIM: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0..n_heads-1: q heads; then n_kv_heads kv heads
    pos = tl.load(POS + row)
    at = tl.maximum(pos, 0).to(tl.int64)
    src = QKV + row.to(tl.int64) * stride_qkv + head * HEAD_DIM
    cos = COS + at * HEAD_DIM
    sin = SIN + at * HEAD_DIM
    if head < n_heads:
        _norm_rope(src, Q_NORM, cos, sin, Q_OUT + row.to(tl.int64) * stride_q + head * HEAD_DIM, eps,
                   HALF=HEAD_DIM // 2)
    elif pos >= 0:
        kvh = head - n_heads
        dst = tl.load(SLOTS + row).to(tl.int64) * stride_cslot + kvh.to(tl.int64) * stride_ch + at * stride_cs
        _norm_rope(src, K_NORM, cos, sin, K_CACHE + dst, eps, HALF=HEAD_DIM // 2)
        d = tl.arange(0, HEAD_DIM)
        v = tl.load(src + n_kv_heads * HEAD_DIM + d)
        tl.store(V_CACHE + dst + d, v)


def _spec(head_dim):
    return KernelSpec(
        name=f"qk_norm_rope_kv_d{head_dim}", fn=qk_norm_rope_kv_kernel,
        signature={"QKV": "*bf16", "Q_NORM": "*bf16", "K_NORM": "*bf16", "COS": "*bf16", "SIN": "*bf16",
                   "POS": "*i32", "Q_OUT": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16",
                   "n_heads": "i32", "n_kv_heads": "i32", "eps": "fp32", "stride_qkv": "i32", "stride_q": "i32",
                   "stride_ch": "i32", "stride_cs": "i32"},
        constexprs={"HEAD_DIM": head_dim}, num_warps=1,
        divisibility_16=("QKV", "Q_OUT", "K_CACHE", "V_CACHE", "COS", "SIN", "stride_qkv", "stride_q", "stride_ch",
                         "stride_cs"))


def _batch_spec(head_dim):
    return KernelSpec(
        name=f"qk_norm_rope_kv_batch_d{head_dim}", fn=qk_norm_rope_kv_batch_kernel,
        signature={"QKV": "*bf16", "Q_NORM": "*bf16", "K_NORM": "*bf16", "COS": "*bf16", "SIN": "*bf16",
                   "SLOTS": "*i32", "POS": "*i32", "Q_OUT": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16",
                   "n_heads": "i32", "n_kv_heads": "i32", "eps": "fp32", "stride_qkv": "i32", "stride_q": "i32",
                   "stride_cslot": "i32", "stride_ch": "i32", "stride_cs": "i32"},
        constexprs={"HEAD_DIM": head_dim}, num_warps=1,
        divisibility_16=("QKV", "Q_OUT", "K_CACHE", "V_CACHE", "COS", "SIN", "stride_qkv", "stride_q",
                         "stride_cslot", "stride_ch", "stride_cs"))


# head_dim 128: the 4B model; 16: the tiny parity checkpoint the device check runs.
KERNELS = [_spec(128), _spec(16), _batch_spec(128), _batch_spec(16)]
