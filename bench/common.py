"""Measurement helpers shared by the benchmark scripts: medians of warmed-up runs, the machine's copy
bandwidth (the physical floor a memory-bound decode step is compared with), random weights in the
engine's internal layout, and markdown tables.

Benchmarks print tables; they never assert a time (these machines are shared and noisy). Every figure
is a median over repeated runs measured in the same process as the floor it is compared with.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from engine.config import Dims
from engine.model import LAYER_SUFFIXES


def median_ms(fn, *, repeat: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` in milliseconds after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write counted), the memcpy-style limit of
    this machine. A decode step that streams every weight once per frame cannot beat
    weight_bytes / this bandwidth."""
    src = torch.empty(nbytes, dtype=torch.uint8)
    src.fill_(1)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), repeat=repeat)
    return 2 * nbytes / (ms / 1e3)


def random_backbone(dims: Dims, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in the engine's internal names (docs/ARCHITECTURE.md), scaled by 1/sqrt(fan_in) so
    activations stay finite through many layers. Norm weights are ones."""
    gen = torch.Generator().manual_seed(seed)
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    shapes = {
        "input_layernorm.weight": (dims.hidden,), "post_attention_layernorm.weight": (dims.hidden,),
        "self_attn.q_proj.weight": (q, dims.hidden), "self_attn.k_proj.weight": (kv, dims.hidden),
        "self_attn.v_proj.weight": (kv, dims.hidden), "self_attn.o_proj.weight": (dims.hidden, q),
        "self_attn.q_norm.weight": (dims.head_dim,), "self_attn.k_norm.weight": (dims.head_dim,),
        "mlp.gate_proj.weight": (dims.intermediate, dims.hidden), "mlp.up_proj.weight": (dims.intermediate, dims.hidden),
        "mlp.down_proj.weight": (dims.hidden, dims.intermediate),
    }
    assert set(shapes) == set(LAYER_SUFFIXES)

    def fill(shape):
        if len(shape) == 1:
            return torch.ones(shape, dtype=dtype)
        t = torch.empty(shape, dtype=dtype)
        return t.normal_(0.0, shape[1] ** -0.5, generator=gen)

    state = {f"layers.{i}.{s}": fill(shape) for i in range(dims.layers) for s, shape in shapes.items()}
    state["norm.weight"] = torch.ones(dims.hidden, dtype=dtype)
    state["text_embedding.weight"] = torch.empty(dims.vocab, dims.hidden, dtype=dtype).normal_(0, 1, generator=gen)
    state["audio_embedding.weight"] = torch.empty(dims.audio_rows, dims.hidden, dtype=dtype).normal_(
        0, dims.hidden ** -0.5, generator=gen)
    return state


def decode_weight_bytes(dims: Dims, bytes_per_weight: float) -> float:
    """Weight bytes one decode step must read: every layer matrix, the norms and the audio head (the text
    embedding is not touched while decoding audio rows)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    per_layer = dims.hidden * (2 * q + 2 * kv) + 3 * dims.hidden * dims.intermediate
    return bytes_per_weight * (dims.layers * per_layer + dims.audio_rows * dims.hidden)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list]

    def markdown(self) -> str:
        def cell(v):
            if isinstance(v, float):
                return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
            return str(v)
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)


def machine_line() -> str:
    """What the figures were measured on, including the load from other processes at the start (these
    machines are shared: a load average above the core count slows every figure)."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}, Python {platform.python_version()}, load average {load}")
