"""Measurement helpers shared by the benchmark scripts: medians of warmed-up runs, the machine's copy
bandwidth (the physical floor a memory-bound decode step is compared with), the weight bytes a decode
step streams, and markdown tables (random weights come from `engine.demo.random_backbone`).

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


def decode_weight_bytes(dims: Dims, bytes_per_weight: float, head_bytes_per_weight: float | None = None) -> float:
    """Weight bytes one decode step must read: every layer matrix, the norms and the audio head (the text
    embedding is not touched while decoding audio rows). The head may be stored wider than the layers
    (the fp8 GPU path keeps it in bf16: `head_bytes_per_weight=2`)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    per_layer = dims.hidden * (2 * q + 2 * kv) + 3 * dims.hidden * dims.intermediate
    head = bytes_per_weight if head_bytes_per_weight is None else head_bytes_per_weight
    return bytes_per_weight * dims.layers * per_layer + head * dims.audio_rows * dims.hidden


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
