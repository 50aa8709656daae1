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
from engine.checkpoint import expected_shapes


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


def random_backbone(dims: Dims, dtype: torch.dtype, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Random weights in the engine's internal names (docs/ARCHITECTURE.md), scaled by 1/sqrt(fan_in) so
    activations stay finite through many layers. Norm weights are ones. Generated on `device` (on a GPU
    the 4B full-size set takes seconds, not minutes)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    std = {"text_embedding.weight": 1.0, "audio_embedding.weight": dims.hidden ** -0.5}

    def fill(name, shape):
        if len(shape) == 1:
            return torch.ones(shape, dtype=dtype, device=device)
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std.get(name, shape[1] ** -0.5), generator=gen)

    return {name: fill(name, shape) for name, shape in expected_shapes(dims).items()}


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
