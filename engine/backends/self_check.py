"""The self-check that a fast backend must pass before the engine trusts it: the same fixed prompt and
teacher-forced steps through the backend and through the torch path on the same device and weights,
compared by logit cosine and greedy agreement against documented thresholds (engine/backends/cubin.py's
module docstring says which paths it covers)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16

# A fixed prompt of 32 tokens: the cubin backend's calibration prompt (Qwen chat tokens around ordinary text
# ids, engine/backends/cubin.py `CALIBRATION_IDS`), then more ordinary text ids, so prefill runs the GEMM
# path on a tile boundary's worth of rows; then SELF_CHECK_STEPS teacher-forced decode steps (GEMV).
SELF_CHECK_IDS = (151644, 872, 198, 9707, 11, 419, 374, 264, 2805, 22636, 11652, 369, 279, 7743, 1614, 13,
                  151645, 198, 151644, 77091, 198, 576, 4024, 6666, 2937, 8730, 311, 6351, 13, 151645, 198, 151644)
SELF_CHECK_STEPS = 8
# The last steps run again through the batched step (`decode_rows`, one take), which an engine with
# max_batch > 1 runs for every take: its kernels (skinny GEMMs, batched RoPE/KV write and attention) are
# checked before they are trusted too.
SELF_CHECK_ROWS_STEPS = 2
# The two paths production runs beyond those: one take in slot 1 of bucket 4 beside 3 padding rows (the
# max_batch > 1 path: slots above 0, padding at position -1, a bucket graph above 1), and greedy rows
# through the fused step (`begin` / `rows`: device sampler and graph replay, the max_batch 1 path).
SELF_CHECK_BUCKET = 4
SELF_CHECK_FUSED_ROWS = 4
# Thresholds. The cubin path and the torch path compute the same math, so on correct kernels they differ
# by rounding: BF16 by accumulation order and bf16 stores (cosine min 0.9999, greedy 72/72 on the tiny
# checkpoint), FP8 by the W8A8 quantisation (0.9944, 68/72 there; real weights' outlier channels cost
# more, hence the margin). The broken GEMV/GEMM of tests/test_self_check.py (zeroed output, transposed
# weight, FP8 weight scale off by 16×) gave cosine min 0.00 / -0.07 / -0.05; NaN counts as -1. Greedy
# agreement counts codebook argmaxes equal to the torch path's; near-ties on random weights flip some under
# FP8, so its floor is low: it is there for garbage, not for precision.
SELF_CHECK_MIN_COSINE = {"bf16": 0.999, "fp8": 0.98}
SELF_CHECK_MIN_GREEDY = {"bf16": 0.9, "fp8": 0.5}


class SelfCheckFailed(RuntimeError):
    """The cubin path disagrees with the torch path on the same weights: its kernels are not trusted."""


@dataclass(frozen=True)
class SelfCheck:
    precision: str
    cosine_min: float     # over the prefill and every decode step's logits; -1 for NaN/inf
    greedy: int           # codebook argmaxes equal to the torch path's
    total: int
    seconds: float
    rows_greedy: int = 0  # fused rows' codebooks equal to the reference's argmax along those rows
    rows_total: int = 0   # codebooks past the delay window in those rows
    stopped_at: str = ""  # the first comparison under the cosine threshold: the check ends there

    @property
    def ok(self) -> bool:
        floor = SELF_CHECK_MIN_GREEDY[self.precision]
        return (not self.stopped_at and self.cosine_min >= SELF_CHECK_MIN_COSINE[self.precision]
                and self.greedy >= floor * self.total and self.rows_total > 0
                and self.rows_greedy >= floor * self.rows_total)

    @property
    def summary(self) -> str:
        where = f" (stopped at the first failing comparison: {self.stopped_at})" if self.stopped_at else ""
        return (f"{'passed' if self.ok else 'FAILED'}: {self.precision} logits vs the torch path, cosine min "
                f"{self.cosine_min:.4f} (needs {SELF_CHECK_MIN_COSINE[self.precision]}), greedy "
                f"{self.greedy}/{self.total} (needs {SELF_CHECK_MIN_GREEDY[self.precision]:.0%}), "
                f"{len(SELF_CHECK_IDS)}-token prompt + {SELF_CHECK_STEPS} steps + {SELF_CHECK_ROWS_STEPS} batched "
                f"steps + 1 in bucket {SELF_CHECK_BUCKET} (slot 1, padding rows); fused greedy rows "
                f"{self.rows_greedy}/{self.rows_total}, {self.seconds:.1f} s{where}")


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    c = float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))
    return c if math.isfinite(c) and torch.isfinite(a).all() else -1.0


class _Tally:
    """The comparisons so far: each step's cosine and greedy agreement, and the first one under the threshold."""

    def __init__(self, precision: str):
        self.precision, self.t0 = precision, time.perf_counter()
        self.cosines: list[float] = []
        self.greedy = self.total = 0
        self.stopped_at = ""

    def add(self, where: str, got: torch.Tensor, want: torch.Tensor) -> bool:
        """Count one step's logits; True when they fail the cosine threshold (the check stops there)."""
        got, want = got.float().cpu(), want.float().cpu()
        self.cosines.append(_cosine(got, want))
        self.greedy += int((got.argmax(-1) == want.argmax(-1)).sum())
        self.total += want.shape[0]
        if self.cosines[-1] < SELF_CHECK_MIN_COSINE[self.precision]:
            self.stopped_at = where
        return bool(self.stopped_at)

    def result(self, rows_greedy: int = 0, rows_total: int = 0) -> SelfCheck:
        return SelfCheck(self.precision, min(self.cosines), self.greedy, self.total, time.perf_counter() - self.t0,
                         rows_greedy, rows_total, self.stopped_at)


def self_check(backend, reference, *, ids=SELF_CHECK_IDS, steps: int = SELF_CHECK_STEPS,
               rows_steps: int = SELF_CHECK_ROWS_STEPS, fused_rows: int = SELF_CHECK_FUSED_ROWS) -> SelfCheck:
    """Run `ids` and `steps` decode steps through `backend` and `reference` (the torch path on the same
    device and weights), both fed the reference's greedy rows; then the last `rows_steps` of them again
    through the batched step (`decode_rows` in slot 0, rewriting those positions' KV), and the first in
    slot 1 of bucket SELF_CHECK_BUCKET beside padding rows; compare every step's logits. Then `fused_rows`
    greedy rows through the fused step (`begin` / `rows`), each compared with the reference's argmax
    after the fused path's own previous rows (so one near-tie does not cascade). The check ends at the first
    step whose logits fail the cosine threshold: the kernels are not trusted, and that step says where.
    The backend's KV positions it writes are overwritten by the next take's prefill."""
    tally = _Tally(backend.precision)
    ids = torch.tensor(ids, dtype=torch.long)
    want = reference.prefill(ids.to(backend.device), None, 0)
    if tally.add("the prefill", backend.prefill(ids, None, 0), want):
        return tally.result()
    fed = []
    for step in range(steps):
        row = want.argmax(-1)
        row[step + 1:] = backend.dims.boc  # the delay window, as calibration feeds it
        want = reference.decode(row, len(ids) + step)
        if tally.add(f"decode step {step + 1}", backend.decode(row, len(ids) + step), want):
            return tally.result()
        fed.append((row, len(ids) + step, want))
    for row, pos, want in fed[len(fed) - rows_steps:]:
        if tally.add(f"the batched step at position {pos}", backend.decode_rows(row[None], [0], [pos])[0], want):
            return tally.result()
    slots = backend.slots
    if slots < 2:
        backend.setup_slots(2)
    backend.prefill(ids, None, 0, slot=1)
    row, pos, want = fed[0]
    got = backend.decode_rows(row[None], [1], [pos], bucket=SELF_CHECK_BUCKET)[0]
    if slots < 2:
        backend.setup_slots(slots)
    if tally.add(f"slot 1 of bucket {SELF_CHECK_BUCKET}", got, want):
        return tally.result()
    return tally.result(*_fused_rows_check(backend, reference, ids, fused_rows))


def _fused_rows_check(backend, reference, ids: torch.Tensor, n: int) -> tuple[int, int]:
    """Greedy `rows(n)` through the fused step against the reference's argmax rows: (agreeing codebooks,
    codebooks past the delay window). The reference is fed the fused path's own rows."""
    first = backend.prefill(ids, None, 0)
    backend.begin(first, len(ids), seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=n)
    rows, _ = backend.rows(n)
    logits = reference.prefill(ids.to(backend.device), None, 0)
    agree = total = 0
    for step, row in enumerate(rows):
        want = logits.argmax(-1).cpu()
        live = min(step + 1, backend.dims.codebooks)  # codebook k is BOC until step k
        agree += int((row[:live] == want[:live]).sum())
        total += live
        logits = reference.decode(row.to(backend.device), len(ids) + step)
    return agree, total


def run_self_check(backend, checkpoint) -> SelfCheck:
    """Build the torch path in bf16 on the backend's device for the check only, then free it: both copies
    of the weights are held for the check's second or so (4B: 8 GB bf16 beside the 4.5 GB FP8 engine)."""
    from engine.model import HiggsModel

    reference = HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=BF16, device=backend.device,
                                           max_len=len(SELF_CHECK_IDS) + SELF_CHECK_STEPS)
    try:
        return self_check(backend, reference)
    finally:
        del reference
        if backend.device.type == "cuda":
            torch.cuda.empty_cache()
