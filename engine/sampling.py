"""Greedy / temperature / top-k / top-p sampling with a counter-based RNG (SPEC D6).

The draw for codebook k at step s uses `u(seed, s, k)`, a pure function of three integers, so the torch
path and the GPU kernels pick the same index for the same logits, and a take is reproduced from its seed
alone. All 8 codebooks are sampled independently with the same settings (SPEC Part 2 §5.1).

Order of operations (SG `sampler.py`): `p = softmax(logits / T)` in fp32 → top-k keeps the k largest
(ties: lower index) → top-p, on the top-k-renormalised mass, keeps the shortest prefix in descending-p
order whose mass reaches `top_p` (at least one entry) → renormalise → walk the kept entries in
ascending index and take the first whose running mass exceeds u. Comparisons happen in fp32.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def splitmix64(x: int) -> int:
    """One splitmix64 output for a 64-bit state x (Python ints, wrapped to 64 bits)."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def uniform(seed: int, step: int, k: int) -> float:
    """u(seed, step, k) in [0, 1): 24 random bits, exactly representable in fp32."""
    return (splitmix64(splitmix64(seed & MASK64) ^ ((step * 8 + k) & MASK64)) >> 40) * 2.0 ** -24


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def uniforms(seed: int, step: int, codebooks: int = 8, steps: int = 1) -> torch.Tensor:
    """u(seed, s, k) for s in [step, step + steps) and k < codebooks, as fp32 [steps, codebooks]
    (or [codebooks] when steps == 1). Vectorised over numpy uint64 (wrap-around arithmetic)."""
    base = _splitmix64_np(np.array([seed & MASK64], dtype=np.uint64))
    counters = (np.arange(step, step + steps, dtype=np.uint64)[:, None] * np.uint64(8)
                + np.arange(codebooks, dtype=np.uint64)[None, :])
    bits = _splitmix64_np(base ^ counters) >> np.uint64(40)
    u = torch.from_numpy((bits.astype(np.float64) * 2.0 ** -24).astype(np.float32))
    return u[0] if steps == 1 else u


def top_k_mask(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k largest entries per row, ties to the lower index. `topk` gives the k-th value
    exactly but picks among ties arbitrarily, so the ties at the threshold are filled in index order
    (a full stable sort of 1026 entries costs ~300 µs on a CPU core; this costs ~25)."""
    threshold = torch.topk(probs, k, dim=-1).values[:, -1:]
    above = probs > threshold
    tied = probs == threshold
    room = k - above.sum(-1, keepdim=True)
    return above | (tied & (torch.cumsum(tied, -1) <= room))


def kept_indices(kept: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of a mask with exactly k True entries per row, ascending, as LongTensor [rows, k].
    The j-th kept index is where the running count of kept entries first reaches j; a searchsorted of
    1..k gives it at a fixed shape, so unlike `nonzero` there is no host sync and it can be captured in
    a CUDA graph (torch_graph.py replays `sample` that way). On one CPU core it costs ~35 µs against ~27
    for `nonzero` on an [8, 1026] row, of which `sample`'s top-p path wins back as much elsewhere."""
    wanted = torch.arange(1, k + 1, device=kept.device).expand(kept.shape[0], k).contiguous()
    return torch.searchsorted(torch.cumsum(kept, -1), wanted)


def sample(logits: torch.Tensor, u: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One code per row of `logits` [K, V]; `u` [K] are the uniforms of this step. Returns LongTensor [K].
    Shapes never depend on the data and nothing syncs with the host, so a CUDA graph can capture it for
    fixed (temperature, top_k, top_p), which pick the ops."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)  # raw logits; torch returns the first (lowest) index on ties
    probs = torch.softmax(logits / temperature, dim=-1)
    rows, vocab = probs.shape
    kept = None
    if 0 < top_k < vocab:
        kept = top_k_mask(probs, top_k)
    if top_p < 1:
        # Candidates in ascending index; a stable descending sort then orders ties by lower index.
        index = (kept_indices(kept, top_k) if kept is not None
                 else torch.arange(vocab, device=probs.device).expand(rows, vocab))
        candidates = probs.gather(-1, index)
        ranked, order = torch.sort(candidates, dim=-1, descending=True, stable=True)
        ranked = ranked / ranked.sum(-1, keepdim=True)  # top-p acts on the top-k-renormalised mass
        through = torch.cumsum(ranked, -1)
        before = F.pad(through[:, :-1], (1, 0))  # mass strictly before (0 for the first)
        # The j-th ranked entry is token index[order[j]]: one scatter puts its verdict back in token order.
        kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, index.gather(-1, order), before < top_p)
    mass = probs if kept is None else torch.where(kept, probs, 0.0)
    running = torch.cumsum(mass, -1)
    running = running / running[:, -1:]
    # The running mass is non-decreasing, only steps up at kept entries (adding an exact 0 changes
    # nothing) and ends at exactly 1.0 (x / x) > u, so the first index with running > u always exists
    # and is a kept entry: `sum(running <= u)` is that index, with no data-dependent branch.
    return (running <= u.to(running.device, running.dtype)[:, None]).sum(-1)


def sample_row(logits: torch.Tensor, u: torch.Tensor, rule, temperature: float, top_k: int,
               top_p: float) -> list[int]:
    """A take's next row on the host: sampled from `logits` with its uniforms `u` [steps, 8] at the rule's
    step, then pushed to its stop rule (engine/delay.py `StopRule`, which forces the delay window);
    returns the row as the rule kept it, the one to feed back. Logits holding NaN or inf (a faulty step)
    raise `NonFiniteLogits` here: `sample` would otherwise fail inside top-k with "index 1026 is out of
    bounds" (no finite entry is kept, so the candidate search runs off the vocabulary) or pick garbage."""
    if not math.isfinite(float(logits.sum())):  # NaN, +inf or -inf anywhere; a tenth of isfinite().all()'s cost
        raise NonFiniteLogits.at(rule.step)
    return rule.push(sample(logits, u[rule.step], temperature, top_k, top_p).tolist())


class NonFiniteLogits(RuntimeError):
    """A take's logits are not finite: the device step that gave them failed silently."""

    @classmethod
    def at(cls, step: int) -> NonFiniteLogits:
        return cls(f"the model's logits for row {step} hold NaN or inf, so the step that computed them is faulty; "
                   "nothing can be sampled from them")
