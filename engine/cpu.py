"""What precision "auto" runs on a CPU, and why, from the CPU's features and the model's size.

- A small model (the tiny demo, test checkpoints) runs fp32: exact, and its step is dispatch-bound anyway.
- A large one (the 4B checkpoint) runs weight-only int8 (engine/quant.py): the step streams every weight
  once, so half the bytes is about half the time; and on a CPU without native bf16 arithmetic (AMD Zen 3,
  AVX2) a bf16 GEMM at 8 rows costs 6.5× its 1-row cost, which int8's kernel (bf16 converted in registers,
  fp32 sums) avoids. Only where the CPU has native bf16 (AVX-512 BF16 or AMX) can bf16 win, so there the
  two are measured now, on matrices of the model's own shapes, and the faster one is kept.
int4 is never picked here: its fidelity is below int8's (docs/PERFORMANCE.md)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .quant import quantize

# Above this many parameters an fp32 CPU copy is too slow and too large.
LARGE_MODEL_PARAMS = 1_000_000_000


def cpu_facts() -> dict:
    """The CPU's name and the features that decide the precision (torch's own detection)."""
    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    isa = [name for name, key in (("AVX-512", "avx512_f"), ("AVX-512 BF16", "avx512_bf16"), ("AMX BF16", "amx_bf16"),
                                  ("AVX-512 VNNI", "avx512_vnni"), ("AVX2", "avx2")) if caps.get(key)]
    return {"cpu": caps.get("cpu_name") or "unknown CPU", "isa": isa,
            "native_bf16": bool(caps.get("avx512_bf16") or caps.get("amx_bf16")),
            "kernels": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}


def auto_precision(params: int, hidden: int, intermediate: int, facts: dict | None = None,
                   measure=None) -> tuple[str, str]:
    """(precision, the reason in one sentence) for a model of `params` parameters on this CPU. `measure`
    (tests pass their own) returns (bf16 ms, int8 ms) for the model's MLP matrices."""
    facts = facts or cpu_facts()
    where = f"{facts['cpu']} ({', '.join(facts['isa']) or 'no AVX2'})"
    if params <= LARGE_MODEL_PARAMS:
        return "fp32", f"a small model ({params / 1e6:.0f}M parameters) runs fp32 on the CPU"
    if not facts["native_bf16"]:
        return "int8", f"{where} has no native bf16, so weight-only int8 (half the bytes of bf16) is faster"
    bf16_ms, int8_ms = (measure or measure_mlp)(hidden, intermediate)
    if bf16_ms < int8_ms:
        return "bf16", f"{where} has native bf16, measured faster than int8 now ({bf16_ms:.1f} vs {int8_ms:.1f} ms)"
    return "int8", f"int8 measured faster than bf16 on {where} now ({int8_ms:.1f} vs {bf16_ms:.1f} ms)"


def measure_mlp(hidden: int, intermediate: int, rows=(1, 8), repeats: int = 5) -> tuple[float, float]:
    """Median ms of one MLP's three matmuls (gate/up, down) at 1 and 8 rows, bf16 against int8, interleaved.
    Two layers' worth of matrices are cycled so that no repeat finds its weights in the cache."""
    gen = torch.Generator().manual_seed(0)
    mats = [(torch.randn(2 * intermediate, hidden, generator=gen, dtype=torch.bfloat16),
             torch.randn(hidden, intermediate, generator=gen, dtype=torch.bfloat16)) for _ in range(2)]
    packed = [tuple(quantize(w, "int8") for w in pair) for pair in mats]
    xs = {m: (torch.randn(m, hidden, dtype=torch.bfloat16), torch.randn(m, intermediate, dtype=torch.bfloat16))
          for m in rows}
    times = {"bf16": [], "int8": []}
    for r in range(repeats):
        for kind, weights in (("bf16", mats), ("int8", packed)):
            start = time.perf_counter()
            for m in rows:
                up, down = weights[(r + m) % 2]
                a, b = xs[m]
                if kind == "bf16":
                    F.linear(a, up), F.linear(b, down)
                else:
                    up(a), down(b)
            times[kind].append((time.perf_counter() - start) * 1e3)
    return statistics.median(times["bf16"]), statistics.median(times["int8"])


# Below this many parameters a CPU engine runs torch on one thread (see `tune_threads`).
SINGLE_THREAD_PARAMS = 100_000_000


def tune_threads(engine) -> None:
    """Set torch's process-wide thread count for this engine (the app and the CLI call it; a library
    user's process keeps its own setting). Tiny CPU models (the demo) are all small ops: OpenMP's
    parallel regions then cost more than they save, and on a loaded 2-core machine waiting for a
    descheduled thread made the demo 7× slower (10.4 vs 1.5 ms/row, docs/PERFORMANCE.md). Big models keep
    every core for their matmuls."""
    if engine.device.type == "cpu" and engine.info.params is not None \
            and engine.info.params < SINGLE_THREAD_PARAMS:
        torch.set_num_threads(1)


__all__ = ["cpu_facts", "auto_precision", "measure_mlp", "tune_threads", "LARGE_MODEL_PARAMS", "SINGLE_THREAD_PARAMS"]
