"""The CPU decode step, prefill and first audio of bf16 against weight-only int8, in one interleaved run:
`python -m bench.cpu --only step` (full size from the precision section's checkpoint) or `--step-layers 6`
(6 real-width layers, random weights built in memory: the shape of the suite's tests).

Reported, each a median over rounds that rotate the two precisions (so load from other processes hits both):
- decode ms per step at c = 1 and c = 8 (`decode_rows`, what every CPU take runs), beside the same step's
  projections alone (every layer's q/k/v, o, gate/up and down and the audio head, on inputs of the step's
  shapes: the GEMV-only time) and the rest as a share of the step (the overhead);
- the step's weight bytes over the copy floor measured in this run (% of floor);
- prefill of 40 and 300 tokens (chunked as the scheduler runs it);
- time to the first audio of a zero-shot take and of a saved voice's take (a 10 s clip), cold (its prefix
  computed) and warm (its prefix kept, engine/prefix.py), with a tiny random codec (the codec's first push
  costs the same in all three), and the kept prefix's size and its time to read back from disk;
- the process's peak RSS (both models loaded).
"""

from __future__ import annotations

import resource
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from bench.common import Table
from bench.precision import step_bytes
from engine.quant import linear

KINDS = ("bf16", "int8")
# What `timed` reads: wall time, or with `--step-clock cpu` the process's CPU time (on a machine loaded by
# others, one torch thread's CPU time is the step's own work, which wall time is not).
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]


def gemv_only(model, b: int):
    """A callable running the step's projections alone at the step's row count, on fixed random inputs."""
    d, p = model.dims, max(b, model.min_rows)
    gen = torch.Generator().manual_seed(0)
    x = {n: torch.randn(p, n, generator=gen).to(model.dtype) for n in (d.hidden, d.heads * d.head_dim, d.intermediate)}

    def run():
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            linear(x[d.hidden], a.wqkv), linear(x[d.heads * d.head_dim], a.wo)
            linear(x[d.hidden], m.w_gate_up), linear(x[d.intermediate], m.w_down)
        F.linear(x[d.hidden], model.audio_embedding.weight)
    return run


def timed(fn) -> float:
    t0 = clock()
    fn()
    return (clock() - t0) * 1e3


def prefill_ms(model, ids) -> float:
    """The prompt prefilled in the scheduler's chunks (slot 7, which no decode here uses)."""
    def run():
        for start in range(0, len(ids), model.prefill_chunk):
            model.prefill(ids[start:start + model.prefill_chunk], None, start, slot=7)
    return timed(run)


def bench_step(models: dict, floor_bps: float, *, frames: int = 4, rounds: int = 3, batch: int = 8,
               label: str = "", prompts: tuple[int, ...] = (40, 300), context: int = 48) -> Table:
    """`context`: the positions every decoding take already holds (a saved voice's prompt is ~300)."""
    dims = next(iter(models.values())).dims
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, dims.codebook_size, (batch, dims.codebooks), generator=gen)
    long = {n: torch.randint(10, dims.vocab, (n,), generator=gen) for n in prompts}
    # The takes' first `context` positions hold random keys and values (prefilling 8 contexts in bf16 would
    # take longer than the rest; zeros would let a scalar GEMM skip work).
    with torch.inference_mode():  # a slot a prefill allocated is an inference tensor
        for m in models.values():
            for layer in m.layers:
                cache = layer.self_attn.cache
                for slot in range(batch):
                    cache._slot(slot)
                    cache.keys[slot].normal_(generator=gen)
                    cache.values[slot].normal_(generator=gen)
    times = {k: {"c1": [], "g1": [], "c8": [], "g8": [], 40: [0.0], 300: [0.0]} for k in models}
    for r in range(rounds):
        for kind in KINDS[r % 2:] + KINDS[:r % 2]:
            m, t = models[kind], times[kind]
            g1, g8 = gemv_only(m, 1), gemv_only(m, batch)
            for i in range(frames):
                t["c1"].append(timed(lambda m=m, i=i: m.decode_rows(rows[:1], [0], [context + i])))
                t["g1"].append(timed(g1))
            for i in range(max(2, frames // 2)):
                t["c8"].append(timed(lambda m=m, i=i: m.decode_rows(rows, list(range(batch)), [context + i] * batch)))
                t["g8"].append(timed(g8))
            for n, ids in long.items():
                t[n].append(prefill_ms(m, ids))
    out = []
    for kind in KINDS:
        med = {k: statistics.median(v) for k, v in times[kind].items()}
        floor_ms = step_bytes(models[kind]) / floor_bps * 1e3
        out.append([kind, med["c1"], med["g1"], f"{100 * (1 - med['g1'] / med['c1']):.0f}%",
                    f"{100 * floor_ms / med['c1']:.0f}%", med["c8"], med["g8"],
                    f"{100 * (1 - med['g8'] / med['c8']):.0f}%", med[40], med[300]])
    b, i = ({row[0]: row for row in out}[k] for k in KINDS)
    out.append(["int8 speed-up", f"{b[1] / i[1]:.2f}×", f"{b[2] / i[2]:.2f}×", "", "", f"{b[5] / i[5]:.2f}×",
                f"{b[6] / i[6]:.2f}×", "", *(f"{b[k] / i[k]:.2f}×" if i[k] else "" for k in (8, 9))])
    what = "CPU time of the process" if clock is CLOCK["cpu"] else "wall time"
    return Table(f"Decode step and prefill{label}, {what}, context {context}: medians of {rounds} rounds rotating "
                 "bf16 and int8 "
                 f"({frames} steps at c = 1, {max(2, frames // 2)} at c = {batch}); copy floor "
                 f"{floor_bps / 1e9:.1f} GB/s measured in this run",
                 ["precision", "step ms c=1", "GEMV-only ms c=1", "overhead c=1", "% of floor c=1",
                  f"step ms c={batch}", f"GEMV-only ms c={batch}", f"overhead c={batch}", "prefill 40 tok ms",
                  "prefill 300 tok ms"], out)


def engine_for(model, kind: str):
    from engine.codec import Codec
    from engine.codec.random import random_codec_state_dict, tiny_codec_config
    from engine.generate import Engine
    from engine.types import EngineInfo

    codec = Codec.from_state_dict(random_codec_state_dict(seed=0, size="tiny"), tiny_codec_config())
    return Engine(model, codec, None, model.dims, EngineInfo(device="cpu", precision=kind, backend="torch"),
                  max_batch=8)


def first_audio_ms(engine, prompt, seed: int) -> float:
    from engine.types import SamplingParams

    params = SamplingParams(temperature=0.8, seed=seed, max_frames=4, repeat_guard=None)
    t0 = time.perf_counter()
    for chunk in engine.generate_stream(prompt=prompt, params=params):
        if len(chunk.audio):
            return (time.perf_counter() - t0) * 1e3
    return (time.perf_counter() - t0) * 1e3


def bench_ttfa(models: dict, *, rounds: int = 2, clip_frames: int = 250) -> Table:
    from engine.delay import apply_delay
    from engine.prefix import PrefixStore, kv_bytes
    from engine.prompt import Prompt, clone_ids, zero_shot_ids
    from engine.runner import prefix_key

    dims = next(iter(models.values())).dims
    gen = torch.Generator().manual_seed(1)
    text = torch.randint(10, min(dims.vocab, 100_000), (24,), generator=gen).tolist()
    ref_text = torch.randint(10, min(dims.vocab, 100_000), (30,), generator=gen).tolist()
    codes = torch.randint(0, dims.codebook_size, (clip_frames, dims.codebooks), generator=gen)
    rows = apply_delay(codes, dims.boc, dims.eoc)
    zero = Prompt(zero_shot_ids(text))
    voice = Prompt(clone_ids(text, rows.shape[0], ref_text), rows)
    engines = {k: engine_for(m, k) for k, m in models.items()}
    times = {k: {"zero": [], "cold": [], "warm": []} for k in engines}
    for r in range(rounds):
        for kind in KINDS[r % 2:] + KINDS[:r % 2]:
            e, t = engines[kind], times[kind]
            e.runner.prefixes.forget()
            e.scheduler.forget_prefixes()
            t["cold"].append(first_audio_ms(e, voice, r))
            e.scheduler.forget_prefixes()  # the slot's copy goes: the warm take reads the kept one
            t["warm"].append(first_audio_ms(e, voice, r))
            t["zero"].append(first_audio_ms(e, zero, r))
    out = []
    key = prefix_key(voice)
    for kind in KINDS:
        e = engines[kind]
        kv = e.runner.prefixes.get(key)
        with tempfile.TemporaryDirectory() as tmp:
            PrefixStore(e.runner.prefixes.identity, tmp).put(key, kv, persist=True)
            disk_ms = timed(lambda e=e, tmp=tmp: PrefixStore(e.runner.prefixes.identity, tmp).get(key))
        med = {k: statistics.median(v) for k, v in times[kind].items()}
        out.append([kind, med["zero"], med["cold"], med["warm"], f"{med['warm'] / med['zero']:.2f}×",
                    key[1], f"{kv_bytes(kv) / 1e6:.1f}", disk_ms])
    return Table(f"Time to first audio (tiny random codec), a {clip_frames}-frame clip's voice; medians of {rounds} "
                 "rotating rounds", ["precision", "zero-shot ms", "saved voice cold ms", "saved voice warm ms",
                                     "warm / zero-shot", "prefix positions", "kept prefix MB",
                                     "read from disk ms"], out)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


__all__ = ["bench_step", "bench_ttfa", "gemv_only", "peak_rss_gb"]
