"""Plain torch / python references for every kernel op, used by the CPU tests and by the GPU device check.

Numeric ops compute in float64 from the (dequantised) inputs: the kernels must match them to within their
own rounding. The sampler reference is an independent, sequential, sort-based implementation of SPEC D6 in
fp32 (it shares no code with the kernel's bisection), plus the D5 delay window and stop state.
"""

from __future__ import annotations

import math

import numpy as np
import torch

MASK64 = (1 << 64) - 1


def rmsnorm_ref(x, w, eps, residual=None):
    """(y, h) with h = x + residual (rounded to the residual dtype, as the kernel stores it) and y = norm(h)·w."""
    h = x if residual is None else (x.double() + residual.double()).to(residual.dtype)
    hd = h.double()
    y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    return y, h


def linear_ref(x, w, *, w_scale=None, x_scale=None, residual=None):
    """x · wᵀ on dequantised float64 inputs (+ residual added to the product rounded to bf16, as the kernel)."""
    y = x.double() @ w.double().T
    if w_scale is not None:
        y = y * w_scale.double()
    if x_scale is not None:
        y = y * x_scale.double()
    if residual is not None:
        y = y.to(torch.bfloat16).double() + residual.double()
    return y


def silu_mul_ref(gate_up):
    g, u = gate_up.double().chunk(2, dim=-1)
    return g * torch.sigmoid(g) * u


def qk_norm_rope_ref(qkv, q_norm, k_norm, cos, sin, positions, heads, kv_heads, eps):
    """q [M, heads, D], k and v [M, kv_heads, D] in float64 (norm output rounded to bf16 like the kernel)."""
    m = qkv.shape[0]
    d = q_norm.shape[0]
    x = qkv.double().view(m, heads + 2 * kv_heads, d)
    q, k, v = x[:, :heads], x[:, heads:heads + kv_heads], x[:, heads + kv_heads:]

    def norm_rope(t, w):
        t = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.double()).to(torch.bfloat16).double()
        c = cos[positions].double()[:, None, :]
        s = sin[positions].double()[:, None, :]
        rot = torch.cat((-t[..., d // 2:], t[..., :d // 2]), dim=-1)
        return t * c + rot * s

    return norm_rope(q, q_norm), norm_rope(k, k_norm), v


def attention_ref(q, k_cache, v_cache, positions):
    """Causal GQA attention: q [M, heads, D] at `positions` over caches [kv_heads, S, D] → [M, heads, D] float64."""
    m, heads, d = q.shape
    kv_heads = k_cache.shape[0]
    group = heads // kv_heads
    out = torch.empty((m, heads, d), dtype=torch.float64)
    for i in range(m):
        length = int(positions[i]) + 1
        for h in range(heads):
            k = k_cache[h // group, :length].double()
            v = v_cache[h // group, :length].double()
            p = torch.softmax(k @ q[i, h].double() / math.sqrt(d), dim=0)
            out[i, h] = p @ v
    return out


def audio_head_ref(h, w, norm_w, eps):
    y, _ = rmsnorm_ref(h, norm_w, eps)
    return y.to(torch.bfloat16).double() @ w.double().T


# ---------------------------------------------------------------------------------------------- sampling (D5, D6)
def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def uniform(seed: int, step: int, k: int) -> float:
    return (splitmix64(splitmix64(seed & MASK64) ^ ((step * 8 + k) & MASK64)) >> 40) * 2.0 ** -24


def sample_one_ref(logits, *, temperature: float, top_k: int, top_p: float, u: float) -> int:
    """SPEC D6 for one codebook, sequentially in fp32: sort, cut, renormalise, walk in ascending index
    comparing the running kept mass / total kept mass with u."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    if temperature <= 0:
        return int(torch.argmax(logits))  # torch returns the first maximal index
    p = torch.softmax(logits / np.float32(temperature), dim=0).numpy().astype(np.float32)
    n = len(p)
    order = sorted(range(n), key=lambda i: (-p[i], i))           # descending p, ties lower index first
    kept = order[:top_k] if 0 < top_k < n else order
    total = np.float32(0)
    for i in sorted(kept):
        total = np.float32(total + p[i])
    if top_p < 1.0:
        q = {i: np.float32(p[i] / total) for i in kept}
        cum = np.float32(0)
        prefix = []
        for i in kept:                                          # still in descending-p order
            prefix.append(i)
            cum = np.float32(cum + q[i])
            if cum >= np.float32(top_p):
                break
        kept = prefix
        total = np.float32(0)
        for i in sorted(kept):
            total = np.float32(total + p[i])
    running = np.float32(0)
    for i in sorted(kept):
        running = np.float32(running + p[i])
        if np.float32(running / total) > np.float32(u):
            return i
    return max(kept)


def sample_row_ref(logits, *, step: int, seed: int, temperature: float, top_k: int, top_p: float,
                   boc: int = 1024) -> list[int]:
    """One row of 8 codes: per-codebook D6 draw, then codebooks k > step forced to BOC (D5)."""
    row = []
    for k in range(logits.shape[0]):
        c = sample_one_ref(logits[k], temperature=temperature, top_k=top_k, top_p=top_p, u=uniform(seed, step, k))
        row.append(boc if k > step else c)
    return row


def stop_state_ref(step: int, cb0: int, countdown: int, done: int, *, eoc: int = 1025, min_step: int = 8,
                   tail: int = 6) -> tuple[int, int]:
    """(countdown, done) after the row of `step`: EOC on codebook 0 from step 8 on starts a 6-row tail."""
    if countdown < 0:
        if step >= min_step and cb0 == eoc:
            return tail, int(tail == 0) | done
        return countdown, done
    countdown = max(countdown - 1, 0)
    return countdown, int(countdown == 0) | done
