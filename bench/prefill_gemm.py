"""One layer's projections at a prefill chunk's row count, full width, each way an int8 prefill could run them:
`python -m bench.prefill_gemm` (and again with `ONEDNN_MAX_CPU_ISA=AVX2` in the environment, to see what a CPU
without AVX-512 or VNNI gets from oneDNN).

- bf16 `linear`: the bf16 model's prefill;
- dequantised into a scratch, then one bf16 GEMM: the int8 model's prefill as built (`engine.quant.linear`);
- the same in tiles of 1024 output rows (the tile's dequantised rows stay in cache for its GEMM);
- `_weight_int8pack_mm`: the packed kernel, a GEMV per row block;
- `torch._int_mm`: int8 × int8 with the activations quantised per row (W8A8: other math, other rounding);
  and whether its int32 sums equal the exact integer product (on ±127 inputs and on uniform random ones).

Each a median of 5 after one warm-up, wall time, the process's torch threads."""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from bench.common import Table, machine_line
from engine.quant import Int8Weight, linear

# The 4B model's projections, [N, K]: q/k/v (32 + 8 + 8 heads of 128), o, gate/up, down.
FULL_WIDTH = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
TILE_ROWS = 1024


def median_ms(fn, repeat: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def int_mm_w8a8(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x · Wᵀ through torch's int8 GEMM, x quantised per row (symmetric, 127 levels)."""
    xs = x.float().abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
    xq = torch.round(x.float() / xs).to(torch.int8)
    return (torch._int_mm(xq, w.q.t()).float() * xs * w.scales.float()).to(torch.bfloat16)


def tiled(x: torch.Tensor, w: Int8Weight, scratch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    for i in range(0, n, TILE_ROWS):
        rows = min(TILE_ROWS, n - i)
        tile = scratch[:rows * k].view(rows, k)
        tile.copy_(w.q[i:i + rows])
        tile.mul_(w.scales[i:i + rows, None])
        torch.matmul(x, tile.t(), out=out[:, i:i + rows])
    return out


def int_mm_error(m: int, k: int, n: int) -> tuple[int, int]:
    """The largest |torch._int_mm − exact product| on ±127 inputs and on uniform random int8 ones."""
    gen = torch.Generator().manual_seed(0)
    worst = []
    for extreme in (True, False):
        if extreme:
            x = torch.full((m, k), 127, dtype=torch.int8)
            w = torch.full((n, k), 127, dtype=torch.int8)
            w[::2] = -127
        else:
            x = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
        exact = x.long() @ w.long().t()
        worst.append(int((torch._int_mm(x, w.t()).long() - exact).abs().max()))
    return worst[0], worst[1]


def one_matrix(n: int, k: int, rows: int, gen: torch.Generator) -> dict[str, float]:
    """Each way's ms for one [n, k] matrix at `rows` rows."""
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    q = Int8Weight.from_float(w)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    scratch = torch.empty(n * k, dtype=torch.bfloat16)
    out = torch.empty(rows, n, dtype=torch.bfloat16)
    return {"bf16": median_ms(lambda: F.linear(x, w)),
            "scratch": median_ms(lambda: linear(x, q, scratch)),
            "tiled": median_ms(lambda: tiled(x, q, scratch, out)),
            "int8pack": median_ms(lambda: q(x)),
            "int_mm": median_ms(lambda: int_mm_w8a8(x, q))}


def bench(rows: int, shrink: int = 1) -> Table:
    gen = torch.Generator().manual_seed(0)
    out_rows, total = [], {}
    for name, (n, k) in FULL_WIDTH.items():
        n, k = n // shrink, k // shrink
        ms = one_matrix(n, k, rows, gen)
        for key, v in ms.items():
            total[key] = total.get(key, 0.0) + v
        out_rows.append([name, f"{n} × {k}", *ms.values()])
    out_rows.append(["one layer", "", *total.values()])
    out_rows.append(["÷ bf16", "", *(f"{total['bf16'] / v:.2f}×" for v in total.values())])
    return Table(f"One layer's projections at {rows} rows, ms (median of 5); {machine_line()}; "
                 f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')}",
                 ["matrix", "N × K", "bf16 linear", "int8 → bf16 scratch + GEMM", f"same, {TILE_ROWS}-row tiles",
                  "int8pack (GEMV blocks)", "torch._int_mm W8A8"], out_rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=64, help="rows per GEMM (the scheduler's prefill chunk)")
    ap.add_argument("--smoke", action="store_true", help="a 16th of the width (seconds); for the test suite")
    args = ap.parse_args(argv)
    print(bench(args.rows, 16 if args.smoke else 1).markdown())
    extreme, random = int_mm_error(args.rows, 2560, 512)
    print(f"\ntorch._int_mm against the exact integer product ({args.rows} × 2560 · 2560 × 512): largest error "
          f"{extreme} on ±127 inputs, {random} on uniform random int8 ({'exact' if extreme == random == 0 else 'NOT exact'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
