"""CPU benchmarks, side by side in one run: `python -m bench.cpu [--smoke] [--only backbone,codec,e2e]`.

1. Backbone decode: the engine's torch step vs Hugging Face `transformers` Qwen3 (eager attention, its own
   KV cache) on the SAME random weights (the transformers model is built on the engine's tensors, so both
   read identical memory), full size in bf16 for a handful of frames and a quarter-size config in fp32
   for many frames. Logits are checked equal before anything is timed. Reported: ms/frame (median),
   the ratio, achieved weight bandwidth against a large copy measured in the same run (the physical
   floor), and RTF at 25 frames/s.
2. Codec: one-shot decode RTF for 10 s of codes at full codec size (random weights), the streaming
   decoder's overhead over one-shot with the engine's push schedule (engine/streaming.py: the codec's
   right look-ahead + 2 frames first, then 4, 8, 16, 25), and encode RTF for a 10 s clip.
3. End to end on the demo checkpoint: time to first audio and RTF of `Engine.generate_stream`, with the
   prefill / first-frames / first-codec-window breakdown.
4. Batched takes (`--only batch`): c = 1, 2, 4, 8 takes decoded together by the engine's scheduler on
   random weights at quarter size, bf16 and fp32: aggregate frames/s, per-take ms/frame, and the cost
   of the batch-invariance padding (a lone take's step at `min_rows` rows vs at one row).
6. The step (`--only step`, bench/step.py): bf16 against int8 interleaved, the decode step at c = 1 and 8 beside
   its GEMV-only time, prefill of 40 and 300 tokens, first audio zero-shot and for a saved voice cold and
   warm, peak RSS; full size, or `--step-layers 6` for 6 real-width layers built in memory.
5. Precisions (`--only precision`, bench/precision.py): bf16, weight-only int8 and int4 at full size from a
   memory-mapped checkpoint, interleaved: ms/frame and % of the copy floor at c = 1, frames/s at c = 8,
   prefill, fidelity against bf16, and each one's peak RSS at load (needs ~16 GB of memory and ~8 GB of disk).

`--smoke` shrinks every size so the whole script runs in seconds (the test suite runs it that way).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import Table, copy_bandwidth, decode_weight_bytes, machine_line, median_ms
from engine.config import FRAME_RATE, FULL_SIZE, SAMPLE_RATE, Dims
from engine.demo import random_backbone
from engine.model import HiggsModel, rel_error

QUARTER = dataclasses.replace(FULL_SIZE, hidden=640, intermediate=2432, layers=9, heads=8, kv_heads=2, vocab=4096)
# Also the tiny (overhead-bound) config of the full run:
SMOKE = dataclasses.replace(FULL_SIZE, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16,
                            vocab=512)


# ---------------------------------------------------------------------------------------------- backbone
def transformers_twin(model: HiggsModel):
    """A `transformers` Qwen3Model whose parameters ARE the engine model's tensors (no copy), with its
    RoPE tables rounded to bf16 like ours (SPEC D4), so the two differ only in how they compute."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

    d = model.dims
    config = Qwen3Config(vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate,
                         num_hidden_layers=d.layers, num_attention_heads=d.heads, num_key_value_heads=d.kv_heads,
                         head_dim=d.head_dim, rms_norm_eps=d.rms_eps, max_position_embeddings=d.max_positions,
                         rope_parameters={"rope_type": "default", "rope_theta": d.rope_theta},
                         tie_word_embeddings=True)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        twin = Qwen3Model(config)
    state = {"embed_tokens.weight": model.text_embedding.weight, "norm.weight": model.norm.weight}
    for name, tensor in model.layers.state_dict().items():
        state[f"layers.{name}"] = tensor
    twin.load_state_dict(state, assign=True, strict=True)
    rotary = twin.rotary_emb
    rotary.inv_freq = (1.0 / (d.rope_theta ** (torch.arange(0, d.head_dim, 2, dtype=torch.int64).float() / d.head_dim)))
    rotary.original_inv_freq = rotary.inv_freq
    forward = rotary.forward

    def bf16_rope(x, position_ids):
        cos, sin = forward(x.float(), position_ids)
        return cos.to(torch.bfloat16).to(x.dtype), sin.to(torch.bfloat16).to(x.dtype)

    rotary.forward = bf16_rope
    return twin.eval().requires_grad_(False).to(model.dtype)


class TwinRunner:
    """Drives the transformers twin through the same prompt → rows loop as the engine model: inputs are
    the engine's embeddings, the output goes through the same tied audio head."""

    def __init__(self, model: HiggsModel, twin):
        from transformers import DynamicCache

        self.model, self.twin, self.cache_cls = model, twin, DynamicCache
        self.cache = None

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache = self.cache_cls(config=self.twin.config)
        x = self.model.embed_prompt(ids, None)[None]
        out = self.twin(inputs_embeds=x, cache=self.cache, use_cache=True)
        return self.model.head(out.last_hidden_state[0, -1])

    @torch.inference_mode()
    def decode(self, row: torch.Tensor, pos: int) -> torch.Tensor:
        x = self.model.embed_audio(row)[None, None]
        out = self.twin(inputs_embeds=x, cache=self.cache, use_cache=True,
                        position_ids=torch.tensor([[pos]]))
        return self.model.head(out.last_hidden_state[0, -1])


def bench_backbone(dims: Dims, dtype: torch.dtype, frames: int, label: str, floor_bps: float,
                   repeat: int = 3) -> tuple[list, str]:
    state = random_backbone(dims, seed=1, dtype=dtype, names="internal")
    model = HiggsModel.from_state_dict(dims, state, dtype=dtype, max_len=64 + frames + 8)
    del state
    twin = TwinRunner(model, transformers_twin(model))
    prompt = torch.arange(100, 116)
    rows = torch.randint(0, dims.codebook_vocab, (frames + 2, dims.codebooks),
                         generator=torch.Generator().manual_seed(2))

    # Precheck: the same logits for the prompt and two teacher-forced rows.
    errs = [rel_error(model.prefill(prompt, None, 0), twin.prefill(prompt))]
    for i in range(2):
        errs.append(rel_error(model.decode(rows[i], 16 + i), twin.decode(rows[i], 16 + i)))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    check = f"logits max rel err {max(errs):.2e} (tolerance {tol:g})"
    if max(errs) > tol:
        raise SystemExit(f"{label}: engine and transformers disagree before timing: {check}")

    # Per-step timings, the two implementations interleaved (engine, twin, twin, engine, ...) so that
    # load from other processes hits both alike; the prefill before each take is not timed.
    steps = {model: [], twin: []}
    for r in range(repeat):
        for runner in ((model, twin) if r % 2 == 0 else (twin, model)):
            runner.prefill(prompt) if runner is twin else runner.prefill(prompt, None, 0)
            for i in range(frames):
                t0 = time.perf_counter()
                runner.decode(rows[i], 16 + i)
                steps[runner].append((time.perf_counter() - t0) * 1e3)

    def per_frame(runner):
        return statistics.median(steps[runner])

    eng_ms, hf_ms = per_frame(model), per_frame(twin)
    bytes_per = torch.finfo(dtype).bits / 8
    weight_bytes = decode_weight_bytes(dims, bytes_per)
    floor_ms = weight_bytes / floor_bps * 1e3
    rows_out = []
    for name, ms in (("engine (torch)", eng_ms), ("transformers eager", hf_ms)):
        rows_out.append([label, name, f"{str(dtype).split('.')[-1]}", frames, ms, weight_bytes / (ms / 1e3) / 1e9,
                         floor_ms, f"{100 * floor_ms / ms:.0f}%", ms * FRAME_RATE / 1e3])
    rows_out.append([label, "ratio transformers / engine", "", "", hf_ms / eng_ms, "", "", "", ""])
    return rows_out, check


# ---------------------------------------------------------------------------------------------- codec
def bench_codec(size: str, seconds: float, repeat: int) -> Table:
    from engine.codec import Codec
    from engine.codec.random import random_codec_state_dict, tiny_codec_config
    from engine.streaming import decode_streamed, push_sizes

    codec = Codec.from_state_dict(random_codec_state_dict(seed=0, size=size),
                                  tiny_codec_config() if size == "tiny" else None)
    frames = int(seconds * FRAME_RATE)
    codes = torch.randint(0, 1024, (frames, 8), generator=torch.Generator().manual_seed(3))
    one_shot = median_ms(lambda: codec.decode(codes), repeat=repeat)

    sizes = push_sizes(frames, codec.stream().right)
    stream_ms = median_ms(lambda: decode_streamed(codec.stream(), codes), repeat=repeat)
    wav = (0.3 * np.sin(np.linspace(0, 2000, int(seconds * SAMPLE_RATE)))).astype(np.float32)
    encode_ms = median_ms(lambda: codec.encode(wav), repeat=repeat)
    audio_ms = seconds * 1e3
    return Table(f"Codec ({size} size, random weights, {seconds:g} s of audio)",
                 ["operation", "ms (median)", "RTF", "vs one-shot decode"],
                 [["decode, one shot", one_shot, one_shot / audio_ms, "1.00×"],
                  [f"decode, streamed ({len(sizes)} pushes: {', '.join(map(str, sizes[:5]))}…)", stream_ms,
                   stream_ms / audio_ms, f"{stream_ms / one_shot:.2f}× (+{100 * (stream_ms / one_shot - 1):.0f}%)"],
                  ["encode (HuBERT + DAC + RVQ)", encode_ms, encode_ms / audio_ms, ""]])


# ---------------------------------------------------------------------------------------------- end to end
def bench_e2e(runs: int) -> Table:
    from engine import Engine
    from engine.demo import demo_checkpoint

    engine = Engine.load(demo_checkpoint(), device="cpu")
    text = "Hello there. This is a short benchmark sentence for the studio."
    engine.predict(text, temperature=0, max_frames=10)  # warm-up (allocations, prefix cache)
    rows = []
    for i in range(runs):
        t0 = time.perf_counter()
        first = None
        for chunk in engine.generate_stream(text, seed=i, max_frames=100, repeat_guard=None):
            if first is None:
                first = chunk.metrics
            last = chunk.metrics
        wall = (time.perf_counter() - t0) * 1e3
        rows.append((first.ttfa_ms, last.rtf, last.prefill_ms, last.ms_per_frame, last.frames, wall,
                     last.reused_tokens))
    med = [float(np.median([r[k] for r in rows])) for k in range(7)]
    return Table(f"End to end, demo checkpoint (random tiny weights), {runs} takes of ≤ 100 frames",
                 ["TTFA ms", "RTF", "prefill ms", "ms/frame (decode)", "frames", "wall ms", "reused prompt tokens"],
                 [med])


# ---------------------------------------------------------------------------------------------- batch
def bench_batch(dims: Dims, dtype: torch.dtype, frames: int, label: str, concurrency=(1, 2, 4, 8),
                rounds: int = 3) -> Table:
    from engine.generate import Engine
    from engine.prompt import Prompt
    from engine.types import EngineInfo, SamplingParams

    model = HiggsModel.from_state_dict(dims, random_backbone(dims, seed=1, dtype=dtype, names="internal"),
                                       dtype=dtype, max_len=512, max_rows=max(concurrency))
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    engine = Engine(model, None, None, dims, EngineInfo(device="cpu", precision=precision, backend="torch"),
                    max_batch=max(concurrency))
    gen = torch.Generator().manual_seed(0)
    prompt = Prompt(ids=torch.randint(0, dims.vocab, (24,), generator=gen).tolist())
    # Random weights rarely sample <eoc>, but a take that does stops early: rows are counted, not assumed.
    params = [SamplingParams(temperature=0.8, seed=i, max_frames=frames, repeat_guard=None)
              for i in range(max(concurrency))]
    engine.predict(prompt=prompt, params=params[0].with_seed(99))  # warm-up
    # Rounds interleave the concurrencies, so a burst of load from other processes hits all of them.
    runs = {c: [] for c in concurrency}
    for _ in range(rounds):
        for c in concurrency:
            t0 = time.perf_counter()
            takes = engine.generate_batch([prompt] * c, params[:c])
            wall = time.perf_counter() - t0
            runs[c].append((sum(t.metrics.rows for t in takes) / wall,
                            statistics.median(t.metrics.ms_per_frame for t in takes),
                            sum(t.metrics.rows for t in takes), max(t.metrics.batch for t in takes)))
    rows = []
    base_fps, base_ms = (statistics.median(r[k] for r in runs[concurrency[0]]) for k in (0, 1))
    for c in concurrency:
        fps, ms = (statistics.median(r[k] for r in runs[c]) for k in (0, 1))
        rows.append([label, c, runs[c][-1][2], fps, f"{fps / base_fps:.2f}×", ms, f"{ms / base_ms:.2f}×",
                     runs[c][-1][3]])
    # The padding's price: one take's step at min_rows rows (what runs) vs at one row (not invariant).
    low = model.min_rows
    if low > 1:
        row = torch.randint(0, 1024, (1, 8), generator=gen)
        step = lambda: model.decode_rows(row, [0], [30])  # noqa: E731
        padded = median_ms(step, repeat=20, warmup=3)
        model.min_rows = 1
        single = median_ms(step, repeat=20, warmup=3)
        model.min_rows = low
        rows.append([label, f"1, padded to {low} rows", "", "", "", padded, f"{padded / single:.2f}× of 1 row",
                     ""])
    else:
        rows.append([label, "1, no padding (min_rows = 1)", "", "", "", "", "", ""])
    return Table(f"Batched takes, {label}: aggregate frames/s and per-take ms/frame ({frames} frames per take, "
                 f"median of {rounds} rounds)",
                 ["config", "takes (c)", "rows", "frames/s (all takes)", "vs c=1", "ms/frame per take",
                  "vs c=1", "batch seen"], rows)


# ---------------------------------------------------------------------------------------------- step
def step_section(args) -> None:
    """bf16 against int8: the decode step beside its GEMVs, prefill, first audio and RSS (bench/step.py)."""
    from bench import precision, step
    from engine.cpu import cpu_facts
    from engine.demo import cache_dir

    facts = cpu_facts()
    print(f"CPU: {facts['cpu']}, ISA {', '.join(facts['isa'])}, torch kernels {facts['kernels']}, "
          f"native bf16 {facts['native_bf16']}, {facts['threads']} threads")
    floor_bps = copy_bandwidth(1 << 24 if args.smoke else 1 << 30)
    step.clock = step.CLOCK[args.step_clock]
    if args.smoke or args.step_layers:
        # The full vocabulary: the prompts' structural tokens (<|text|> …) sit at its end.
        dims = dataclasses.replace(SMOKE, vocab=FULL_SIZE.vocab) if args.smoke else \
            dataclasses.replace(FULL_SIZE, layers=args.step_layers)
        state = random_backbone(dims, seed=1, dtype=torch.bfloat16, names="internal")
        models = {k: HiggsModel.from_state_dict(dims, state, dtype=torch.bfloat16, max_len=640, max_rows=16,
                                                quant=None if k == "bf16" else k) for k in step.KINDS}
        del state
        label = f" ({dims.layers} L, {dims.hidden}, random weights in memory)"
    else:
        root = Path(args.precision_dir) if args.precision_dir else cache_dir() / "bench-36x2560-bf16"
        root = precision.checkpoint(root, FULL_SIZE)
        models = {k: precision.load(root, k, max_rows=16) for k in ("int8", "bf16")}
        for m in models.values():
            m.setup_cache(640)
        label = " (full size, 36 L, 2560, memory-mapped checkpoint)"
    frames, rounds = (2, 1) if args.smoke else (args.step_frames, 3)
    print(step.bench_step(models, floor_bps, frames=frames, rounds=rounds, label=label,
                          context=16 if args.smoke else args.step_context).markdown())
    print()
    print(step.bench_ttfa(models, rounds=1 if args.smoke else 2, clip_frames=20 if args.smoke else 250).markdown())
    print(f"\npeak RSS of this process (both models): {step.peak_rss_gb():.2f} GB\n")


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); for the test suite")
    ap.add_argument("--only", default="backbone,codec,e2e", help="comma-separated sections (also: batch)")
    ap.add_argument("--full-frames", type=int, default=4, help="decode frames timed at full size")
    ap.add_argument("--quarter-frames", type=int, default=100, help="decode frames timed at quarter size")
    ap.add_argument("--batch-frames", type=int, default=48, help="frames per take in the batch section")
    ap.add_argument("--batch-full-frames", type=int, default=0,
                    help="frames per take at full size bf16 in the batch section (0: skip; needs ~10 GB of memory)")
    ap.add_argument("--precision-dir", default=None,
                    help="where the precision section keeps its full-size random checkpoint (default: the cache dir)")
    ap.add_argument("--precision-frames", type=int, default=8, help="c = 1 steps timed per round, per precision")
    ap.add_argument("--fidelity-steps", type=int, default=100, help="teacher-forced steps compared with bf16")
    ap.add_argument("--step-layers", type=int, default=0,
                    help="the step section at this many real-width layers, built in memory (0: full size, from "
                         "the precision section's checkpoint)")
    ap.add_argument("--step-frames", type=int, default=4, help="c = 1 steps timed per round in the step section")
    ap.add_argument("--step-context", type=int, default=320,
                    help="positions each take holds when its steps are timed (a saved voice's prompt is ~300)")
    ap.add_argument("--step-clock", choices=("wall", "cpu"), default="wall",
                    help="the step section's clock: wall time, or the process's CPU time (a machine loaded by others)")
    args = ap.parse_args(argv)
    sections = set(args.only.split(","))
    torch.manual_seed(0)
    print(f"# CPU benchmark — {time.strftime('%Y-%m-%d %H:%M')} — {machine_line()}\n")

    if "backbone" in sections:
        floor_bps = copy_bandwidth(1 << 24 if args.smoke else 1 << 30)
        print(f"copy bandwidth (read + write) measured now: {floor_bps / 1e9:.1f} GB/s\n")
        configs = [(SMOKE, torch.float32, 8, "smoke")] if args.smoke else [
            (FULL_SIZE, torch.bfloat16, args.full_frames, "full size (36 L, 2560)"),
            (QUARTER, torch.float32, args.quarter_frames, "quarter (9 L, 640)"),
            # the parity checkpoint's size: nothing but framework overhead per step
            (SMOKE, torch.float32, 2 * args.quarter_frames, "tiny (2 L, 64)")]
        rows, checks = [], []
        for dims, dtype, frames, label in configs:
            r, check = bench_backbone(dims, dtype, frames, label, floor_bps, repeat=3)
            rows += r
            checks.append(f"{label}: {check}")
        print(Table("Backbone decode step, engine vs transformers on identical weights",
                    ["config", "implementation", "dtype", "frames", "ms/frame", "weight GB/s", "floor ms",
                     "% of floor", "RTF @25 fps"], rows).markdown())
        print("\nprecheck: " + "; ".join(checks) + "\n")
    if "codec" in sections:
        print(bench_codec("tiny" if args.smoke else "full", 2.0 if args.smoke else 10.0,
                          2 if args.smoke else 1).markdown())
        print()
    if "batch" in sections:
        # Quarter size by default: full size (--batch-full-frames) needs ~8 GB of weights.
        configs = [(SMOKE, torch.float32, 8, "smoke fp32", 1)] if args.smoke else [
            (QUARTER, torch.bfloat16, args.batch_frames, "quarter bf16 (9 L, 640)", 3),
            (QUARTER, torch.float32, args.batch_frames, "quarter fp32 (9 L, 640)", 3)]
        if args.batch_full_frames and not args.smoke:
            configs.insert(0, (FULL_SIZE, torch.bfloat16, args.batch_full_frames, "full size bf16 (36 L, 2560)", 2))
        for dims, dtype, frames, label, rounds in configs:
            print(bench_batch(dims, dtype, frames, label, rounds=rounds).markdown())
            print()
    if "precision" in sections:
        from bench import precision
        from engine.cpu import cpu_facts
        from engine.demo import cache_dir

        facts = cpu_facts()
        print(f"CPU: {facts['cpu']}, ISA {', '.join(facts['isa'])}, torch kernels {facts['kernels']}, "
              f"native bf16 {facts['native_bf16']}, {facts['threads']} threads")
        floor_bps = copy_bandwidth(1 << 24 if args.smoke else 1 << 30)
        dims = SMOKE if args.smoke else FULL_SIZE
        root = (Path(args.precision_dir) if args.precision_dir
                else cache_dir() / f"bench-{dims.layers}x{dims.hidden}-bf16")
        tables = precision.bench_precision(precision.checkpoint(root, dims), floor_bps,
                                           frames=2 if args.smoke else args.precision_frames,
                                           rounds=1 if args.smoke else 3,
                                           fidelity_steps=4 if args.smoke else args.fidelity_steps,
                                           probe=("int8",) if args.smoke else precision.KINDS)
        for table in tables:
            print(table.markdown())
            print()
    if "step" in sections:
        step_section(args)
    if "e2e" in sections:
        print(bench_e2e(2 if args.smoke else 5).markdown())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
