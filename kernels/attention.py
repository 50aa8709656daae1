"""GQA attention over the KV cache: split-K flash-decoding for the decode step, causal flash attention for
a prefill segment.

Decode (M = 1): one query row against up to thousands of cached positions on only 8 kv heads — one program
per kv head would use 8 SMs. Flash-decoding splits the sequence into NUM_SPLITS chunks per kv head
(8 × 16 = 128 programs ≈ one wave on 132 SMs); each writes a partial (max, sum, acc) for the GROUP query
heads sharing that kv head, then `attn_combine_kernel` merges the splits. All query heads of a group are
computed together (one tl.dot, padded to 16 rows) so every K/V byte is read once. The sequence length is
read from DEVICE memory (`pos[0] + 1`): the grid is fixed, so one CUDA graph serves every step, and splits
past the end write an empty partial. P·V is done in fp32 (decode is bandwidth bound; this keeps the
probabilities unrounded).

Prefill: queries at positions `pos[0] + i`, i < M, attend causally to the cache [0, pos[0] + i] (the cache
already holds this segment's k/v, written by the rope_kv kernel), so a segment can start at any offset —
the reused-prefix path. Online-softmax flash attention; Q·Kᵀ on the bf16 tensor cores, P·V in fp32.
Measured on the tiny parity model (tests/test_kernels_step.py): rounding P to bf16 for a tensor-core P·V,
as FlashAttention does, moved the prefill logits by 6.7e-3 relative against an fp32-softmax reference;
fp32 P·V gives 6e-8. The fp32 P·V costs ~L²·D FMAs per head — well under a millisecond for TTS prompts
of a few hundred tokens on the 4B model — so accuracy wins.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.spec import KernelSpec

LOG2E = 1.4426950408889634


@triton.jit
def _attend_block(q, K_CACHE, V_CACHE, offs, kv_mask, visible, qk_scale, m, l_sum, acc):
    """One block of keys of the online softmax, shared by decode and prefill (inlined): scores in base 2
    (qk_scale carries log2 e), rescale of the running max / sum / accumulator, P·V in fp32."""
    k = tl.load(K_CACHE + offs, mask=kv_mask[:, None], other=0.0)
    scores = tl.where(visible, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    v = tl.load(V_CACHE + offs, mask=kv_mask[:, None], other=0.0).to(tl.float32)
    return m_new, l_sum * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")


@triton.jit
def decode_attn_split_kernel(Q, K_CACHE, V_CACHE, POS, M_PART, L_PART, ACC_PART, qk_scale, group,
                             stride_ch, stride_cs,
                             HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                             NUM_SPLITS: tl.constexpr):
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    seq_len = tl.load(POS) + 1
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_S) * BLOCK_S
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    g = tl.arange(0, BLOCK_G)
    gmask = g < group
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * group + g
    q = tl.load(Q + heads[:, None] * HEAD_DIM + d[None, :], mask=gmask[:, None], other=0.0)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    base = kvh.to(tl.int64) * stride_ch
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < end
        offs = base + s.to(tl.int64)[:, None] * stride_cs + d[None, :]
        m, l_sum, acc = _attend_block(q, K_CACHE, V_CACHE, offs, smask, smask[None, :], qk_scale, m, l_sum, acc)
    part = heads * NUM_SPLITS + split
    tl.store(M_PART + part, m, mask=gmask)
    tl.store(L_PART + part, l_sum, mask=gmask)
    tl.store(ACC_PART + part.to(tl.int64)[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def attn_combine_kernel(M_PART, L_PART, ACC_PART, OUT, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    h = tl.program_id(0)
    sp = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, HEAD_DIM)
    m = tl.load(M_PART + h * NUM_SPLITS + sp)
    l_sum = tl.load(L_PART + h * NUM_SPLITS + sp)
    acc = tl.load(ACC_PART + (h * NUM_SPLITS + sp)[:, None] * HEAD_DIM + d[None, :])
    m_max = tl.max(m, axis=0)                 # split 0 always holds position 0, so m_max is finite
    w = tl.exp2(m - m_max)                    # empty splits: exp2(-inf) = 0
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_sum * w, axis=0)
    tl.store(OUT + h * HEAD_DIM + d, out.to(OUT.dtype.element_ty))


@triton.jit
def prefill_attn_kernel(Q, K_CACHE, V_CACHE, POS, OUT, M, qk_scale, group, stride_qm, stride_om,
                        stride_ch, stride_cs,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // group
    start = tl.load(POS)
    rows = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    qpos = start + rows
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rows.to(tl.int64)[:, None] * stride_qm + h * HEAD_DIM + d[None, :], mask=rmask[:, None],
                other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    end = start + tl.minimum((mb + 1) * BLOCK_M, M)   # one past the last key any row of this block sees
    base = kvh.to(tl.int64) * stride_ch
    for s0 in range(0, end, BLOCK_N):
        s = s0 + tl.arange(0, BLOCK_N)
        smask = s < end
        offs = base + s.to(tl.int64)[:, None] * stride_cs + d[None, :]
        visible = smask[None, :] & (s[None, :] <= qpos[:, None])  # causal within the segment
        m, l_sum, acc = _attend_block(q, K_CACHE, V_CACHE, offs, smask, visible, qk_scale, m, l_sum, acc)
    out = acc / l_sum[:, None]
    tl.store(OUT + rows.to(tl.int64)[:, None] * stride_om + h * HEAD_DIM + d[None, :],
             out.to(OUT.dtype.element_ty), mask=rmask[:, None])


# 16 splits × 8 kv heads = 128 programs on 132 SMs; the 16-row group tile is tl.dot's minimum (GQA group 4).
DECODE_TILES = dict(BLOCK_G=16, BLOCK_S=64, NUM_SPLITS=16)
DECODE_OPTIONS = {"num_warps": 4, "num_stages": 2}
# Register caps per head dim. Left to itself ptxas kept sm_90a at 96 (d128) / 168 (d16) registers, one
# occupancy step below the next, by spilling the `group` argument across the loop (8 B of stack). Occupancy
# is not what limits this kernel: 74 KB of shared memory allows at most 3 CTAs per SM and the grid is one
# CTA per SM, so the caps (the next allocation step for d128; d16 is the tiny parity model) cost nothing.
DECODE_MAXNREG = {128: 104, 16: 184}
# 64-row query tiles so SM90 gets wgmma (the build's SASS check looks for it). 8 warps: with 4, each thread
# held 64 fp32 accumulators plus the fp32 P·V operands and sm_120a spilled 48 B at 255 registers; 8 warps
# take 104–128 registers on every target (sm_90a still issues HGMMA for Q·Kᵀ).
PREFILL_TILES = dict(BLOCK_M=64, BLOCK_N=32)
PREFILL_OPTIONS = {"num_warps": 8, "num_stages": 2}


def _specs(head_dim):
    return [
        KernelSpec(
            name=f"decode_attn_split_d{head_dim}", fn=decode_attn_split_kernel,
            signature={"Q": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16", "POS": "*i32", "M_PART": "*fp32",
                       "L_PART": "*fp32", "ACC_PART": "*fp32", "qk_scale": "fp32", "group": "i32",
                       "stride_ch": "i32", "stride_cs": "i32"},
            constexprs=dict(DECODE_TILES, HEAD_DIM=head_dim), **DECODE_OPTIONS, maxnreg=DECODE_MAXNREG[head_dim],
            divisibility_16=("Q", "K_CACHE", "V_CACHE", "ACC_PART", "stride_ch", "stride_cs")),
        KernelSpec(
            name=f"attn_combine_d{head_dim}", fn=attn_combine_kernel,
            signature={"M_PART": "*fp32", "L_PART": "*fp32", "ACC_PART": "*fp32", "OUT": "*bf16"},
            constexprs={"HEAD_DIM": head_dim, "NUM_SPLITS": DECODE_TILES["NUM_SPLITS"]}, num_warps=2,
            divisibility_16=("ACC_PART", "OUT")),
        KernelSpec(
            name=f"prefill_attn_d{head_dim}", fn=prefill_attn_kernel,
            signature={"Q": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16", "POS": "*i32", "OUT": "*bf16",
                       "M": "i32", "qk_scale": "fp32", "group": "i32", "stride_qm": "i32", "stride_om": "i32",
                       "stride_ch": "i32", "stride_cs": "i32"},
            constexprs=dict(PREFILL_TILES, HEAD_DIM=head_dim), **PREFILL_OPTIONS,
            divisibility_16=("Q", "K_CACHE", "V_CACHE", "OUT", "stride_qm", "stride_om", "stride_ch", "stride_cs")),
    ]


KERNELS = _specs(128) + _specs(16)
