"""The batched decode step's kernels: up to 16 takes decoded together, each row's result
independent of how many others run beside it.

`skinny_gemm_kernel`: Y[M, N] = X[M, K] · W[N, K]ᵀ for M ≤ 16 decode rows on the tensor cores, BF16, FP8
W8A8 (per-row activation scale, per-output-channel weight scale) or W8A16 (FP8 weight with its per-channel
scale, BF16 activations: o_proj on the FP8 path, whose input is the attention output with no quantiser;
the FP8 tile is converted to BF16 in registers, exactly, and multiplied by BF16 MMA, so the weight bytes
streamed are halved and the activations keep their precision). Y may be fp32 (the audio head's logits).
Decode is weight-bandwidth bound, so the weights sit in tl.dot's 64-row slot and the ≤ 16 activation rows,
padded to 16, in its column slot (swap-AB): that is what makes Hopper issue wgmma (HGMMA / QGMMA need 64 rows),
and on Ada / consumer Blackwell it is four m16n8 mma.sync tiles. Batch invariance by construction: the tile is always 16
activation rows whatever M is, every program walks the whole K in the same BLOCK_K steps, and an MMA
never adds one column of its B operand into another, so row i's reduction order is fixed and its value
does not depend on M or on the other rows' contents. The N = 2560 projections (o_proj, down) have only 40
row blocks of 64, so their variants also split K into SPLIT_K fixed ranges (set by K alone) and reduce
the fp32 partials in split order (kernels/splitk.py's ticket): still independent of M.

`decode_attn_batch_kernel`: flash-decoding for B takes at once, each with its own cache slot and length
(GQA: a kv head's query group shares one tile, as in kernels/attention.py). Take b's query (position
LENS[b] - 1, its k/v already in the cache) attends to positions [0, LENS[b]) of slot SLOTS[b]; the grid is
(B, kv heads, NUM_SPLITS) and every take's split points depend only on its own length, so a take's
partials, and after `attn_combine_kernel` (the partials of all B·heads rows in one launch) its output,
are bit for bit what the one-take kernel computes. Every row needs LENS[b] ≥ 1: a bucket's padding rows
point at any slot with length 1.

`sample_batch_kernel`: the sampler of kernels/sampler.py, one program per take, each with its own
logits, temperature / top-k / top-p / seed, RNG counter (its own step) and stop state.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.attention import DECODE_MAXNREG, DECODE_OPTIONS, DECODE_TILES, _attend_block
from kernels.sampler import SAMPLER_TILE, _sample_step
from kernels.spec import KernelSpec

ROWS = 16   # the activation tile: tl.dot's minimum, and the largest batch bucket


@triton.jit
def _skinny_epilogue(acc, W_SCALE, X_SCALE, R, Y, rn, rm, nmask, mmask, stride_ym, stride_rm,
                     HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Scales, the residual (the product rounded to bf16 first, as an unfused add) and the store of
    acc [BLOCK_N, BLOCK_M] = Yᵀ (inlined)."""
    if HAS_W_SCALE:
        acc = acc * tl.load(W_SCALE + rn, mask=nmask, other=0.0)[:, None]
    if HAS_X_SCALE:
        acc = acc * tl.load(X_SCALE + rm, mask=mmask, other=0.0)[None, :]
    ymask = nmask[:, None] & mmask[None, :]
    if HAS_RESIDUAL:
        r = tl.load(R + rm.to(tl.int64)[None, :] * stride_rm + rn[:, None], mask=ymask, other=0.0).to(tl.float32)
        acc = acc.to(Y.dtype.element_ty).to(tl.float32) + r
    tl.store(Y + rm.to(tl.int64)[None, :] * stride_ym + rn[:, None], acc.to(Y.dtype.element_ty), mask=ymask)


@triton.jit
def skinny_gemm_kernel(X, W, W_SCALE, X_SCALE, R, Y, PART, COUNT, M, N, K, stride_xm, stride_w, stride_ym,
                       stride_rm, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr,
                       SPLIT_K: tl.constexpr, HAS_W_SCALE: tl.constexpr, HAS_X_SCALE: tl.constexpr,
                       HAS_RESIDUAL: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    nmask = rn < N
    mmask = rm < M
    # Fixed K ranges (multiples of BLOCK_K) that depend on K only, so they are the same for every M.
    k_chunk = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = split * k_chunk
    k_end = tl.minimum(k_start + k_chunk, K)
    w_ptrs = W + rn.to(tl.int64)[:, None] * stride_w + rk[None, :]
    x_ptrs = X + rm.to(tl.int64)[None, :] * stride_xm + rk[:, None]        # [BLOCK_K, BLOCK_M] view of Xᵀ
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kmask = (k0 + rk) < k_end
        x = tl.load(x_ptrs + k0, mask=kmask[:, None] & mmask[None, :], other=0.0)
        # W8A16: the FP8 weight tile becomes BF16 exactly (a no-op when both have one type).
        w = tl.load(w_ptrs + k0, mask=nmask[:, None] & kmask[None, :], other=0.0).to(x.dtype)
        # FP8 on sm_90: promote wgmma's reduced-precision accumulator into fp32 after every K tile, as
        # kernels/gemm.py does (ignored for bf16 and off Hopper).
        acc = tl.dot(w, x, acc, max_num_imprecise_acc=BLOCK_K)
    if SPLIT_K == 1:
        _skinny_epilogue(acc, W_SCALE, X_SCALE, R, Y, rn, rm, nmask, mmask, stride_ym, stride_rm,
                         HAS_W_SCALE, HAS_X_SCALE, HAS_RESIDUAL)
    else:
        # Partials [SPLIT_K, BLOCK_M, N] fp32; the last program of the row block (an integer ticket, no
        # float atomics) adds them in split order, so the sum order is fixed whoever finishes last.
        part = PART + rm.to(tl.int64)[None, :] * N + rn[:, None]
        tl.store(part + split.to(tl.int64) * BLOCK_M * N, acc, mask=nmask[:, None])
        tl.debug_barrier()                      # every thread's partial is stored before the ticket is taken
        ticket = tl.atomic_add(COUNT + pid, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            for sp in tl.static_range(SPLIT_K):
                acc += tl.load(part + sp * BLOCK_M * N, mask=nmask[:, None], other=0.0, cache_modifier=".cg")
            _skinny_epilogue(acc, W_SCALE, X_SCALE, R, Y, rn, rm, nmask, mmask, stride_ym, stride_rm,
                             HAS_W_SCALE, HAS_X_SCALE, HAS_RESIDUAL)
            tl.store(COUNT + pid, 0)


@triton.jit
def decode_attn_batch_kernel(Q, K_CACHE, V_CACHE, SLOTS, LENS, M_PART, L_PART, ACC_PART, qk_scale, group,
                             n_heads, stride_qb, stride_cslot, stride_ch, stride_cs,
                             HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                             NUM_SPLITS: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(LENS + b)
    chunk = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_S) * BLOCK_S
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    g = tl.arange(0, BLOCK_G)
    gmask = g < group
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * group + g
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * HEAD_DIM + d[None, :], mask=gmask[:, None],
                other=0.0)
    m = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, HEAD_DIM), tl.float32)
    base = tl.load(SLOTS + b).to(tl.int64) * stride_cslot + kvh.to(tl.int64) * stride_ch
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < end
        offs = base + s.to(tl.int64)[:, None] * stride_cs + d[None, :]
        m, l_sum, acc = _attend_block(q, K_CACHE, V_CACHE, offs, smask, smask[None, :], qk_scale, m, l_sum, acc)
    part = (b * n_heads + heads) * NUM_SPLITS + split
    tl.store(M_PART + part, m, mask=gmask)
    tl.store(L_PART + part, l_sum, mask=gmask)
    tl.store(ACC_PART + part.to(tl.int64)[:, None] * HEAD_DIM + d[None, :], acc, mask=gmask[:, None])


@triton.jit
def sample_batch_kernel(LOGITS, EMBED, STATE, PARAMS, ROWS, X_OUT, hidden, max_rows, stride_x,
                        CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                        MIN_EOC_STEP: tl.constexpr, TAIL_ROWS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    _sample_step(LOGITS + b * (CODEBOOKS * VOCAB), EMBED, STATE + b * 5, PARAMS + b * 2,
                 ROWS + b * max_rows * CODEBOOKS, X_OUT + b * stride_x, hidden, max_rows,
                 CODEBOOKS, VOCAB, BLOCK_V, BLOCK_H, MIN_EOC_STEP, TAIL_ROWS)


# W8A16 multiplies in BF16, so its K tile is the BF16 one (the FP8 weight tile is half its bytes).
SKINNY_TILES = {"bf16": dict(BLOCK_N=64, BLOCK_K=128, BLOCK_M=ROWS), "fp8": dict(BLOCK_N=64, BLOCK_K=256, BLOCK_M=ROWS),
                "w8a16": dict(BLOCK_N=64, BLOCK_K=128, BLOCK_M=ROWS)}
# Splits for the N = 2560 projections: 40 row blocks x 4 = 160 programs on 132 SMs. Not tuned on a GPU.
SKINNY_SPLIT_K = 4


def _gemm(name, x, w, *, residual, split_k=1, y="*bf16"):
    kind = {("*bf16", "*bf16"): "bf16", ("*fp8e4nv", "*fp8e4nv"): "fp8", ("*bf16", "*fp8e4nv"): "w8a16"}[x, w]
    return KernelSpec(
        name=name, fn=skinny_gemm_kernel,
        signature={"X": x, "W": w, "W_SCALE": "*fp32", "X_SCALE": "*fp32", "R": "*bf16", "Y": y,
                   "PART": "*fp32", "COUNT": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
                   "stride_w": "i32", "stride_ym": "i32", "stride_rm": "i32"},
        constexprs=dict(SKINNY_TILES[kind], SPLIT_K=split_k, HAS_W_SCALE=kind != "bf16", HAS_X_SCALE=kind == "fp8",
                        HAS_RESIDUAL=residual),
        num_warps=4, num_stages=3,
        divisibility_16=("X", "W", "Y", "PART", "K", "stride_xm", "stride_w", "stride_ym"))


KERNELS = [
    _gemm("gemm_skinny_bf16", "*bf16", "*bf16", residual=False),
    _gemm("gemm_skinny_bf16_res", "*bf16", "*bf16", residual=True),
    _gemm("gemm_skinny_w8a8", "*fp8e4nv", "*fp8e4nv", residual=False),
    _gemm("gemm_skinny_w8a8_res", "*fp8e4nv", "*fp8e4nv", residual=True),
    _gemm("gemm_skinny_bf16_res_split", "*bf16", "*bf16", residual=True, split_k=SKINNY_SPLIT_K),
    _gemm("gemm_skinny_w8a8_res_split", "*fp8e4nv", "*fp8e4nv", residual=True, split_k=SKINNY_SPLIT_K),
    # o_proj on the FP8 path (bf16 attention output, FP8 weight), split like the other N = 2560 projection
    _gemm("gemm_skinny_w8a16_res_split", "*bf16", "*fp8e4nv", residual=True, split_k=SKINNY_SPLIT_K),
    # the batched audio head: final-normed rows x the tied [8208, hidden] table -> fp32 logits
    _gemm("gemm_skinny_bf16_f32", "*bf16", "*bf16", residual=False, y="*fp32"),
    *[KernelSpec(
        name=f"decode_attn_batch_d{head_dim}", fn=decode_attn_batch_kernel,
        signature={"Q": "*bf16", "K_CACHE": "*bf16", "V_CACHE": "*bf16", "SLOTS": "*i32", "LENS": "*i32",
                   "M_PART": "*fp32", "L_PART": "*fp32", "ACC_PART": "*fp32", "qk_scale": "fp32", "group": "i32",
                   "n_heads": "i32", "stride_qb": "i32", "stride_cslot": "i32", "stride_ch": "i32",
                   "stride_cs": "i32"},
        constexprs=dict(DECODE_TILES, HEAD_DIM=head_dim), **DECODE_OPTIONS, maxnreg=DECODE_MAXNREG[head_dim],
        divisibility_16=("Q", "K_CACHE", "V_CACHE", "ACC_PART", "stride_qb", "stride_cslot", "stride_ch",
                         "stride_cs"))
      for head_dim in (128, 16)],
    KernelSpec(
        name="sample_embed_batch", fn=sample_batch_kernel,
        signature={"LOGITS": "*fp32", "EMBED": "*bf16", "STATE": "*i64", "PARAMS": "*fp32", "ROWS": "*i32",
                   "X_OUT": "*bf16", "hidden": "i32", "max_rows": "i32", "stride_x": "i32"},
        constexprs=SAMPLER_TILE, num_warps=16,
        divisibility_16=("LOGITS", "EMBED", "X_OUT", "hidden", "stride_x")),
]
