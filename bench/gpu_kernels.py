"""The device check's per-kernel sections at the real decode shapes: correctness of every layer GEMV and
the prefill GEMM against float64, microbenchmarks (µs, GB/s, % of the copy floor) of the single-take and
the batched kernels, the whole batched step, and a launch from a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

from engine.backends.cubin import CubinBackend
from engine.config import Dims
from engine.demo import random_backbone
from kernels.check import Row
from kernels.timing import seconds_per_call

HIDDEN_CHECK = 2560


def layer_gemvs(dims: Dims) -> tuple[tuple[str, int, int], ...]:
    """The four layer GEMVs of one decode step as (name, N, K): on FULL_SIZE qkv 6144×2560, o 2560×4096,
    gate_up 19456×2560, down 2560×9728."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    return (("qkv", q + 2 * kv, dims.hidden), ("o", dims.hidden, q), ("gate_up", 2 * dims.intermediate, dims.hidden),
            ("down", dims.hidden, dims.intermediate))


def replay_us(fn, device: torch.device, stream, replays: int) -> float:
    """Microseconds per call of fn: on a GPU one call captured in a CUDA graph (on the kernels' stream) and
    replayed `replays` times between two events, so host launch cost is out; on the CPU (the self-test:
    the interpreter, seconds per launch) the wall clock of one call."""
    if device.type != "cuda":
        return 1e6 * seconds_per_call(fn, warmup=0, cuda=False)
    from kernels.runtime import capture_graph

    graph = capture_graph(fn, stream or torch.cuda.current_stream())
    return 1e6 * seconds_per_call(graph.replay, calls=replays)


def _gemv_inputs(ops, n: int, k: int, precision: str, name: str, device, gen):
    """x, w and the op's keyword arguments as the cubin backend launches that layer's GEMV: W8A8 for qkv /
    gate_up / down in fp8, W8A16 (bf16 activations) for o; bf16 everywhere in bf16."""
    x = torch.randn(k, generator=gen).to(device, torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16)
    if precision == "bf16":
        return x, w, {}
    w8, ws = ops.quantize_weight_fp8(w)
    if name == "o":
        return x, w8, dict(w_scale=ws)
    xs = (x.float().abs().amax() / 448.0).reshape(1)
    return ops.quantize_fp8(x, xs), w8, dict(w_scale=ws, x_scale=xs)


def microbench_rows(ops, dims: Dims, device: torch.device, stream=None, floor: float | None = None,
                    contexts=(256, 1024, 4096), replays: int = 100, step_ms: dict | None = None) -> Iterable[Row]:
    """µs, GB/s and % of the copy floor of each decode kernel at `dims`' shapes: the four layer GEMVs in fp8
    and bf16, the audio head, decode attention at each context, the sampler greedy and top-k/top-p; then
    the sum of one fp8 step's benchmarked kernels against the graph step time of the model section
    (`step_ms`), the difference being launch / serialisation overhead and the kernels not listed
    (norms, RoPE + KV write, silu·mul)."""
    gen = torch.Generator().manual_seed(5)
    dev = device
    per_step = {}

    def row(label: str, us: float, nbytes: float) -> Row:
        bw = nbytes / (us * 1e-6)
        share = f" = {bw / floor:.0%} of copy" if floor else ""
        return Row("microbench", label, f"{us:.1f} µs, {bw / 1e9:.0f} GB/s{share}", "", "INFO")

    for name, n, k in layer_gemvs(dims):
        for precision in ("fp8", "bf16"):
            x, w, kw = _gemv_inputs(ops, n, k, precision, name, dev, gen)
            out = torch.empty(n, dtype=torch.bfloat16, device=dev)
            us = replay_us(lambda: ops.gemv(x, w, out=out, **kw), dev, stream, replays)
            per_step[f"{name} {precision}"] = us
            mode = "bf16" if precision == "bf16" else ("w8a16" if name == "o" else "w8a8")
            yield row(f"gemv {name} {n}x{k} {mode}", us, w.numel() * w.element_size() + x.numel() * x.element_size()
                      + 2 * n + (4 * n if precision == "fp8" else 0))
    h = torch.randn(dims.hidden, generator=gen).to(dev, torch.bfloat16)
    audio = (torch.randn(dims.audio_rows, dims.hidden, generator=gen) * dims.hidden ** -0.5).to(dev, torch.bfloat16)
    norm = torch.ones(dims.hidden, dtype=torch.bfloat16, device=dev)
    logits = torch.empty(dims.audio_rows, dtype=torch.float32, device=dev)
    us = per_step["head"] = replay_us(lambda: ops.audio_head(h, audio, norm, dims.rms_eps, out=logits), dev, stream,
                                      replays)
    yield row(f"audio head {dims.audio_rows}x{dims.hidden} bf16 -> fp32", us, audio.numel() * 2 + logits.numel() * 4)
    scratch = ops.attention_scratch(dims.heads, dims.head_dim, dev)
    q = torch.randn(dims.heads, dims.head_dim, generator=gen).to(dev, torch.bfloat16)
    attn_out = torch.empty_like(q)
    for ctx in contexts:
        kc = torch.randn(dims.kv_heads, ctx, dims.head_dim, generator=gen).to(dev, torch.bfloat16)
        vc = torch.randn(dims.kv_heads, ctx, dims.head_dim, generator=gen).to(dev, torch.bfloat16)
        pos = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
        us = per_step[f"attention {ctx}"] = replay_us(
            lambda kc=kc, vc=vc, pos=pos: ops.decode_attention(q, kc, vc, pos, out=attn_out, scratch=scratch), dev, stream, replays)
        yield row(f"decode attention at context {ctx} ({dims.heads}/{dims.kv_heads} heads x {dims.head_dim})", us,
                  2 * kc.numel() * 2)
        del kc, vc
    logits8 = (torch.randn(dims.audio_rows, generator=gen) * 3).to(dev)
    x_row = torch.empty(dims.hidden, dtype=torch.bfloat16, device=dev)
    for label, settings in (("greedy", (0.0, 0, 1.0)), ("T 0.8, top-k 30, top-p 0.8", (0.8, 30, 0.8))):
        temperature, top_k, top_p = settings
        state, params = ops.sampler_state(7, top_k, temperature, top_p, dev)
        hist = torch.full((8, dims.codebooks), -1, dtype=torch.int32, device=dev)  # later steps store nothing
        us = per_step[f"sampler {label}"] = replay_us(lambda: ops.sample(logits8, audio, state, params, hist, x_row),
                                                      dev, stream, replays)
        yield row(f"sampler + embedding, {label}", us, logits8.numel() * 4 + dims.codebooks * dims.hidden * 2)
        # A/B: the same step on the grid sampler (v3), one program per codebook, radix thresholds.
        scratch = ops.sampler_scratch(dev)
        grid_us = replay_us(lambda: ops.sample_grid(logits8, audio, state, params, hist, x_row, scratch), dev, stream,
                            replays)
        yield Row("microbench", f"A/B sampler + embedding, {label}: one program (v1, v2) | grid of 8 (v3)",
                  f"{us:.1f} µs | {grid_us:.1f} µs | one / grid {us / grid_us:.2f}x", "", "INFO")
    ctx = contexts[0]
    layer = sum(per_step[f"{name} fp8"] for name, _, _ in layer_gemvs(dims)) + per_step[f"attention {ctx}"]
    total_ms = (dims.layers * layer + per_step["head"] + per_step["sampler T 0.8, top-k 30, top-p 0.8"]) / 1e3
    graph = (step_ms or {}).get("fp8")
    yield Row("microbench", f"sum of one fp8 step's kernels above at context {ctx} ({dims.layers} layers)",
              f"{total_ms:.3f} ms" + (f" vs graph step {graph:.3f} ms: {graph - total_ms:+.3f} ms overhead and "
                                      "unlisted kernels" if graph else " (no graph step time: model section absent)"),
              "", "INFO")


def batch_rows(ops, dims: Dims, device: torch.device, stream=None, buckets=(1, 4, 8, 16), context: int = 1024,
               replays: int = 100) -> Iterable[Row]:
    """The batched decode kernels per row bucket M, each launch captured in a CUDA graph and
    replayed: the M ≤ 16 tensor-core GEMM at the four layer shapes in fp8 (W8A8, per-row activation
    scales) and bf16 — µs, weight GB/s and M rows' cost against the one-row GEMV of the same shape (the
    price of a batch: ≈ 1x means M takes for the price of one); attention for M takes at `context`
    positions each; the sampler + embedding for M takes at T 0.8 / top-k 30 / top-p 0.8."""
    gen = torch.Generator().manual_seed(7)
    dev = device

    def row(label: str, us: float, nbytes: float, note: str = "") -> Row:
        return Row("batch", label, f"{us:.1f} µs, {nbytes / (us * 1e-6) / 1e9:.0f} GB/s{note}", "", "INFO")

    for name, n, k in layer_gemvs(dims):
        w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dev, torch.bfloat16)
        x = torch.randn(max(buckets), k, generator=gen).to(dev, torch.bfloat16)
        for precision in ("fp8", "bf16"):
            if precision == "fp8":
                wt, ws = ops.quantize_weight_fp8(w)
                xs = (x.float().abs().amax(dim=1) / 448.0).clamp(min=1e-12)
                xt = (x.float() / xs[:, None]).to(ops.FP8)
                one_x, one_kw = ops.quantize_fp8(x[0], xs[:1]), dict(w_scale=ws, x_scale=xs[:1])
            else:
                wt, ws, xs, xt, one_x, one_kw = w, None, None, x, x[0], {}
            one = torch.empty(n, dtype=torch.bfloat16, device=dev)
            gemv_us = replay_us(lambda: ops.gemv(one_x, wt, out=one, **one_kw), dev, stream, replays)
            nbytes = wt.numel() * wt.element_size()
            yield row(f"gemv {name} {n}x{k} {precision} M 1 (the one-take GEMV)", gemv_us, nbytes)
            # o_proj and down (N = hidden) run as the step would: split-K, with the residual added
            split = dict(residual=torch.zeros(max(buckets), n, dtype=torch.bfloat16, device=dev),
                         scratch=ops.skinny_gemm_scratch(n, dev)) if n == dims.hidden else {}
            for m in buckets:
                y = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
                kw = dict(w_scale=ws, x_scale=xs[:m]) if precision == "fp8" else {}
                if split:
                    kw.update(residual=split["residual"][:m], scratch=split["scratch"])
                us = replay_us(lambda: ops.skinny_gemm(xt[:m], wt, out=y, **kw), dev, stream, replays)
                yield row(f"skinny gemm {name} {n}x{k} {precision} M {m}{' split-K +res' if split else ''}", us,
                          nbytes, f", {us / m:.1f} µs/row, {us / gemv_us:.2f}x one-take GEMV for {m} rows")
        del w, x
    kv_shape = (max(buckets), dims.kv_heads, context, dims.head_dim)
    kc = torch.randn(*kv_shape, generator=gen).to(dev, torch.bfloat16)
    vc = torch.randn(*kv_shape, generator=gen).to(dev, torch.bfloat16)
    q = torch.randn(max(buckets), dims.heads, dims.head_dim, generator=gen).to(dev, torch.bfloat16)
    slots = torch.arange(max(buckets), dtype=torch.int32, device=dev)
    lens = torch.full((max(buckets),), context, dtype=torch.int32, device=dev)
    audio = (torch.randn(dims.audio_rows, dims.hidden, generator=gen) * dims.hidden ** -0.5).to(dev, torch.bfloat16)
    logits = (torch.randn(max(buckets), dims.codebooks, dims.audio_rows // dims.codebooks, generator=gen) * 3).to(dev)
    for m in buckets:
        out = torch.empty(m, dims.heads, dims.head_dim, dtype=torch.bfloat16, device=dev)
        scratch = ops.attention_scratch(m * dims.heads, dims.head_dim, dev)
        us = replay_us(lambda: ops.decode_attention_batch(q[:m], kc, vc, slots[:m], lens[:m], out=out,
                                                          scratch=scratch), dev, stream, replays)
        yield row(f"decode attention, {m} takes at context {context} each", us, 2 * m * kc[0].numel() * 2,
                  f", {us / m:.1f} µs/take")
        state, params = ops.sampler_states(range(m), [30] * m, [0.8] * m, [0.8] * m, dev)
        hist = torch.full((m, 8, dims.codebooks), -1, dtype=torch.int32, device=dev)   # later steps store nothing
        x_rows = torch.empty(m, dims.hidden, dtype=torch.bfloat16, device=dev)
        us = replay_us(lambda: ops.sample_batch(logits[:m], audio, state, params, hist, x_rows), dev, stream,
                       replays)
        yield row(f"sampler + embedding, {m} takes, T 0.8, top-k 30, top-p 0.8", us,
                  m * (logits[0].numel() * 4 + dims.codebooks * dims.hidden * 2), f", {us / m:.1f} µs/take")
        grid_scratch = ops.sampler_scratch(dev, m)
        grid_us = replay_us(lambda: ops.sample_grid(logits[:m], audio, state, params, hist, x_rows, grid_scratch),
                            dev, stream, replays)
        yield Row("batch", f"A/B sampler + embedding, {m} takes: one program per take | grid (8, {m})",
                  f"{us:.1f} µs | {grid_us:.1f} µs | one / grid {us / grid_us:.2f}x", "", "INFO")


def batch_step_rows(ops, dims: Dims, device: torch.device, stream=None, takes=(1, 4, 8, 16),
                    precisions=("fp8", "bf16"), context: int = 512, steps: int = 20) -> Iterable[Row]:
    """The whole batched step (`CubinBackend.decode_rows`) for M takes, each in its own KV slot at
    `context` positions: ms/step with the bucket's CUDA graph replayed (host inputs copied in, logits copied
    out, no sampling), frames/s for the M takes together and against M = 1; then the single-stream v2 step
    (`begin` / `rows`, device sampling, what an engine with max_batch 1 runs) at the same context."""
    gen = torch.Generator().manual_seed(11)
    sd = random_backbone(dims, dtype=torch.bfloat16, device=device, names="internal")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for precision in precisions:
        be = CubinBackend(dims, sd, ops=ops, device=device, precision=precision, max_len=context + steps + 16,
                          stream=stream)
        be.setup_slots(max(takes))   # no prefill: the caches' zeros cost what a prompt's keys cost to read
        one = None
        for m in takes:
            rows = torch.randint(0, 1024, (m, dims.codebooks), generator=gen)
            be.decode_rows(rows, list(range(m)), [context] * m)     # captures the bucket's graph
            sync()
            t0 = time.perf_counter()
            for step in range(steps):
                be.decode_rows(rows, list(range(m)), [context + step] * m)
            sync()
            ms = 1e3 * (time.perf_counter() - t0) / steps
            one = one or ms
            yield Row(f"batch step {precision}", f"decode_rows M {m} (bucket {be.bucket(m)}) at context {context}",
                      f"{ms:.2f} ms/step, {1e3 * m / ms:.0f} frames/s, {ms / one:.2f}x the M 1 step for {m} takes",
                      "", "INFO")
        logits = torch.zeros(dims.audio_rows, device=device)      # the first row's values do not matter here
        be.begin(logits, context, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps + 1)
        be.rows(1)                                                 # captures the single-stream graph
        sync()
        t0 = time.perf_counter()
        got, _ = be.rows(steps)
        ms = 1e3 * (time.perf_counter() - t0) / max(len(got), 1)
        yield Row(f"batch step {precision}", f"single-stream {be.variant} step (max_batch 1) at context {context}",
                  f"{ms:.2f} ms/frame, {1e3 / ms:.0f} frames/s; decode_rows M 1 is {one / ms:.2f}x it", "", "INFO")
        del be
        if device.type == "cuda":
            torch.cuda.empty_cache()


def real_shape_rows(ops, dims: Dims, device: torch.device, gemm_rows: int = 300) -> Iterable[Row]:
    """Correctness at the real K and N (kernels.check runs 3072×2560): every layer GEMV in fp8 and bf16,
    and the prefill GEMM at K 2560 / 4096 / 9728 and N up to 19456, against float64 references.
    gemm_rows=0 leaves the GEMMs out (the self-test: the CPU interpreter's bf16 `tl.dot` is defective,
    tests/interp_rounding.py)."""
    from kernels.check_rows import TOL_BF16
    from kernels.reference import linear_ref

    gen = torch.Generator().manual_seed(6)
    for name, n, k in layer_gemvs(dims):
        for precision in ("fp8", "bf16"):
            x, w, kw = _gemv_inputs(ops, n, k, precision, name, device, gen)
            y = ops.gemv(x, w, **kw)
            want = linear_ref(x.view(1, -1), w, **kw).view(-1)
            err = float((y.double() - want).abs().max() / want.abs().max())
            yield Row("real shapes", f"gemv {name} N {n} K {k} {precision}", f"rel err {err:.2e}", f"< {TOL_BF16:.0e}",
                      "PASS" if err < TOL_BF16 else "FAIL")
        if not gemm_rows:
            continue
        a = (torch.randn(gemm_rows, k, generator=gen)).to(device, torch.bfloat16)
        wb = (torch.randn(n, k, generator=gen) * k ** -0.5).to(device, torch.bfloat16)
        y = ops.gemm(a, wb)
        want = linear_ref(a, wb)
        err = float((y.double() - want).abs().max() / want.abs().max())
        yield Row("real shapes", f"gemm {name} M {gemm_rows} N {n} K {k} bf16", f"rel err {err:.2e}",
                  f"< {TOL_BF16:.0e}", "PASS" if err < TOL_BF16 else "FAIL")


def thread_row(ops, stream) -> Row:
    """The studio launches from a worker thread: PyCUDA's context was pushed on the main thread only,
    so check that a launch from another thread runs on torch's primary context and gives the same result."""
    import threading

    x = torch.randn(HIDDEN_CHECK, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, HIDDEN_CHECK, dtype=torch.bfloat16, device="cuda")
    with torch.cuda.stream(stream):
        main = ops.gemv(x, w)
    out, err = {}, []

    def work():
        try:
            with torch.cuda.stream(stream):
                out["y"] = ops.gemv(x, w)
            stream.synchronize()
        except Exception as exc:
            err.append(f"{type(exc).__name__}: {exc}")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    same = not err and torch.equal(out["y"], main)
    value = err[0][:100] if err else ("same result" if same else "DIFFERENT")
    return Row("setup", "launch from a worker thread", value, "same result", "PASS" if same else "FAIL")
