"""Where an engine runs: the device choice, the KV slots that fit a card, and the peak-memory figure of a
take's metrics."""

from __future__ import annotations

from pathlib import Path

import torch

from .config import Dims


class GpuUnusable(ValueError):
    """An NVIDIA GPU is present but this torch cannot use it; the message names the fix."""


def resolve_device(device: str | torch.device) -> torch.device:
    """"auto" → CUDA when torch can use it. An NVIDIA GPU that torch cannot use (CPU-only torch, a driver
    too old for torch's CUDA, an arch missing from the build) stops "auto" and "cuda" with the fix,
    rather than quietly running a 4B model on the CPU; only an explicit "cpu" goes ahead."""
    try:
        dev = torch.device("cuda" if device == "auto" else device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; use 'auto', 'cpu' or 'cuda'")
    if dev.type == "cuda":
        from kernels.runtime import torch_cannot_use_gpu

        unusable = torch_cannot_use_gpu(dev.index or 0)
        if unusable:
            raise GpuUnusable(unusable)
    if device == "auto":
        return dev if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available; use device='cpu'")
    return dev


def plan_memory(model, dims: Dims, dev: torch.device, max_batch: int, itemsize: int) -> tuple[int, str | None]:
    """On CUDA, the KV slots and positions that fit the card beside the loaded weights
    (engine/backends/memory.py): fewer slots than max_batch when they do not all fit, a shorter cache when
    not even one does. Returns (slots, the plan's sentence for engine.info); (max_batch, None) off CUDA."""
    if dev.type != "cuda":
        return max_batch, None
    from .backends.memory import plan_for_device

    plan = plan_for_device(dims, dev, max_batch=max_batch, max_len=model.max_len, itemsize=itemsize)
    if plan.positions < model.max_len:
        model.setup_cache(plan.positions)
    return plan.slots, plan.summary


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, kind): the peak of torch's CUDA allocations on a GPU, else this process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "vram"
    try:  # peak resident set size of this process, without psutil
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "rss"
    except OSError:
        pass
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "rss"


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
