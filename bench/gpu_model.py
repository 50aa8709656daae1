"""The device check's model sections: a FULL-SIZE random-weight model through the cubin backend against eager
torch (teacher-forced logits, graph replay, streamed rows) with its benchmark (ms/frame, prefill, TTFA,
RTF, bandwidth against the copy floor), the CUDA-graphed torch path, and the whole-step A/B of every
cubin variant.

Every section is a generator, one precision per section: a row is reported the moment it is measured, so
an overrun or a SIGTERM keeps what came before it. `headline_rows` is the quick pass's figure (ms/frame at
one take), `model_rows` the correctness and the rest of the benchmark, `torch_rows` eager torch beside them;
the three share one `FullModel`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from bench.common import decode_weight_bytes
from bench.gpu_engine import calibration_rows
from engine.backends.cubin import CubinBackend
from engine.config import FRAME_RATE, Dims
from engine.demo import random_backbone
from engine.model import HiggsModel
from engine.streaming import FIRST_PUSH_FRAMES
from kernels.check import Row
from kernels.timing import seconds_per_call

CHUNK_ROWS = 50   # rows per rows() call in the timed takes: one sync per streamed chunk, as the engine does


def cuda_ms(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Median milliseconds of one fn() call measured with CUDA events (device time, after warm-up)."""
    return 1e3 * seconds_per_call(fn, repeat=repeat, warmup=warmup)


def copy_floor(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write), bytes/s: the floor for a weight-streaming step."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda d=dst, s=src: d.copy_(s), repeat=7)
    del src, dst
    return 2 * nbytes / (ms / 1e3)


def greedy(logits: torch.Tensor, step: int, boc: int) -> torch.Tensor:
    row = logits.argmax(-1)
    row[step + 1:] = boc
    return row


def cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


@dataclass
class Reference:
    """Eager torch's greedy take on the random weights: the rows, and the logits before each of them (the
    prefill's, then each step's), for teacher forcing."""
    model: HiggsModel
    logits: list[torch.Tensor]
    rows: list[torch.Tensor]


class FullModel:
    """The random full-size backbone (bf16, on the GPU) and the prompts the headline, model and torch
    sections share, each made when a section first asks for it; `release()` frees them."""

    def __init__(self, dims: Dims, steps: int):
        self.dims, self.steps = dims, steps
        gen = torch.Generator().manual_seed(1)
        self.ids13 = torch.randint(0, 150000, (13,), generator=gen)
        self.ids300 = torch.randint(0, 150000, (300,), generator=gen)
        self._sd: dict | None = None
        self._ref: Reference | None = None

    def sd(self) -> dict[str, torch.Tensor]:
        if self._sd is None:
            self._sd = random_backbone(self.dims, dtype=torch.bfloat16, device="cuda", names="internal")
        return self._sd

    def reference(self) -> Reference:
        if self._ref is None:
            model = HiggsModel.from_state_dict(self.dims, self.sd(), dtype=torch.bfloat16, device="cuda",
                                               max_len=1024)
            logits = model.prefill(self.ids13, None, 0)
            ref = Reference(model, [logits], [])
            for step in range(self.steps):
                ref.rows.append(greedy(logits, step, self.dims.boc))
                logits = model.decode(ref.rows[-1], len(self.ids13) + step)
                ref.logits.append(logits)
            torch.cuda.synchronize()
            self._ref = ref
        return self._ref

    def release(self) -> None:
        self._sd = self._ref = None
        torch.cuda.empty_cache()


def replay_ms_per_frame(be, ids: torch.Tensor, steps: int) -> float:
    """ms/frame of one take at T 0.8 / top-k 30 / top-p 0.8: graph replay, one sync per CHUNK_ROWS rows,
    after one untimed chunk (the capture and the warm-up)."""
    be.begin(be.prefill(ids, None, 0), len(ids), seed=0, temperature=0.8, top_k=30, top_p=0.8,
             max_rows=steps + CHUNK_ROWS)
    be.rows(CHUNK_ROWS)
    torch.cuda.synchronize()
    t0, done = time.perf_counter(), 0
    while done + CHUNK_ROWS <= steps:
        be.rows(CHUNK_ROWS)   # the rows come back to the host: a sync per chunk
        done += CHUNK_ROWS
    return 1e3 * (time.perf_counter() - t0) / max(done, 1)


def weight_bandwidth(dims: Dims, precision: str, ms_frame: float) -> float:
    """Bytes/s of weights one decode step reads at `ms_frame` (the audio head stays bf16)."""
    return decode_weight_bytes(dims, 1 if precision == "fp8" else 2, head_bytes_per_weight=2) / (ms_frame / 1e3)


def loaded_backend(full: FullModel, precision: str, *, ops, stream) -> tuple[CubinBackend, float]:
    t0 = time.perf_counter()
    be = CubinBackend(full.dims, full.sd(), ops=ops, device="cuda", precision=precision, max_len=1024, stream=stream)
    return be, time.perf_counter() - t0


def headline_rows(full: FullModel, precision: str, floor: float | None, results: dict, *, ops, stream
                  ) -> Iterator[Row]:
    """The quick pass's figure for one precision: decode ms/frame of one take (c=1) through the cubin
    backend's graph replay, its weight bandwidth against the copy floor, and the load time. `results`
    receives the ms/frame (the speed-up rows and the microbenchmark's step time use it)."""
    be, load_s = loaded_backend(full, precision, ops=ops, stream=stream)
    try:
        ms = results[precision] = replay_ms_per_frame(be, full.ids13, full.steps)
        yield Row(f"bench {precision}", "decode ms/frame at c=1 (graph replay, sync per 50)",
                  f"{ms:.2f} ms, RTF {ms / (1e3 / FRAME_RATE):.3f} (load {load_s:.1f} s)", "", "INFO")
        if floor:
            bw = weight_bandwidth(full.dims, precision, ms)
            yield Row(f"bench {precision}", "weight bandwidth / D2D copy floor",
                      f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%} of {floor / 1e9:.0f} GB/s", "", "INFO")
    finally:
        del be
        torch.cuda.empty_cache()


def model_rows(full: FullModel, precision: str, *, ops, stream) -> Iterator[Row]:
    """One precision of the cubin backend against eager torch on the same random weights: teacher-forced
    logits, the fused graph's greedy rows, streamed against one-shot rows; then prefill ms/token, the
    backbone's TTFA and peak VRAM; fp8's calibration. The first of these sections makes the eager reference
    take."""
    dims, steps, ids13 = full.dims, full.steps, full.ids13
    ref = full.reference()
    torch.cuda.reset_peak_memory_stats()
    be, load_s = loaded_backend(full, precision, ops=ops, stream=stream)
    try:
        # Teacher-forced: the same rows as torch, compare logits step by step.
        got = be.prefill(ids13, None, 0)
        cos = [cosine(got, ref.logits[0])]
        agree = [float((got.argmax(-1) == ref.logits[0].argmax(-1)).float().mean())]
        for step, row in enumerate(ref.rows):
            got = be.decode(row, 13 + step)
            cos.append(cosine(got, ref.logits[step + 1]))
            agree.append(float((got.argmax(-1) == ref.logits[step + 1].argmax(-1)).float().mean()))
        floor_cos = 0.999 if precision == "bf16" else 0.98
        yield Row(f"model {precision}", f"teacher-forced logits vs torch, {steps + 1} steps",
                  f"min cosine {min(cos):.5f}, greedy agree {sum(agree) / len(agree):.1%}", f"> {floor_cos}",
                  "PASS" if min(cos) > floor_cos else "FAIL")
        # Fused graph replay (device sampling, greedy) vs eager torch greedy rows.
        first = be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        one_shot, _ = be.rows(steps)
        same = (one_shot == torch.stack(ref.rows).cpu()).all(-1)
        prefix = int(same.long().cumprod(0).sum())
        yield Row(f"model {precision}", "graph replay greedy rows vs eager torch",
                  f"{prefix}/{steps} rows identical before first divergence, {same.float().mean():.1%} overall",
                  "info (random weights: near-ties)", "INFO" if precision == "fp8" else
                  ("PASS" if prefix >= min(8, steps) else "FAIL"))
        # Streamed (chunks of 2, 4, 8, ...) vs one-shot: the same graph, so bit-identical rows.
        be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        parts, n = [], 2
        while sum(len(p) for p in parts) < steps:
            parts.append(be.rows(n)[0])
            n *= 2
        streamed = torch.cat(parts)[:steps]
        yield Row(f"model {precision}", "streamed rows(2,4,8..) vs one-shot rows(n)",
                  "identical" if torch.equal(streamed, one_shot) else "DIFFERENT", "identical",
                  "PASS" if torch.equal(streamed, one_shot) else "FAIL")
        # The rest of the benchmark (ms/frame is the headline section's): prefill per token, TTFA, VRAM.
        prefill = {n: cuda_ms(lambda ids=ids, be=be: be.prefill(ids, None, 0), repeat=3) / len(ids)
                   for n, ids in ((13, ids13), (300, full.ids300))}
        yield Row(f"bench {precision}", "prefill ms/token at 13 / 300 tokens",
                  f"{prefill[13]:.3f} / {prefill[300]:.3f} ms", "", "INFO")
        ms_frame = replay_ms_per_frame(be, ids13, steps)
        yield Row(f"bench {precision}", "TTFA backbone (prefill 13 + first 9 rows)",
                  f"{prefill[13] * 13 + ms_frame * (FIRST_PUSH_FRAMES + dims.delay):.1f} ms", "codec not included",
                  "INFO")
        yield Row(f"bench {precision}", "peak VRAM (load + take)", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} "
                  f"GiB (load {load_s:.1f} s)", "", "INFO")
        if be.calibration is not None:   # fp8: the scales' calibration on the random weights, and its rates
            yield from calibration_rows(f"model {precision}", be.calibration, per_layer=False)
    finally:
        del be
        torch.cuda.empty_cache()


def torch_rows(full: FullModel, floor: float | None, cubin_ms: dict) -> Iterator[Row]:
    """Eager torch (HiggsModel bf16) on the same weights: decode ms/frame and its bandwidth, prefill
    ms/token, and the cubin backend's speed-up over it; then the shared model is freed."""
    ref = full.reference()
    ms = cuda_ms(lambda: ref.model.decode(ref.rows[0], len(full.ids13)), repeat=9)
    yield Row("bench torch", "eager decode ms/frame (HiggsModel bf16)", f"{ms:.2f} ms", "", "INFO")
    if floor:
        bw = decode_weight_bytes(full.dims, 2) / (ms / 1e3)
        yield Row("bench torch", "weight bandwidth / D2D copy floor", f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%}", "",
                  "INFO")
    prefill = {n: cuda_ms(lambda ids=ids: ref.model.prefill(ids, None, 0), repeat=3) / len(ids)
               for n, ids in ((13, full.ids13), (300, full.ids300))}
    yield Row("bench torch", "prefill ms/token at 13 / 300 tokens", f"{prefill[13]:.3f} / {prefill[300]:.3f} ms", "",
              "INFO")
    if {"fp8", "bf16"} <= set(cubin_ms):
        yield Row("bench", "speed-up fp8 / bf16 cubin vs torch eager",
                  f"{ms / cubin_ms['fp8']:.2f}x / {ms / cubin_ms['bf16']:.2f}x", "", "INFO")
    del ref
    full.release()


def device_ms(fn, device: torch.device, repeat: int = 5) -> float:
    """Median milliseconds of fn(): CUDA events on a GPU, the wall clock on the CPU (the self-test)."""
    return 1e3 * seconds_per_call(fn, repeat=repeat, cuda=device.type == "cuda")


def torch_graph_rows(dims: Dims, steps: int, device: torch.device, contexts=(64, 512, 2048),
                     cubin_ms: dict | None = None) -> Iterable[Row]:
    """The torch path on CUDA (engine/backends/torch_graph.py), the cubin path's baseline: its graph step
    against the eager step of the same model (teacher-forced logits), fused greedy rows against the eager
    greedy loop, fused device sampling against `engine.sampling.sample` on the same logits, ms/frame as
    the context grows, eager ms/frame, the first capture, VRAM. On the CPU (the self-test) the graphs are
    the stand-in and the dims tiny: the same code, no driver capture."""
    from engine.backends.torch_graph import TorchGraphBackend
    from engine.sampling import sample, uniforms

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator().manual_seed(2)
    sd = random_backbone(dims, dtype=dtype, device=device.type, names="internal")
    model = HiggsModel.from_state_dict(dims, sd, dtype=dtype, device=device, max_len=max(contexts) + steps + 1)
    del sd
    be = TorchGraphBackend(model)
    yield Row("torch-graph", "graphs", be.info["graphs"], "", "INFO")
    ids = torch.randint(0, dims.vocab, (contexts[0],), generator=gen)
    n = min(steps, 32)

    # Teacher-forced on the eager greedy rows: eager decode and the graph step of the same model write the
    # same K/V at each position, so one model serves both.
    logits = first = model.prefill(ids)
    cos, rel, agree, want_rows, capture_ms = [], 0.0, 0, [], None
    for step in range(n):
        row = greedy(logits, step, dims.boc)
        want_rows.append(row)
        want = model.decode(row, len(ids) + step)
        t0 = time.perf_counter()
        got = be.decode(row, len(ids) + step)
        if capture_ms is None:  # the first call captured the step graph of this window
            capture_ms = 1e3 * (time.perf_counter() - t0)
        cos.append(cosine(got, want))
        rel = max(rel, float((got - want).abs().max() / want.abs().max()))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        logits = want
    yield Row("torch-graph", f"graph step vs eager step, teacher-forced, {n} steps",
              f"min cosine {min(cos):.6f}, max rel err {rel:.1e}, greedy {agree}/{n * dims.codebooks}", "> 0.9999",
              "PASS" if min(cos) > 0.9999 else "FAIL")
    yield Row("torch-graph", f"first step-graph capture (window {be.bucket(len(ids))})", f"{capture_ms:.0f} ms", "",
              "INFO")

    # Fused greedy take (device sampling, graph replay) vs the eager greedy rows.
    be.prefill(ids)
    be.begin(first, len(ids), seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=n)
    fused, _ = be.rows(n)
    same = (fused == torch.stack(want_rows).cpu()).all(-1)
    prefix = int(same.long().cumprod(0).sum())
    yield Row("torch-graph", "fused greedy rows vs eager greedy rows",
              f"{prefix}/{n} identical before the first divergence", f">= {min(8, n)} (random weights: near-ties)",
              "PASS" if prefix >= min(8, n) else "FAIL")

    # Device sampling vs engine.sampling.sample on the same logits (the host loop feeds the same graphs).
    seed, settings = 1234, dict(temperature=0.8, top_k=30, top_p=0.8)
    be.prefill(ids)
    be.begin(first, len(ids), seed=seed, max_rows=n, **settings)
    fused, _ = be.rows(n)
    logits, host = be.prefill(ids), []
    for step, u in enumerate(uniforms(seed, 0, dims.codebooks, steps=n)):
        row = sample(logits, u.to(device), *settings.values())
        row[step + 1:] = dims.boc
        host.append(row.cpu())
        logits = be.decode(row, len(ids) + step)
    same = torch.equal(fused, torch.stack(host))
    yield Row("torch-graph", "device sampling (T 0.8, top-k 30, top-p 0.8) vs sampling.sample",
              "identical rows" if same else "DIFFERENT", "identical", "PASS" if same else "FAIL")

    # ms/frame as the context grows: one untimed pass captures the windows, then rows(50) chunks are timed.
    chunk = min(50, steps)
    for ctx in contexts:
        ids_ctx = torch.randint(0, dims.vocab, (ctx,), generator=gen)
        for timed in (False, True):
            first_ctx = be.prefill(ids_ctx)
            be.begin(first_ctx, ctx, seed=0, max_rows=steps, **settings)
            if cuda:
                torch.cuda.synchronize()
            t0, done = time.perf_counter(), 0
            while done + chunk <= steps:
                be.rows(chunk)
                done += chunk
            ms = 1e3 * (time.perf_counter() - t0) / max(done, 1)
        yield Row("torch-graph", f"decode ms/frame at context {ctx} (sync per {chunk} rows)", f"{ms:.2f} ms", "",
                  "INFO")
        if ctx == contexts[0]:
            graph_ms = ms
    eager_ms = device_ms(lambda m=model: m.decode(want_rows[0], len(ids)), device, repeat=9)
    yield Row("torch-graph", f"eager decode ms/step at context {len(ids)} (host sampling excluded)",
              f"{eager_ms:.2f} ms = {eager_ms / graph_ms:.2f}x the graphed step", "", "INFO")
    if cuda:
        yield Row("torch-graph", "peak VRAM (weights, cache, graphs)",
                  f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", "", "INFO")
    if cubin_ms:
        yield Row("bench", "speed-up cubin fp8 / bf16 vs the CUDA-graphed torch path",
                  " / ".join(f"{graph_ms / cubin_ms[p]:.2f}x" for p in ("fp8", "bf16") if p in cubin_ms), "", "INFO")
    del be, model
    if cuda:
        torch.cuda.empty_cache()


# The whole-step A/B: (label, variant, sampler) of every step the cubin backend can run. "v2+grid" is
# v2 with v3's sampler alone, so the sampler's and the split-K GEMVs' shares of v3's gain are told apart.
STEP_CONFIGS = (("v1", "v1", None), ("v2", "v2", None), ("v3", "v3", None), ("v2+grid", "v2", "grid"))


def variant_rows(dims: Dims, steps: int, *, ops, stream) -> Iterator[Row]:
    """The whole-step A/B: every decode step of `STEP_CONFIGS` on the same GPU in one run, graph replay with device
    sampling at T 0.8 / top-k 30 / top-p 0.8 (sync per 50 rows, the first 50 rows are capture and warm-up).
    fp8's rows come out before bf16's steps start."""
    sd = random_backbone(dims, dtype=torch.bfloat16, device="cuda", names="internal")
    ids = torch.randint(0, 150000, (13,), generator=torch.Generator().manual_seed(3))
    for precision in ("fp8", "bf16"):
        ms, rows = {}, {}
        for label, variant, sampler in STEP_CONFIGS:
            be = CubinBackend(dims, sd, ops=ops, device="cuda", precision=precision, max_len=1024,
                              stream=stream, variant=variant, sampler=sampler)
            be.begin(be.prefill(ids, None, 0), 13, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps)
            taken = [be.rows(CHUNK_ROWS)[0]]
            torch.cuda.synchronize()
            t0, done = time.perf_counter(), 0
            while done + 2 * CHUNK_ROWS <= steps:
                taken.append(be.rows(CHUNK_ROWS)[0])
                done += CHUNK_ROWS
            ms[precision, label] = 1e3 * (time.perf_counter() - t0) / max(done, 1)
            rows[label] = torch.cat(taken)
            del be
            torch.cuda.empty_cache()
        yield from step_ab_rows(ms)
        yield grid_sampler_row(precision, rows["v2"], rows["v2+grid"])


def grid_sampler_row(precision: str, cta: torch.Tensor, grid: torch.Tensor) -> Row:
    """v2's sampled take against v2+grid's (the same step kernels, the same seed): the grid sampler on this
    GPU. Their fp32 sums (softmax denominator, running mass) are reduced in different trees, so a row may
    differ only where a draw falls within float rounding of a boundary: rare enough to call a FAIL."""
    same = (cta == grid).all(-1)
    prefix = int(same.long().cumprod(0).sum())
    return Row(f"A/B step {precision}", "v2+grid sampled rows vs v2's (T 0.8, top-k 30, top-p 0.8, seed 0)",
               f"{prefix}/{len(same)} identical before the first difference", "identical",
               "PASS" if prefix == len(same) else "FAIL")


def step_ab_rows(ms: dict[tuple[str, str], float]) -> list[Row]:
    """Whole-step ms/frame for each precision in `ms` and every step of `STEP_CONFIGS`, each with its time over
    v2's (below 1.00x: faster than v2). An improvement counts only as a ratio measured in one run."""
    labels = [label for label, _, _ in STEP_CONFIGS]
    return [Row(f"A/B step {p}", "decode ms/frame " + " | ".join(labels) + " (time / v2's)",
                " | ".join(f"{ms[p, x]:.3f} ({ms[p, x] / ms[p, 'v2']:.2f}x)" for x in labels), "", "INFO")
            for p in ("fp8", "bf16") if (p, "v2") in ms]
