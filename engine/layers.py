"""The layers of the Qwen3 backbone in torch (engine/model.py composes them): RMSNorm, the RoPE tables in
the checkpoint's rounding (SPEC D4), the per-slot KV cache, attention with fused q/k/v, the gated MLP, and
the decoder block. A prefill is one sequence, so its tensors carry no batch dimension ([L, hidden],
attention on [heads, L, head_dim]); the decode step (`step`) runs B sequences, the matmuls on all B rows
at once and attention per sequence over its own slot and length with the batch-1 math."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import Dims
from .quant import linear, quantize


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3 RMSNorm in the transformers order of operations: normalise in fp32, cast back, then scale.
    (The casts are skipped when x is already fp32: same numbers, fewer dispatches in the decode loop.)"""
    h = x if x.dtype == torch.float32 else x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (h if h.dtype == x.dtype else h.to(x.dtype))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_table(dims: Dims, length: int, dtype: torch.dtype, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] for NeoX half rotation. Computed in fp32 exactly as transformers does,
    then ROUNDED TO BF16 VALUES in every precision (SPEC D4: the model was trained with bf16 tables;
    unrounded fp32 tables move the parity logits by ~1e-3), then stored in the compute dtype."""
    d = dims.head_dim
    inv_freq = 1.0 / (dims.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = emb.cos().to(torch.bfloat16).to(dtype)
    sin = emb.sin().to(torch.bfloat16).to(dtype)
    return cos.to(device), sin.to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """`x·cos + rotate_half(x)·sin` with rotate_half(x) = [−x₂, x₁] (NeoX); x [..., d], tables broadcast.
    The rotation is a swap of the two halves times a sign; the sign lives in the table
    (`signed_sin(sin)` = [−sin₁, sin₂], exact), so it costs one flip instead of slices + neg + cat."""
    half = x.shape[-1] // 2
    return x * cos + x.unflatten(-1, (2, half)).flip(-2).flatten(-2) * sin_signed


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], -1)


class KVCache:
    """Preallocated keys and values of one layer, one [kv_heads, max_len, head_dim] pair per slot. A slot's
    tensors are allocated the first time it is used (memory follows the concurrency reached, not the
    `max_batch` allowed); positions are written in place, so decode allocates no cache memory and a slot's
    prefix from earlier calls stays valid."""

    def __init__(self, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype, device=None):
        self.shape, self.dtype, self.device = (kv_heads, max_len, head_dim), dtype, device
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    @property
    def k(self) -> torch.Tensor:  # slot 0, the one sequence of a backend that does not batch
        self._slot(0)
        return self.keys[0]

    @property
    def v(self) -> torch.Tensor:
        self._slot(0)
        return self.values[0]

    def _slot(self, slot: int) -> None:
        if slot not in self.keys:
            self.keys[slot] = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            self.values[slot] = torch.zeros(self.shape, dtype=self.dtype, device=self.device)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor, slot: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        self._slot(slot)
        end = start + k.shape[1]
        self.keys[slot][:, start:end] = k
        self.values[slot][:, start:end] = v
        return self.keys[slot][:, :end], self.values[slot][:, :end]

    def read(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the slot's first `length` positions (a prefix to keep, engine/prefix.py)."""
        self._slot(slot)
        return self.keys[slot][:, :length].clone(), self.values[slot][:, :length].clone()

    def write(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Positions [0, len) of the slot take `k` / `v` [kv_heads, len, head_dim] (a kept prefix)."""
        self.update(0, k, v, slot)

    def grown(self, max_len: int) -> "KVCache":
        """A cache of max_len positions holding this one's contents (takes in flight keep their KV)."""
        out = KVCache(self.shape[0], max_len, self.shape[2], self.dtype, self.device)
        keep = min(max_len, self.shape[1])
        for slot in self.keys:
            out._slot(slot)
            out.keys[slot][:, :keep] = self.keys[slot][:, :keep]
            out.values[slot][:, :keep] = self.values[slot][:, :keep]
        return out


class Attention(nn.Module):
    """GQA self-attention with per-head q/k RMSNorm before RoPE (Qwen3), over the preallocated cache.

    After loading, `fuse()` concatenates q/k/v into one matrix (the three parameters become views of it,
    so names and memory stay the same) and stacks the q/k norm weights: one matmul and one norm per layer
    instead of three and two. On CPU decode of small models the step is dispatch-bound, so op count is
    time."""

    def __init__(self, dims: Dims):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = dims.heads, dims.kv_heads, dims.head_dim
        self.eps = dims.rms_eps
        self.q_proj = nn.Linear(dims.hidden, dims.heads * dims.head_dim, bias=False)
        self.k_proj = nn.Linear(dims.hidden, dims.kv_heads * dims.head_dim, bias=False)
        self.v_proj = nn.Linear(dims.hidden, dims.kv_heads * dims.head_dim, bias=False)
        self.o_proj = nn.Linear(dims.heads * dims.head_dim, dims.hidden, bias=False)
        self.q_norm = RMSNorm(dims.head_dim, dims.rms_eps)
        self.k_norm = RMSNorm(dims.head_dim, dims.rms_eps)
        self.cache: KVCache | None = None

    def fuse(self) -> None:
        wqkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        nq, nk = self.q_proj.weight.shape[0], self.k_proj.weight.shape[0]
        self.q_proj.weight = nn.Parameter(wqkv[:nq], requires_grad=False)
        self.k_proj.weight = nn.Parameter(wqkv[nq:nq + nk], requires_grad=False)
        self.v_proj.weight = nn.Parameter(wqkv[nq + nk:], requires_grad=False)
        self.wqkv, self.wo = wqkv, self.o_proj.weight.detach()  # plain tensors, not more parameters
        self.qk_norm = torch.cat([self.q_norm.weight.expand(self.heads, -1),
                                  self.k_norm.weight.expand(self.kv_heads, -1)])

    def quantize(self, kind: str) -> None:
        """Pack the fused q/k/v and o matrices (engine/quant.py); the float ones are dropped."""
        self.wqkv, self.wo = quantize(self.wqkv, kind), quantize(self.wo, kind)
        del self.q_proj, self.k_proj, self.v_proj, self.o_proj

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int,
                mask: torch.Tensor | None, slot: int = 0, scratch: torch.Tensor | None = None) -> torch.Tensor:
        """One sequence: x [L, hidden] at positions [start, start + L) of `slot`; cos/sin [L, 1, d] (sin
        signed, see apply_rope); `scratch`: see quant.linear."""
        n, heads, kv_heads, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = linear(x, self.wqkv, scratch).view(n, heads + 2 * kv_heads, d)
        qk = apply_rope(rms_norm(qkv[:, :heads + kv_heads], self.qk_norm, self.eps), cos, sin)
        q = qk[:, :heads].transpose(0, 1)  # [heads, L, d]
        keys, values = self.cache.update(start, qk[:, heads:].transpose(0, 1),
                                         qkv[:, heads + kv_heads:].transpose(0, 1), slot)
        # GQA without copying K/V: query head h reads kv head h // group, so fold the group into the
        # query length: [kv_heads, group·L, d] against [kv_heads, T, d].
        group = heads // kv_heads
        q = q.reshape(kv_heads, group * n, d)
        if n == 1:
            # One query: the transformers eager math (scores in the compute dtype, softmax in fp32); at one
            # query it is ~2× faster than SDPA's CPU path (7 vs 14 µs tiny, 172 vs 243 µs at 4B shapes).
            scores = torch.bmm(q, keys.transpose(1, 2)) * d ** -0.5
            out = torch.bmm(torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype), values)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask.repeat(group, 1))
        out = out.view(heads, n, d).transpose(0, 1).reshape(n, heads * d)
        return linear(out, self.wo, scratch)

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: list[int],
             positions: list[int]) -> torch.Tensor:
        """Decode: x [P, hidden], rows [0, B) the next row of sequence i at positions[i] of slots[i]
        (B = len(slots)); rows [B, P) are padding (their attention output is zero). cos/sin [B, 1, d]."""
        p, b, heads, kv_heads, d = x.shape[0], len(slots), self.heads, self.kv_heads, self.head_dim
        qkv = linear(x, self.wqkv)[:b].view(b, heads + 2 * kv_heads, d)
        qk = apply_rope(rms_norm(qkv[:, :heads + kv_heads], self.qk_norm, self.eps), cos, sin)
        out = x.new_zeros(p, heads * d)
        group = heads // kv_heads
        for i, (slot, pos) in enumerate(zip(slots, positions)):
            keys, values = self.cache.update(pos, qk[i:i + 1, heads:].transpose(0, 1),
                                             qkv[i:i + 1, heads + kv_heads:].transpose(0, 1), slot)
            # Per sequence over its own slot and length, GQA folded as in `forward` (the group's queries
            # are one query block against their kv head, nothing copied), in one fused op: scores, softmax
            # and the weighted sum accumulate in fp32. Two bmms in bf16 cost 6-10× more on a CPU without
            # native bf16 (torch's bf16 GEMM falls back to scalar loops there; docs/PERFORMANCE.md).
            q = qk[i, :heads].view(kv_heads, group, d)
            out[i] = F.scaled_dot_product_attention(q, keys, values).view(heads * d)
        return linear(out, self.wo)


class MLP(nn.Module):
    def __init__(self, dims: Dims):
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.up_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.down_proj = nn.Linear(dims.intermediate, dims.hidden, bias=False)

    def fuse(self) -> None:
        """gate and up as views of one [2·intermediate, hidden] matrix (one matmul; see Attention.fuse)."""
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight])
        n = self.gate_proj.weight.shape[0]
        self.gate_proj.weight = nn.Parameter(w[:n], requires_grad=False)
        self.up_proj.weight = nn.Parameter(w[n:], requires_grad=False)
        self.w_gate_up, self.w_down = w, self.down_proj.weight.detach()

    def quantize(self, kind: str) -> None:
        self.w_gate_up, self.w_down = quantize(self.w_gate_up, kind), quantize(self.w_down, kind)
        del self.gate_proj, self.up_proj, self.down_proj

    def forward(self, x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = linear(x, self.w_gate_up, scratch).chunk(2, dim=-1)
        return linear(F.silu(gate) * up, self.w_down, scratch)


class Block(nn.Module):
    def __init__(self, dims: Dims):
        super().__init__()
        self.input_layernorm = RMSNorm(dims.hidden, dims.rms_eps)
        self.self_attn = Attention(dims)
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.rms_eps)
        self.mlp = MLP(dims)

    def forward(self, x, cos, sin, start, mask, slot=0, scratch=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, start, mask, slot, scratch)
        return x + self.mlp(self.post_attention_layernorm(x), scratch)

    def step(self, x, cos, sin, slots, positions):
        x = x + self.self_attn.step(self.input_layernorm(x), cos, sin, slots, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


__all__ = ["rms_norm", "RMSNorm", "rope_table", "apply_rope", "signed_sin", "KVCache", "Attention", "MLP", "Block"]
