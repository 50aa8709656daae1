"""The device check's model sections: a FULL-SIZE random-weight model through the cubin backend against eager
torch (teacher-forced logits, graph replay, streamed rows) with its benchmark (ms/frame, prefill, TTFA,
RTF, bandwidth against the copy floor), the CUDA-graphed torch path, and the whole-step A/B of every
cubin variant.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from bench.common import decode_weight_bytes
from engine.backends.cubin import CubinBackend
from engine.config import FRAME_RATE, Dims
from engine.demo import random_backbone
from engine.model import HiggsModel
from engine.streaming import FIRST_PUSH_FRAMES
from kernels.check import Row
from kernels.timing import seconds_per_call


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


def model_rows(dims: Dims, steps: int, floor: float, results: dict | None = None, *, ops, stream) -> list[Row]:
    """`results` (when given) receives the cubin ms/frame per precision, for the torch-graph section's
    speed-up row."""
    rows = []
    gen = torch.Generator().manual_seed(1)
    ids13 = torch.randint(0, 150000, (13,), generator=gen)
    ids300 = torch.randint(0, 150000, (300,), generator=gen)
    sd = random_backbone(dims, dtype=torch.bfloat16, device="cuda", names="internal")
    ref = HiggsModel.from_state_dict(dims, sd, dtype=torch.bfloat16, device="cuda", max_len=1024)

    # Eager torch greedy trajectory: the reference rows and logits for teacher forcing.
    logits = ref.prefill(ids13, None, 0)
    want_logits, want_rows = [logits], []
    for step in range(steps):
        row = greedy(logits, step, dims.boc)
        want_rows.append(row)
        logits = ref.decode(row, 13 + step)
        want_logits.append(logits)
    torch.cuda.synchronize()
    torch_ms = cuda_ms(lambda: ref.decode(want_rows[0], 13), repeat=9)
    torch_prefill = {n: cuda_ms(lambda ids=ids: ref.prefill(ids, None, 0), repeat=3) / len(ids)
                     for n, ids in ((13, ids13), (300, ids300))}

    results = {} if results is None else results
    for precision in ("bf16", "fp8"):
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        be = CubinBackend(dims, sd, ops=ops, device="cuda", precision=precision, max_len=1024, stream=stream)
        load_s = time.perf_counter() - t0
        # Teacher-forced: the same rows as torch, compare logits step by step.
        got = be.prefill(ids13, None, 0)
        cos = [cosine(got, want_logits[0])]
        agree = [float((got.argmax(-1) == want_logits[0].argmax(-1)).float().mean())]
        for step, row in enumerate(want_rows):
            got = be.decode(row, 13 + step)
            cos.append(cosine(got, want_logits[step + 1]))
            agree.append(float((got.argmax(-1) == want_logits[step + 1].argmax(-1)).float().mean()))
        floor_cos = 0.999 if precision == "bf16" else 0.98
        rows.append(Row(f"model {precision}", f"teacher-forced logits vs torch, {steps + 1} steps",
                        f"min cosine {min(cos):.5f}, greedy agree {sum(agree) / len(agree):.1%}", f"> {floor_cos}",
                        "PASS" if min(cos) > floor_cos else "FAIL"))
        # Fused graph replay (device sampling, greedy) vs eager torch greedy rows.
        first = be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        one_shot, _ = be.rows(steps)
        ref_rows = torch.stack(want_rows).cpu()
        same = (one_shot == ref_rows).all(-1)
        prefix = int(same.long().cumprod(0).sum())
        rows.append(Row(f"model {precision}", "graph replay greedy rows vs eager torch",
                        f"{prefix}/{steps} rows identical before first divergence, {same.float().mean():.1%} overall",
                        "info (random weights: near-ties)", "INFO" if precision == "fp8" else
                        ("PASS" if prefix >= min(8, steps) else "FAIL")))
        # Streamed (chunks of 2, 4, 8, ...) vs one-shot: the same graph, so bit-identical rows.
        be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        parts, n = [], 2
        while sum(len(p) for p in parts) < steps:
            part, _ = be.rows(n)
            parts.append(part)
            n *= 2
        streamed = torch.cat(parts)[:steps]
        rows.append(Row(f"model {precision}", "streamed rows(2,4,8..) vs one-shot rows(n)",
                        "identical" if torch.equal(streamed, one_shot) else "DIFFERENT", "identical",
                        "PASS" if torch.equal(streamed, one_shot) else "FAIL"))
        # Benchmark: graph replay per step (one sync per 50 rows, as per streamed chunk), prefill per token.
        be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = 0
        while done + 50 <= steps:
            be.rows(50)
            done += 50
        ms_frame = 1e3 * (time.perf_counter() - t0) / max(done, 1)
        prefill = {n: cuda_ms(lambda ids=ids, be=be: be.prefill(ids, None, 0), repeat=3) / len(ids)
                   for n, ids in ((13, ids13), (300, ids300))}
        ttfa = prefill[13] * 13 + ms_frame * (FIRST_PUSH_FRAMES + dims.delay)
        bw = decode_weight_bytes(dims, 1 if precision == "fp8" else 2, head_bytes_per_weight=2) / (ms_frame / 1e3)
        results[precision] = ms_frame
        rows += [
            Row(f"bench {precision}", "decode ms/frame (graph replay, sync per 50)", f"{ms_frame:.2f} ms",
                "", "INFO"),
            Row(f"bench {precision}", "weight bandwidth / D2D copy floor",
                f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%} of {floor / 1e9:.0f} GB/s", "", "INFO"),
            Row(f"bench {precision}", "prefill ms/token at 13 / 300 tokens",
                f"{prefill[13]:.3f} / {prefill[300]:.3f} ms", "", "INFO"),
            Row(f"bench {precision}", "TTFA backbone (prefill 13 + first 9 rows)", f"{ttfa:.1f} ms",
                "codec not included", "INFO"),
            Row(f"bench {precision}", "RTF backbone (ms/frame / 40 ms)", f"{ms_frame / (1e3 / FRAME_RATE):.3f}", "",
                "INFO"),
            Row(f"bench {precision}", "peak VRAM (load + take)", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB "
                f"(load {load_s:.1f} s)", "", "INFO"),
        ]
        del be
        torch.cuda.empty_cache()
    bw = decode_weight_bytes(dims, 2) / (torch_ms / 1e3)
    rows += [Row("bench torch", "eager decode ms/frame (HiggsModel bf16)", f"{torch_ms:.2f} ms", "", "INFO"),
             Row("bench torch", "weight bandwidth / D2D copy floor", f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%}", "",
                 "INFO"),
             Row("bench torch", "prefill ms/token at 13 / 300 tokens",
                 f"{torch_prefill[13]:.3f} / {torch_prefill[300]:.3f} ms", "", "INFO"),
             Row("bench", "speed-up fp8 / bf16 cubin vs torch eager",
                 f"{torch_ms / results['fp8']:.2f}x / {torch_ms / results['bf16']:.2f}x", "", "INFO")]
    return rows


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


def variant_rows(dims: Dims, steps: int, *, ops, stream) -> list[Row]:
    """The whole-step A/B: every decode step of `STEP_CONFIGS` on the same GPU in one run, graph replay with device
    sampling at T 0.8 / top-k 30 / top-p 0.8 (sync per 50 rows, the first 50 rows are capture and warm-up)."""
    sd = random_backbone(dims, dtype=torch.bfloat16, device="cuda", names="internal")
    ids = torch.randint(0, 150000, (13,), generator=torch.Generator().manual_seed(3))
    ms, rows = {}, {}
    for precision in ("fp8", "bf16"):
        for label, variant, sampler in STEP_CONFIGS:
            be = CubinBackend(dims, sd, ops=ops, device="cuda", precision=precision, max_len=1024,
                              stream=stream, variant=variant, sampler=sampler)
            be.begin(be.prefill(ids, None, 0), 13, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps)
            taken = [be.rows(50)[0]]
            torch.cuda.synchronize()
            t0, done = time.perf_counter(), 0
            while done + 100 <= steps:
                taken.append(be.rows(50)[0])
                done += 50
            ms[precision, label] = 1e3 * (time.perf_counter() - t0) / max(done, 1)
            rows[precision, label] = torch.cat(taken)
            del be
            torch.cuda.empty_cache()
    return step_ab_rows(ms) + [grid_sampler_row(p, rows[p, "v2"], rows[p, "v2+grid"]) for p in ("fp8", "bf16")]


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
    """Whole-step ms/frame per precision for every step of `STEP_CONFIGS`, each with its time over v2's
    (below 1.00x: faster than v2). An improvement counts only as a ratio measured in one run."""
    labels = [label for label, _, _ in STEP_CONFIGS]
    return [Row(f"A/B step {p}", "decode ms/frame " + " | ".join(labels) + " (time / v2's)",
                " | ".join(f"{ms[p, x]:.3f} ({ms[p, x] / ms[p, 'v2']:.2f}x)" for x in labels), "", "INFO")
            for p in ("fp8", "bf16")]
