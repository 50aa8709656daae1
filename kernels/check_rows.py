"""The device check's table and comparisons: one `Row` per line, the real decode shapes the cases run at, and
the tolerances they are held to (kernels/check.py runs the cases; bench/gpu_check.py adds the model rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
# Real decode shapes (engine/config.py FULL_SIZE), repeated here because kernels/ must not import engine/.
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, AUDIO_ROWS = 2560, 9728, 32, 8, 128, 8 * 1026
EPS = 1e-6
# Tolerances, relative to the largest reference value: bf16 outputs carry 8 mantissa bits (2^-8 ≈ 0.4 %,
# doubled for accumulation order); fp8 outputs are compared dequantised (e4m3 half-step = 2^-4 relative).
TOL_BF16, TOL_FP32, TOL_FP8 = 8e-3, 2e-3, 7e-2


@dataclass
class Row:
    """One line of the device-check table."""

    section: str
    item: str
    value: str
    limit: str = ""
    status: str = ""   # PASS / FAIL / INFO / SKIP


def format_table(rows: list[Row]) -> str:
    head = Row("section", "item", "value", "limit", "status")
    cols = list(zip(*[(r.section, r.item, r.value, r.limit, r.status) for r in [head, *rows]]))
    widths = [max(len(c) for c in col) for col in cols]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [line]
    for i, r in enumerate([head, *rows]):
        cells = (r.section, r.item, r.value, r.limit, r.status)
        out.append("|".join(f" {c:<{w}} " for c, w in zip(cells, widths)))
        if i == 0:
            out.append(line)
    out.append(line)
    fails = sum(r.status == "FAIL" for r in rows)
    out.append(f"{'ALL PASS' if not fails else f'{fails} FAIL'} ({sum(r.status == 'PASS' for r in rows)} pass, "
               f"{sum(r.status == 'INFO' for r in rows)} info, {sum(r.status == 'SKIP' for r in rows)} skip)")
    return "\n".join(out)


def rel_max(got, want) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def deq(x8, scale) -> torch.Tensor:
    return x8.double().cpu() * scale.double().cpu()


def randn(gen, *shape, scale=1.0, dtype=BF16):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)
