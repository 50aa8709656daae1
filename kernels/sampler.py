"""The whole per-step sampling tail in one single-program kernel: 8 codebooks sampled per SPEC D6, the
delay-window BOC forcing and the SGLang-Omni stop state of D5, the row written to a device history, and
the fused audio embedding of that row written as the next step's input.

Why one program (`sample_kernel`, variants v1 and v2): the step after it needs all 8 picks (the embedding
sums the 8 rows), so a per-codebook grid needs a second launch or a cross-CTA handshake (the ticket of
`sample_grid_kernel` below); the 8 × 1026 logits are two [4, 2048] tiles, and the embedding is 8 rows of
W (40 KB). Every input that changes per step or per take lives in device
memory, so the kernel is captured once in the decode graph:

  state  int64[5]: step (rows sampled so far), seed, top_k, eoc countdown (-1 = no EOC yet), done flag
  params fp32[2] : temperature, top_p
  rows   int32[max_rows, 8]: row `step` is written here; x_out bf16[hidden]: Σ_k W[row_k + 1026·k]

Sampling (D6), per codebook, everything in fp32: greedy (temperature ≤ 0) = argmax of the raw logits, ties
to the lowest index. Otherwise p = softmax(logits / T); top-k (0 < k < 1026) keeps the k largest p, ties
to the lower index; q = p / Σ kept; top-p (< 1) orders the kept entries by descending p (ties: lower index
first) and keeps the shortest prefix whose q-mass reaches top_p (at least one); the pick is the first kept
index, walking in ascending index, whose running mass cumsum(p_kept) / Σ p_kept exceeds u(seed, step, k)
(splitmix64 counter RNG, uint64 wrap-around) — the same order of fp32 operations as engine/sampling.py.
Instead of sorting, both cuts find their threshold value by a 30-step bisection on the fp32 bit pattern
(non-negative floats order like their bits) and then resolve ties at the threshold by index with a
cumulative count — O(30·V) work, no O(V²) ranks, no sort. Masses are fp32 tree sums and the GPU's exp is
not torch's, so a CPU sampler can differ from this kernel only when u or top_p falls within float
rounding of a boundary (the tests compare picks bit for bit on random and tied logits).

`sample_grid_kernel` (the cubin backend's variant "v3") is the same step as one program per
codebook, a grid of 8, with a radix search in place of the bisection:
  * Grid. The single program above samples 4 codebooks, then the other 4, one after the other, with 16
    warps reducing every [4, 2048] tile (cross-warp reductions are the latency: ~0.3-0.5 µs each, a
    shared-memory round trip and two barriers). Program k samples codebook k alone on its own SM, so the
    8 searches overlap instead of running as two sequential groups, and each reduction spans 8 warps.
    The picks go to a device scratch; each program then takes a ticket from an int32 counter
    (acquire-release after a barrier, as kernels/splitk.py does), and the program that draws the last
    ticket reads the 8 picks (through L2), writes the stop state, the row and the embedding with the
    very code of the single program (`_finish_step`: the same sum order, so the same next input), and
    resets the counter for the next launch. No float atomics; the result does not depend on which
    program finishes last.
  * Radix search. The bisection spends one block reduction per bit of the threshold (30 per cut). Here
    each pass tests 2^RADIX_BITS - 1 candidate thresholds at once ([2^R, 2048] compare tile, one
    reduction per row, all rows in the same shuffle / shared-memory rounds), MSB first: t grows by
    RADIX_BITS bits a pass, so 30 bits take 10 passes at R = 3. The answer is the same largest t as the
    bisection's (the predicate is monotone, and the result is capped at the largest kept bit pattern
    exactly as the bisection's upper bound caps it), so the picks are the same. (On a GPU the two
    kernels reduce their fp32 sums — softmax denominator, masses, running mass — over different thread
    layouts, so, as between any two D6 implementations, a pick can differ only where u or top_p falls
    within float rounding of a boundary; the device check compares a 200-row take of each.)
  Expected cost (estimates from instruction counts; no GPU has timed either): the single program does
  2 groups × (30 + 30) = 120 search reductions plus ~12 others in sequence, ~50-100 µs at T 0.8 /
  top-k 30 / top-p 0.8; a grid program does 10 + 10 wider ones plus ~6 others, then the last one the
  ~5 µs embedding: ~10-20 µs. Greedy needs no search: one argmax per codebook either way. The device
  check times both (bench/gpu_check.py, "A/B sampler").
  The same kernel serves B takes at once as the grid (8, B), each take with its own settings, state and
  ticket counter: the batched step's alternative to `sample_batch_kernel` (kernels/batch.py, one
  single-program step per take), which stays as it is.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.spec import KernelSpec


@triton.jit
def _splitmix64(x):
    x = x + 0x9E3779B97F4A7C15
    z = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _largest_bits_with_count(bits, keep, need, N_ROWS: tl.constexpr):
    """Per row, the largest t with #{kept i: bits_i ≥ t} ≥ need (need ≥ 1 and ≤ #kept)."""
    lo = tl.zeros((N_ROWS,), tl.int32)
    hi = tl.max(tl.where(keep, bits, 0), axis=1)      # the answer is the bit pattern of a kept entry
    for _ in range(30):  # a loop, not unrolled: unrolling took 43 s to compile
        mid = lo + (hi - lo + 1) // 2
        cnt = tl.sum((keep & (bits >= mid[:, None])).to(tl.int32), axis=1)
        ok = cnt >= need
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _largest_bits_with_mass(bits, keep, q, top_p, N_ROWS: tl.constexpr):
    """Per row, the largest t with Σ{q_i: kept, bits_i ≥ t} ≥ top_p (0 when no t qualifies)."""
    lo = tl.zeros((N_ROWS,), tl.int32)
    hi = tl.max(tl.where(keep, bits, 0), axis=1)      # the answer is the bit pattern of a kept entry
    for _ in range(30):  # a loop, not unrolled: unrolling took 43 s to compile
        mid = lo + (hi - lo + 1) // 2
        mass = tl.sum(tl.where(keep & (bits >= mid[:, None]), q, 0.0), axis=1)
        ok = mass >= top_p
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


# p ≤ 1.0 = 0x3F800000 < 2^30: every probability's fp32 bit pattern fits in 30 bits. A candidate is below
# 2^30 + (2^R - 1)·2^(30 - R) (a 30-bit prefix plus a digit), which int32 holds for RADIX_BITS ≤ 3.
P_BITS = tl.constexpr(30)


@triton.jit
def _radix_largest(bits, keep, need, q, top_p, BY_MASS: tl.constexpr, N_ROWS: tl.constexpr,
                   RADIX_BITS: tl.constexpr):
    """`_largest_bits_with_count` (BY_MASS False: #{kept i: bits_i ≥ t} ≥ need) or `_largest_bits_with_mass`
    (BY_MASS True: Σ{q_i: kept, bits_i ≥ t} ≥ top_p), the same t, found RADIX_BITS bits per pass: the
    predicate only turns false as t grows, so among t + j·2^shift (j < 2^RADIX_BITS) the ones that hold
    are a prefix, and their count says the next digit."""
    R: tl.constexpr = 1 << RADIX_BITS
    PASSES: tl.constexpr = (P_BITS + RADIX_BITS - 1) // RADIX_BITS
    j = tl.arange(0, R)
    t = tl.zeros((N_ROWS,), tl.int32)
    for i in range(PASSES):  # a loop, not unrolled (see the bisection)
        shift = (PASSES - 1 - i) * RADIX_BITS
        cand = t[:, None] + (j << shift)[None, :]                               # [N_ROWS, R]
        over = keep[:, None, :] & (bits[:, None, :] >= cand[:, :, None])        # [N_ROWS, R, BLOCK_V]
        # Counts in fp32 (exact below 2^24): a sum of int32-cast bools becomes a popcount that the NVPTX
        # backend assembles in an 8-byte stack slot (see `room` in _sample_group).
        if BY_MASS:
            ok = tl.sum(tl.where(over, q[:, None, :], 0.0), axis=2) >= top_p
        else:
            ok = tl.sum(tl.where(over, 1.0, 0.0), axis=2) >= need
        digit = tl.maximum(tl.sum(tl.where(ok, 1.0, 0.0), axis=1).to(tl.int32), 1) - 1   # none holds: t stays
        t = t + (digit << shift)
    # The bisection searches [0, largest kept pattern]: the same cap (it matters only for top_p ≤ 0).
    return tl.minimum(t, tl.max(tl.where(keep, bits, 0), axis=1))


@triton.jit
def _sample_group(LOGITS, cb, step, seed, temperature, top_k, top_p,
                  CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, N_ROWS: tl.constexpr,
                  RADIX_BITS: tl.constexpr = 0):
    """Codes for the codebooks `cb` [N_ROWS] at this step (D6 draw, then the D5 delay window). The
    thresholds come from the bisection (RADIX_BITS 0) or from `_radix_largest`: the same values."""
    v = tl.arange(0, BLOCK_V)
    valid = (v < VOCAB)[None, :] & (cb >= 0)[:, None]                       # [N_ROWS, BLOCK_V]
    logits = tl.load(LOGITS + cb[:, None] * VOCAB + v[None, :], mask=valid, other=float("-inf"))
    pick = tl.argmax(logits, axis=1, tie_break_left=True).to(tl.int32)
    if temperature > 0.0:
        z = logits / temperature
        e = tl.where(valid, tl.exp(z - tl.max(z, axis=1)[:, None]), 0.0)
        p = e / tl.sum(e, axis=1)[:, None]
        bits = p.to(tl.int32, bitcast=True)
        vv = v[None, :] + cb[:, None] * 0                                    # index, broadcast to the tile
        keep = valid
        if (top_k > 0) & (top_k < VOCAB):
            k32 = top_k.to(tl.int32)
            if RADIX_BITS == 0:
                t = _largest_bits_with_count(bits, keep, k32, N_ROWS)
            else:
                t = _radix_largest(bits, keep, k32, p, top_p, False, N_ROWS, RADIX_BITS)
            above = keep & (bits > t[:, None])
            tie = keep & (bits == t[:, None])
            tie_rank = tl.cumsum(tie.to(tl.int32), axis=1) - tie.to(tl.int32)
            # Counted in fp32 (exact: at most BLOCK_V): LLVM rewrites a sum of int32-cast bools into a
            # popcount of an i1 bitmask that the NVPTX backend assembles in an 8-byte stack slot (STACK:8).
            room = k32 - tl.sum(tl.where(above, 1.0, 0.0), axis=1).to(tl.int32)
            keep = above | (tie & (tie_rank < room[:, None]))
        if top_p < 1.0:
            q = tl.where(keep, p, 0.0)
            q = q / tl.sum(q, axis=1)[:, None]
            if RADIX_BITS == 0:
                t = _largest_bits_with_mass(bits, keep, q, top_p, N_ROWS)
            else:
                t = _radix_largest(bits, keep, 0, q, top_p, True, N_ROWS, RADIX_BITS)
            above = keep & (bits > t[:, None])
            tie = keep & (bits == t[:, None])
            tie_rank = tl.cumsum(tie.to(tl.int32), axis=1) - tie.to(tl.int32)
            mass_above = tl.sum(tl.where(above, q, 0.0), axis=1)
            q_tie = tl.max(tl.where(tie, q, 0.0), axis=1)
            before = mass_above[:, None] + tie_rank.to(tl.float32) * q_tie[:, None]
            keep = above | (tie & ((tie_rank == 0) | (before < top_p)))
        # Counter RNG: u = (splitmix64(splitmix64(seed) ^ (step·8 + k)) >> 40) · 2⁻²⁴
        ctr = (step * CODEBOOKS + cb).to(tl.uint64)
        bits64 = _splitmix64(_splitmix64(seed.to(tl.uint64, bitcast=True)) ^ ctr)
        u = (bits64 >> 40).to(tl.float32) * 5.9604644775390625e-08
        kept_p = tl.where(keep, p, 0.0)
        running = tl.cumsum(kept_p, axis=1) / tl.sum(kept_p, axis=1)[:, None]
        first = tl.min(tl.where(keep & (running > u[:, None]), vv, BLOCK_V), axis=1)
        last_kept = tl.max(tl.where(keep, vv, -1), axis=1)                  # u beyond the rounded total
        pick = tl.where(first < BLOCK_V, first, last_kept).to(tl.int32)
    # Delay window (D5): codebook k is BOC until step k.
    return tl.where(cb.to(tl.int64) > step, VOCAB - 2, pick)


@triton.jit
def _sample_step(LOGITS, EMBED, STATE, PARAMS, ROWS, X_OUT, hidden, max_rows,
                 CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                 MIN_EOC_STEP: tl.constexpr, TAIL_ROWS: tl.constexpr):
    """One take's step (inlined): its logits, state, params, row history and next input, already offset."""
    step = tl.load(STATE + 0)
    seed = tl.load(STATE + 1)
    top_k = tl.load(STATE + 2)
    countdown = tl.load(STATE + 3)
    done = tl.load(STATE + 4)
    temperature = tl.load(PARAMS + 0)
    top_p = tl.load(PARAMS + 1)

    # Two groups of codebooks, one after the other: a [4, 2048] tile per group keeps every tensor at 16 values
    # per thread (16 warps) with no register spills; one [8, 2048] tile spilled 264-352 bytes per thread.
    HALF: tl.constexpr = CODEBOOKS // 2
    cb_a = tl.arange(0, HALF)
    cb_b = HALF + tl.arange(0, HALF)
    pick_a = _sample_group(LOGITS, cb_a, step, seed, temperature, top_k, top_p, CODEBOOKS, VOCAB, BLOCK_V, HALF)
    pick_b = _sample_group(LOGITS, cb_b, step, seed, temperature, top_k, top_p, CODEBOOKS, VOCAB, BLOCK_V, HALF)
    _finish_step(pick_a, pick_b, EMBED, STATE, ROWS, X_OUT, step, countdown, done, hidden, max_rows,
                 CODEBOOKS, VOCAB, BLOCK_H, MIN_EOC_STEP, TAIL_ROWS)


@triton.jit
def _finish_step(pick_a, pick_b, EMBED, STATE, ROWS, X_OUT, step, countdown, done, hidden, max_rows,
                 CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_H: tl.constexpr, MIN_EOC_STEP: tl.constexpr,
                 TAIL_ROWS: tl.constexpr):
    """The step's tail (inlined), given the picks of codebooks [0, 4) and [4, 8): stop state, row, next input."""
    HALF: tl.constexpr = CODEBOOKS // 2
    cb_a = tl.arange(0, HALF)
    cb_b = HALF + tl.arange(0, HALF)
    # Stop state (D5): EOC on codebook 0 counts from step MIN_EOC_STEP; TAIL_ROWS more rows follow it.
    cb0 = tl.sum(tl.where(cb_a == 0, pick_a, 0), axis=0)
    started = countdown >= 0
    trigger = (countdown < 0) & (step >= MIN_EOC_STEP) & (cb0 == VOCAB - 1)
    new_count = tl.where(trigger, TAIL_ROWS, tl.where(started, tl.maximum(countdown - 1, 0), countdown))
    new_done = tl.where((trigger | started) & (new_count == 0), 1, done)

    room = (cb_a.to(tl.int64) * 0 + step) < max_rows
    tl.store(ROWS + step * CODEBOOKS + cb_a, pick_a, mask=room)
    tl.store(ROWS + step * CODEBOOKS + cb_b, pick_b, mask=room)
    tl.store(STATE + 0, step + 1)
    tl.store(STATE + 3, new_count.to(tl.int64))
    tl.store(STATE + 4, new_done.to(tl.int64))

    # Next input: the fused embedding of the row, summed in fp32, rounded once (SPEC Part 2 §3.2).
    erow_a = (pick_a + cb_a * VOCAB).to(tl.int64)
    erow_b = (pick_b + cb_b * VOCAB).to(tl.int64)
    hh = tl.arange(0, BLOCK_H)
    for h0 in range(0, hidden, BLOCK_H):
        hmask = (h0 + hh) < hidden
        m2 = (cb_a >= 0)[:, None] & hmask[None, :]
        w_a = tl.load(EMBED + erow_a[:, None] * hidden + (h0 + hh)[None, :], mask=m2, other=0.0).to(tl.float32)
        w_b = tl.load(EMBED + erow_b[:, None] * hidden + (h0 + hh)[None, :], mask=m2, other=0.0).to(tl.float32)
        x = tl.sum(w_a, axis=0) + tl.sum(w_b, axis=0)
        tl.store(X_OUT + h0 + hh, x.to(X_OUT.dtype.element_ty), mask=hmask)


@triton.jit
def sample_kernel(LOGITS, EMBED, STATE, PARAMS, ROWS, X_OUT, hidden, max_rows,
                  CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                  MIN_EOC_STEP: tl.constexpr, TAIL_ROWS: tl.constexpr):
    _sample_step(LOGITS, EMBED, STATE, PARAMS, ROWS, X_OUT, hidden, max_rows,
                 CODEBOOKS, VOCAB, BLOCK_V, BLOCK_H, MIN_EOC_STEP, TAIL_ROWS)


@triton.jit
def sample_grid_kernel(LOGITS, EMBED, STATE, PARAMS, ROWS, X_OUT, PICKS, COUNT, hidden, max_rows, stride_x,
                       CODEBOOKS: tl.constexpr, VOCAB: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                       MIN_EOC_STEP: tl.constexpr, TAIL_ROWS: tl.constexpr, RADIX_BITS: tl.constexpr):
    """`sample_kernel` as a grid of (CODEBOOKS, takes) programs: program (k, b) samples take b's codebook k
    into PICKS[b, k]; the last of take b's programs to take a ticket from COUNT[b] (int32, zero between
    launches) finishes take b's step and resets it. Take b's tensors are the one-take layout, offset by b
    (X_OUT by stride_x), so takes never see each other and one take alone is the grid (CODEBOOKS, 1)."""
    b = tl.program_id(1).to(tl.int64)
    LOGITS += b * (CODEBOOKS * VOCAB)
    STATE += b * 5
    PARAMS += b * 2
    ROWS += b * max_rows * CODEBOOKS
    X_OUT += b * stride_x
    PICKS += b * CODEBOOKS
    COUNT += b
    cb = tl.program_id(0) + tl.arange(0, 1)
    step = tl.load(STATE + 0)
    seed = tl.load(STATE + 1)
    top_k = tl.load(STATE + 2)
    temperature = tl.load(PARAMS + 0)
    top_p = tl.load(PARAMS + 1)
    pick = _sample_group(LOGITS, cb, step, seed, temperature, top_k, top_p, CODEBOOKS, VOCAB, BLOCK_V, 1,
                         RADIX_BITS)
    tl.store(PICKS + cb, pick)
    tl.debug_barrier()                          # the pick is stored before the ticket is taken
    ticket = tl.atomic_add(COUNT, 1, sem="acq_rel")
    if ticket == CODEBOOKS - 1:
        # Every program read STATE before its ticket, so the last one may advance it.
        HALF: tl.constexpr = CODEBOOKS // 2
        pick_a = tl.load(PICKS + tl.arange(0, HALF), cache_modifier=".cg")
        pick_b = tl.load(PICKS + HALF + tl.arange(0, HALF), cache_modifier=".cg")
        _finish_step(pick_a, pick_b, EMBED, STATE, ROWS, X_OUT, step, tl.load(STATE + 3), tl.load(STATE + 4),
                     hidden, max_rows, CODEBOOKS, VOCAB, BLOCK_H, MIN_EOC_STEP, TAIL_ROWS)
        tl.store(COUNT, 0)


SAMPLER_TILE = dict(CODEBOOKS=8, VOCAB=1026, BLOCK_V=2048, BLOCK_H=512, MIN_EOC_STEP=8, TAIL_ROWS=6)
# The grid sampler: 3 bits a pass (10 passes for 30 bits; a [8, 2048] compare tile). Warps: chosen so the
# [8, 2048] tile fits in registers with no spill (tests/test_kernels_build.py).
SAMPLER_GRID_TILE = dict(SAMPLER_TILE, RADIX_BITS=3)
assert 1 <= SAMPLER_GRID_TILE["RADIX_BITS"] <= 3, "candidate thresholds must fit in int32 (see P_BITS)"
SAMPLER_GRID_WARPS = 8

KERNELS = [
    KernelSpec(
        name="sample_embed", fn=sample_kernel,
        signature={"LOGITS": "*fp32", "EMBED": "*bf16", "STATE": "*i64", "PARAMS": "*fp32", "ROWS": "*i32",
                   "X_OUT": "*bf16", "hidden": "i32", "max_rows": "i32"},
        constexprs=SAMPLER_TILE, num_warps=16, divisibility_16=("LOGITS", "EMBED", "X_OUT", "hidden")),
    KernelSpec(
        name="sample_embed_grid", fn=sample_grid_kernel,
        signature={"LOGITS": "*fp32", "EMBED": "*bf16", "STATE": "*i64", "PARAMS": "*fp32", "ROWS": "*i32",
                   "X_OUT": "*bf16", "PICKS": "*i32", "COUNT": "*i32", "hidden": "i32", "max_rows": "i32",
                   "stride_x": "i32"},
        constexprs=SAMPLER_GRID_TILE, num_warps=SAMPLER_GRID_WARPS,
        # Uncapped, ptxas kept sm_120a at 64 registers and spilled 8 bytes across the searches; the grid is
        # 8 programs a take (one per SM), so occupancy is not the limit: 128 gives 109-116, no spill.
        maxnreg=128, divisibility_16=("LOGITS", "EMBED", "X_OUT", "hidden")),
]
