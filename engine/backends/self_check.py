"""The self-check that a fast backend must pass before the engine trusts it: the paths users' takes run,
through the backend and through the torch path on the same device and weights, compared by logit cosine
and greedy agreement against documented thresholds, and rows sampled on the device at T > 0 against the
host sampler. In order:

 1. a 32-token prompt (prefill: the GEMM path) and 8 teacher-forced decode steps (the GEMV step), the last
    2 again through the batched step in slot 0, the first in slot 1 of bucket 4 beside 3 padding rows (the
    prompt's KV copied into slot 1, as a kept prefix is reused), then greedy rows through the fused step
    (`begin` / `rows`: the device sampler, the captured graph) from there;
 2. the long context, a voice-clone-like prompt of text and reference audio rows up to SELF_CHECK_CONTEXT
    positions: the reference prefills it, its KV up to SELF_CHECK_PREFILL positions before the end is
    written into the backend as a kept prefix (the reference and the backend then hold the same KV below
    the offset), both prefill the rest at that offset (prefix reuse), then a decode step at the end. From
    961 to 1024 positions every split of the split-K decode attention holds data (16 splits of 64
    positions, kernels/attention.py), so the cross-split combine, a KV write past the first split and the
    fused kernel's ticket order run here before they run in a user's take;
 3. buckets 8 and 16 of the batched step, three takes in three slots at their own positions (slot 0 at the
    long context; slot 2 holding slot 1's prompt, copied, then reference audio rows prefilled at an offset)
    beside padding rows;
 4. rows sampled on the device at the studio's default temperature, top-k and top-p from the long context,
    each pick against engine/sampling.py's on the same logits and uniforms.

Every comparison of logits is one step of the tally; the first under the cosine threshold ends the check
and names itself (`stopped_at`). The KV the check writes is overwritten by the next take's prefill."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import AUDIO_PLACEHOLDER
from engine.types import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

BF16 = torch.bfloat16

# A fixed prompt of 32 tokens: the cubin backend's calibration prompt (Qwen chat tokens around ordinary text
# ids, engine/backends/calibration.py `CALIBRATION_IDS`), then more ordinary text ids, so prefill runs the GEMM
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
# The long context: its decode step's position, so that every one of the 16 decode-attention splits holds
# data (961 to 1024 positions), and how many positions before it the backend prefills at an offset (a
# prompt's prefill at 4B: several GEMM row tiles; the rest is the reference's KV, written as a kept prefix).
# The prompt: SELF_CHECK_TEXT text ids, reference audio rows, SELF_CHECK_TEXT text ids again. On a GPU at
# 4B the long context costs tens of milliseconds.
SELF_CHECK_CONTEXT = 1000
SELF_CHECK_PREFILL = 320
SELF_CHECK_TEXT = 8
# The buckets above 4, each running three takes in three slots.
SELF_CHECK_BUCKETS = (8, 16)
SELF_CHECK_SLOTS = 3
# Rows sampled on the device at the studio's defaults, and the seed of their uniforms.
SELF_CHECK_SAMPLED_ROWS = 4
SELF_CHECK_SAMPLING = (DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P)
SELF_CHECK_SEED = 1234
# Thresholds. The cubin path and the torch path compute the same math, so on correct kernels they differ
# by rounding: BF16 by accumulation order and bf16 stores (cosine min 0.9999, greedy 72/72 on the tiny
# checkpoint), FP8 by the W8A8 quantisation (0.9944, 68/72 there; real weights' outlier channels cost
# more, hence the margin). The broken GEMV/GEMM of tests/test_self_check.py (zeroed output, transposed
# weight, FP8 weight scale off by 16×) gave cosine min 0.00 / -0.07 / -0.05; NaN counts as -1. Greedy
# agreement counts codebook argmaxes equal to the torch path's; near-ties on random weights flip some under
# FP8, so its floor is low: it is there for garbage, not for precision.
SELF_CHECK_MIN_COSINE = {"bf16": 0.999, "fp8": 0.98}
SELF_CHECK_MIN_GREEDY = {"bf16": 0.9, "fp8": 0.5}
# A sampled pick may differ from the host sampler's only where the draw u or the top-p mass lies within
# float rounding of a boundary of the running mass (the GPU's exp and its fp32 tree sums are not torch's):
# such a pick is the host's with u or top_p moved by at most this much.
SAMPLE_BOUNDARY = 1e-5


class SelfCheckFailed(RuntimeError):
    """The cubin path disagrees with the torch path on the same weights: its kernels are not trusted."""


@dataclass(frozen=True)
class SelfCheck:
    precision: str
    cosine_min: float     # over every compared step's logits; -1 for NaN/inf
    greedy: int           # codebook argmaxes equal to the torch path's
    total: int
    seconds: float
    rows_greedy: int = 0  # fused rows' codebooks equal to the reference's argmax along those rows
    rows_total: int = 0   # codebooks past the delay window in those rows
    stopped_at: str = ""  # the first comparison under the cosine threshold: the check ends there
    sampled_same: int = 0      # device-sampled picks equal to the host sampler's
    sampled_boundary: int = 0  # picks that differ only within float rounding of a boundary
    sampled_total: int = 0     # picks past the delay window in the sampled rows
    ran: str = ""         # what the check ran (its sizes), for the summary

    @property
    def ok(self) -> bool:
        floor = SELF_CHECK_MIN_GREEDY[self.precision]
        return (not self.stopped_at and self.cosine_min >= SELF_CHECK_MIN_COSINE[self.precision]
                and self.greedy >= floor * self.total and self.rows_total > 0
                and self.rows_greedy >= floor * self.rows_total and self.sampled_total > 0
                and self.sampled_same + self.sampled_boundary == self.sampled_total)

    @property
    def summary(self) -> str:
        where = f" (stopped at the first failing comparison: {self.stopped_at})" if self.stopped_at else ""
        t, k, p = SELF_CHECK_SAMPLING
        return (f"{'passed' if self.ok else 'FAILED'}: {self.precision} logits vs the torch path, cosine min "
                f"{self.cosine_min:.4f} (needs {SELF_CHECK_MIN_COSINE[self.precision]}), greedy "
                f"{self.greedy}/{self.total} (needs {SELF_CHECK_MIN_GREEDY[self.precision]:.0%}), "
                f"{self.ran or 'sizes not recorded'}; fused greedy rows {self.rows_greedy}/{self.rows_total}; "
                f"sampled at T {t} / top-k {k} / top-p {p}: {self.sampled_same}/{self.sampled_total} picks the "
                f"host sampler's, {self.sampled_boundary} within rounding of a boundary (needs all); "
                f"{self.seconds:.1f} s{where}")


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    c = float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))
    return c if math.isfinite(c) and torch.isfinite(a).all() else -1.0


class _Tally:
    """The comparisons so far: each step's cosine and greedy agreement, and the first one under the threshold;
    the fused rows' and the sampled rows' counts."""

    def __init__(self, precision: str, ran: str):
        self.precision, self.ran, self.t0 = precision, ran, time.perf_counter()
        self.cosines: list[float] = []
        self.greedy = self.total = 0
        self.rows = (0, 0)
        self.sampled = (0, 0, 0)
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

    def result(self) -> SelfCheck:
        return SelfCheck(self.precision, min(self.cosines), self.greedy, self.total, time.perf_counter() - self.t0,
                         *self.rows, self.stopped_at, *self.sampled, self.ran)


def long_ids(length: int) -> torch.Tensor:
    """The long context's `length` ids: SELF_CHECK_TEXT ordinary text ids of SELF_CHECK_IDS, reference audio
    placeholders, then SELF_CHECK_TEXT text ids (a voice-clone prompt's shape: its audio rows, then text)."""
    text = [t for t in SELF_CHECK_IDS if t < 151643]  # the ids below Qwen's special tokens
    words = min(SELF_CHECK_TEXT, length // 2)
    return torch.tensor(text[:words] + [AUDIO_PLACEHOLDER] * (length - 2 * words) + text[len(text) - words:],
                        dtype=torch.long)


def long_prompt(dims, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`long_ids(length)` and the reference audio rows of its placeholders: fixed pseudo-random codes, the
    same on every run and device."""
    ids = long_ids(length)
    audio = int((ids == AUDIO_PLACEHOLDER).sum())
    gen = torch.Generator().manual_seed(0)
    return ids, torch.randint(0, dims.codebook_size, (audio, dims.codebooks), generator=gen)


def _split(ids: torch.Tensor, rows: torch.Tensor, at: int):
    """(ids, rows) before and from position `at` of a prompt, each part with the rows of its placeholders."""
    k = int((ids[:at] == AUDIO_PLACEHOLDER).sum())
    return (ids[:at], rows[:k]), (ids[at:], rows[k:])


def describe(ids: int, steps: int, rows_steps: int, start: int, context: int, prefill: int, buckets,
             audio: int) -> str:
    """What a check of these sizes runs, as the summary names it."""
    offset = max(start, context - prefill)
    long = ""
    if context > start:
        rows = int((long_ids(context - start)[offset - start:] == AUDIO_PLACEHOLDER).sum())
        long = (f"a long context to position {context} ({offset - start} positions of the reference's KV as a "
                f"kept prefix, then a prefill of {context - offset} at offset {offset} with {rows} reference audio "
                "rows), ")
    takes = (f", buckets {' and '.join(map(str, buckets))} (takes in slots 0-{SELF_CHECK_SLOTS - 1}; slot 2 "
             f"holding slot 1's prompt and {audio} reference audio rows prefilled at offset {ids})" if buckets else "")
    return (f"{ids}-token prompt + {steps} steps + {rows_steps} batched steps + 1 in bucket {SELF_CHECK_BUCKET} "
            f"(slot 1 holding the prompt as a kept prefix, padding rows), {long}a step at position "
            f"{max(context, start)}{takes}")


def self_check(backend, reference, *, ids=SELF_CHECK_IDS, steps: int = SELF_CHECK_STEPS,
               rows_steps: int = SELF_CHECK_ROWS_STEPS, fused_rows: int = SELF_CHECK_FUSED_ROWS,
               context: int = SELF_CHECK_CONTEXT, prefill: int = SELF_CHECK_PREFILL,
               buckets: tuple[int, ...] = SELF_CHECK_BUCKETS, sampled_rows: int = SELF_CHECK_SAMPLED_ROWS) -> SelfCheck:
    """Run the check (module docstring) through `backend` and `reference` (the torch path on the same device
    and weights), both fed the reference's rows. The sizes default to production's; `context` at or below
    the prompt and the fused rows leaves the long context out, `buckets` () the buckets above 4 (the CPU
    tests' shorter checks). The backend's slots and cache length are grown for the check and given back."""
    ids = torch.tensor(ids, dtype=torch.long)
    start = len(ids) + steps + fused_rows  # where the long context continues slot 0's sequence
    audio = steps // 2
    tally = _Tally(backend.precision, describe(len(ids), steps, rows_steps, start, context, prefill, buckets, audio))
    slots, max_len = backend.slots, backend.max_len
    try:
        if slots < SELF_CHECK_SLOTS:
            backend.setup_slots(SELF_CHECK_SLOTS)
        _run(tally, backend, reference, ids, steps, rows_steps, fused_rows, max(context, start), prefill, buckets,
             audio, sampled_rows)
    finally:
        if backend.slots != slots:
            backend.setup_slots(slots)
        if backend.max_len != max_len:
            backend.setup_cache(max_len)
    return tally.result()


def _run(tally: _Tally, backend, reference, ids, steps, rows_steps, fused_rows, context, prefill, buckets, audio,
         sampled_rows) -> None:
    """The comparisons in order, into `tally`; returns at the first that fails."""
    dev, boc, n = backend.device, backend.dims.boc, len(ids)
    want = reference.prefill(ids.to(dev), None, 0)
    got = backend.prefill(ids, None, 0)
    if tally.add("the prefill", got, want):
        return
    fed = []
    for step in range(steps):
        row = want.argmax(-1)
        row[step + 1:] = boc  # the delay window, as calibration feeds it
        want, got = reference.decode(row, n + step), backend.decode(row, n + step)
        if tally.add(f"decode step {step + 1}", got, want):
            return
        fed.append((row, n + step, want))
    for row, pos, step_want in fed[len(fed) - rows_steps:]:
        if tally.add(f"the batched step at position {pos}", backend.decode_rows(row[None], [0], [pos])[0],
                     step_want):
            return
    _write_kept(backend, _slot_kv(backend, 0), 0, n, slot=1)  # slot 1 holds the prompt, as a kept prefix
    row, pos, step_want = fed[0]
    if tally.add(f"slot 1 of bucket {SELF_CHECK_BUCKET}", backend.decode_rows(row[None], [1], [pos],
                                                                              bucket=SELF_CHECK_BUCKET)[0], step_want):
        return
    end = n + steps
    agree, total, want, got = _fused_rows_check(backend, reference, got, want, end, fused_rows)
    tally.rows = (agree, total)
    # The long context continues slot 0 after the fused rows, where both paths hold the same sequence.
    end += fused_rows
    _make_room(backend, reference, context + sampled_rows + 1)
    if context > end:
        prompt_ids, rows = long_prompt(backend.dims, context - end)
        offset = max(end, context - prefill)
        (kept_ids, kept_rows), (tail_ids, tail_rows) = _split(prompt_ids, rows, offset - end)
        if offset > end:  # the reference's KV of [end, offset), written into the backend as a kept prefix
            reference.prefill(kept_ids.to(dev), kept_rows.to(dev), end)
            _write_kept(backend, reference.read_prefix(0, offset), end, offset)
        want = reference.prefill(tail_ids.to(dev), tail_rows.to(dev), offset)
        got = backend.prefill(tail_ids, tail_rows, offset)
        if tally.add(f"the prefill at offset {offset} ({len(tail_ids)} positions, {len(tail_rows)} reference audio "
                     "rows)", got, want):
            return
        end = context
    tail = got  # the backend's logits for position `end`: the sampled rows start from them
    row = want.argmax(-1)
    want = reference.decode(row, end)
    if tally.add(f"the decode step at position {end}", backend.decode(row, end), want):
        return
    if buckets and _buckets_check(tally, backend, ids, fed, (row, end, want), audio, buckets):
        return
    tally.sampled = _sampled_rows_check(backend, tail, end, sampled_rows)


def _make_room(backend, reference, positions: int) -> None:
    """Grow the backend's and the reference's caches to `positions`, keeping what they hold (the engine's
    cache of 4096 positions needs nothing; the CPU tests' short caches do)."""
    if backend.max_len < positions:
        backend.setup_cache(positions)
    if reference.max_len < positions:
        reference.setup_cache(positions)


def _slot_kv(backend, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The backend's KV `slot`, every layer's (k, v) [kv_heads, max_len, head_dim] (views, not copies)."""
    return [(layer.kc[slot], layer.vc[slot]) for layer in backend.layers]


def _write_kept(backend, kv, lo: int, hi: int, slot: int = 0) -> None:
    """Positions [lo, hi) of the backend's KV `slot` from `kv` (per layer (k, v) [kv_heads, ≥ hi, head_dim]:
    the reference's `read_prefix` copies or another slot's): what a kept prefix's reuse writes."""
    with backend._on_stream():
        for layer, (k, v) in zip(backend.layers, kv):
            layer.kc[slot, :, lo:hi] = k[:, lo:hi]
            layer.vc[slot, :, lo:hi] = v[:, lo:hi]


def _buckets_check(tally: _Tally, backend, ids, fed, long_take, audio: int, buckets) -> bool:
    """Three takes through each of `buckets` beside padding rows, in other orders: slot 0 at the long context,
    slot 1 (the bucket-4 take's: the prompt) at the first step, and slot 2 at step `audio`, holding slot 1's
    prompt (copied: a kept prefix) and the first `audio` fed rows prefilled at its end as reference audio
    rows. True when one fails."""
    n = len(ids)
    _write_kept(backend, _slot_kv(backend, 1), 0, n, slot=2)
    rows = torch.stack([row for row, _, _ in fed[:audio]])
    got = backend.prefill(torch.full((audio,), AUDIO_PLACEHOLDER, dtype=torch.long), rows, n, slot=2)
    if tally.add(f"the prefill at offset {n} with {audio} reference audio rows (slot 2)", got, fed[audio - 1][2]):
        return True
    takes = {0: long_take, 1: fed[0], 2: fed[audio]}
    for bucket, order in zip(buckets, ((2, 0, 1), (1, 2, 0))):
        got = backend.decode_rows(torch.stack([takes[s][0] for s in order]), list(order),
                                  [takes[s][1] for s in order], bucket=bucket)
        for i, slot in enumerate(order):
            if tally.add(f"slot {slot} of bucket {bucket} at position {takes[slot][1]}", got[i], takes[slot][2]):
                return True
    return False


def _fused_rows_check(backend, reference, first: torch.Tensor, want: torch.Tensor, pos: int, n: int):
    """Greedy `rows(n)` through the fused step from the backend's logits `first` at `pos`, against the
    reference's argmax rows from its logits `want`: (agreeing codebooks, codebooks past the delay window, the
    reference's and the backend's logits for the position after them). The reference is fed the fused
    path's own rows, so both hold the same sequence in slot 0 afterwards."""
    backend.begin(first.to(backend.device), pos, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=n)
    rows, _ = backend.rows(n)
    agree = total = 0
    for step, row in enumerate(rows):
        live = min(step + 1, backend.dims.codebooks)  # codebook k is BOC until step k
        agree += int((row[:live] == want.argmax(-1).cpu()[:live]).sum())
        total += live
        want = reference.decode(row.to(backend.device), pos + step)
    return agree, total, want, _device_logits(backend)


def _device_logits(backend) -> torch.Tensor:
    """The logits the fused step's next row is sampled from (the backend's buffer, on the host)."""
    return backend.logits.view(backend.dims.codebooks, backend.dims.codebook_vocab).float().cpu().clone()


def _sampled_rows_check(backend, logits: torch.Tensor, pos: int, n: int) -> tuple[int, int, int]:
    """`n` rows sampled on the device (`begin` / `rows`, SELF_CHECK_SAMPLING, SELF_CHECK_SEED) from `logits`
    fed at `pos`, one row at a time, each pick against engine/sampling.py's from the logits the device
    sampled it from: (picks the same, picks that differ only within float rounding of a boundary, picks
    past the delay window)."""
    from engine.sampling import sample, uniforms

    temperature, top_k, top_p = SELF_CHECK_SAMPLING
    books = backend.dims.codebooks
    backend.begin(logits.to(backend.device), pos, seed=SELF_CHECK_SEED, temperature=temperature, top_k=top_k,
                  top_p=top_p, max_rows=n)
    same = boundary = total = 0
    for step in range(n):
        seen = _device_logits(backend)
        rows, _ = backend.rows(1)
        u = uniforms(SELF_CHECK_SEED, step, books)
        got, want = rows[0], sample(seen, u, temperature, top_k, top_p)
        live = min(step + 1, books)  # codebook k is BOC until step k
        for k in range(live):
            if got[k] == want[k]:
                same += 1
            elif _at_boundary(seen[k], float(u[k]), int(got[k])):
                boundary += 1
        total += live
    return same, boundary, total


def _at_boundary(logits: torch.Tensor, u: float, pick: int) -> bool:
    """Whether the host sampler picks `pick` from one codebook's `logits` with its draw `u` or top-p moved by
    at most SAMPLE_BOUNDARY: a difference within float rounding of a boundary of the running mass."""
    from engine.sampling import sample

    temperature, top_k, top_p = SELF_CHECK_SAMPLING
    for du, dp in ((-SAMPLE_BOUNDARY, 0.0), (SAMPLE_BOUNDARY, 0.0), (0.0, -SAMPLE_BOUNDARY), (0.0, SAMPLE_BOUNDARY)):
        draw = torch.tensor([min(max(u + du, 0.0), 1.0 - 2.0 ** -24)])
        if int(sample(logits[None], draw, temperature, top_k, min(top_p + dp, 1.0))[0]) == pick:
            return True
    return False


def run_self_check(backend, checkpoint) -> SelfCheck:
    """Build the torch path in bf16 on the backend's device for the check only, then free it: both copies
    of the weights are held for the check's second or so (4B: 8 GB bf16 beside the 4.5 GB FP8 engine)."""
    from engine.model import HiggsModel

    reference = HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=BF16, device=backend.device,
                                           max_len=SELF_CHECK_CONTEXT + SELF_CHECK_SAMPLED_ROWS + 1)
    try:
        return self_check(backend, reference)
    finally:
        del reference
        if backend.device.type == "cuda":
            torch.cuda.empty_cache()
