"""The CPU path's precisions side by side at full size: `python -m bench.cpu --only precision`.

A full-size random checkpoint in the real layout (bf16, 36 layers of 2560, four shards) is written once
under `--precision-dir`, then loaded through the real loading code (memory-mapped safetensors) as bf16,
weight-only int8 and weight-only int4, all three in this process. In one run, the three interleaved:
- decode ms/frame of the backbone step (`decode_rows`, the step every CPU take runs) at c = 1, achieved
  weight bandwidth and % of the copy floor for that precision's own weight bytes;
- aggregate frames/s at c = 8 (one step of 8 takes);
- prefill of a 40-token prompt;
- fidelity against bf16: prefill logits cosine, and over `--fidelity-steps` teacher-forced steps the minimum
  cosine and the greedy agreement per codebook;
and, each in a fresh process (`Engine.load`, the studio's own load), the peak RSS and the load time (RSS
counts the memory-mapped checkpoint's resident pages too, as the kernel does).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import Table
from engine.config import FRAME_RATE, FULL_SIZE, Dims
from engine.quant import weight_bytes

KINDS = ("bf16", "int8", "int4")
_MARK = ".complete"


def checkpoint(root: Path, dims: Dims = FULL_SIZE) -> Path:
    """The random checkpoint of `dims` under `root`, written once (bf16, no codec, 4 shards)."""
    from engine.demo import write_tiny_checkpoint

    root = Path(root)
    mark = root / _MARK
    want = json.dumps([dims.hidden, dims.intermediate, dims.layers, dims.vocab])
    if mark.exists() and mark.read_text() == want:
        return root
    print(f"writing a random {dims.layers}-layer checkpoint to {root} (once) …", flush=True)
    write_tiny_checkpoint(root, dims=dims, seed=1, codec=False, dtype=torch.bfloat16, shards=4)
    mark.write_text(want)
    return root


def load(root: Path, kind: str, max_rows: int = 8):
    from engine.checkpoint import load_checkpoint
    from engine.model import HiggsModel

    ckpt = load_checkpoint(root, progress=False)
    return HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.bfloat16, max_len=320, max_rows=max_rows,
                                      quant=None if kind == "bf16" else kind)


def step_bytes(model) -> int:
    """Bytes one decode step reads: every layer matrix as stored (packed or not), the norms and the head."""
    total = model.audio_embedding.weight.numel() * model.audio_embedding.weight.element_size()
    for layer in model.layers:
        a, m = layer.self_attn, layer.mlp
        total += sum(weight_bytes(w) for w in (a.wqkv, a.wo, m.w_gate_up, m.w_down))
        total += sum(weight_bytes(w) for w in (a.qk_norm, layer.input_layernorm.weight,
                                               layer.post_attention_layernorm.weight))
    return total


def rss_probe(root: Path, kind: str) -> dict:
    """Peak RSS and load time of `Engine.load(root, precision=kind)` in a fresh process. The peak is the
    kernel's high-water mark of this process's own memory (VmHWM); `getrusage`'s ru_maxrss would report
    the parent's size at fork when that is larger."""
    code = ("import json, time; t = time.perf_counter(); from engine.generate import Engine; "
            f"e = Engine.load({str(root)!r}, device='cpu', precision={kind!r}); "
            "hwm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')); "
            "print(json.dumps({'load_s': time.perf_counter() - t, 'precision': e.info.precision, "
            "'peak_rss': hwm * 1024}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def bench_precision(root: Path, floor_bps: float, *, frames: int = 8, rounds: int = 3, fidelity_steps: int = 100,
                    batch: int = 8, probe: tuple[str, ...] = KINDS) -> list[Table]:
    # int8 and int4 first: they are small, so the three fit beside each other (bf16 ~7.3 GB at full size).
    models = {kind: load(root, kind, max_rows=batch) for kind in ("int8", "int4", "bf16")}
    dims = models["bf16"].dims
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, dims.vocab, (40,), generator=gen)
    rows = torch.randint(0, dims.codebook_size, (batch, dims.codebooks), generator=gen)
    for kind, m in models.items():
        for slot in range(batch):
            m.prefill(prompt, None, 0, slot=slot)
    times = {k: {"c1": [], "c8": [], "prefill": []} for k in KINDS}
    for r in range(rounds):
        for kind in (KINDS[r % 3:] + KINDS[:r % 3]):  # the order rotates, so load from elsewhere hits all alike
            m = models[kind]
            for i in range(frames):
                t0 = time.perf_counter()
                m.decode_rows(rows[:1], [0], [40 + i])
                times[kind]["c1"].append((time.perf_counter() - t0) * 1e3)
            for i in range(max(2, frames // 4)):
                t0 = time.perf_counter()
                m.decode_rows(rows, list(range(batch)), [40 + i] * batch)
                times[kind]["c8"].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            m.prefill(prompt, None, 0, slot=0)
            times[kind]["prefill"].append((time.perf_counter() - t0) * 1e3)
    speed = []
    bf16_c1 = statistics.median(times["bf16"]["c1"])
    bf16_fps8 = batch / statistics.median(times["bf16"]["c8"]) * 1e3
    for kind in KINDS:
        c1, c8 = statistics.median(times[kind]["c1"]), statistics.median(times[kind]["c8"])
        nbytes = step_bytes(models[kind])
        floor_ms = nbytes / floor_bps * 1e3
        fps8 = batch / c8 * 1e3
        speed.append([kind, f"{nbytes / 1e9:.2f}", c1, f"{bf16_c1 / c1:.2f}×", nbytes / (c1 / 1e3) / 1e9,
                      f"{100 * floor_ms / c1:.0f}%", 1e3 / c1, fps8, f"{fps8 / bf16_fps8:.2f}×",
                      statistics.median(times[kind]["prefill"]), c1 * FRAME_RATE / 1e3])

    # Fidelity: the bf16 model's greedy rows, fed to all three (teacher forcing), from a fresh prefill.
    logits = {k: m.prefill(prompt, None, 0, slot=0) for k, m in models.items()}
    fid = {k: {"prefill": cosine(logits[k], logits["bf16"]), "cos": [], "agree": torch.zeros(dims.codebooks)}
           for k in ("int8", "int4")} if fidelity_steps else {}
    row = logits["bf16"].argmax(-1)
    for step in range(fidelity_steps):
        out = {k: m.decode_rows(row[None], [0], [40 + step])[0] for k, m in models.items()}
        for k in fid:
            fid[k]["cos"].append(cosine(out[k], out["bf16"]))
            fid[k]["agree"] += (out[k].argmax(-1) == out["bf16"].argmax(-1)).float()
        row = out["bf16"].argmax(-1)
    fidelity = [[k, f"{f['prefill']:.6f}", f"{min(f['cos']):.6f}", f"{statistics.median(f['cos']):.6f}",
                 " ".join(f"{float(a) / max(1, fidelity_steps):.2f}" for a in f["agree"])] for k, f in fid.items()]
    del models, logits

    tables = [
        Table(f"CPU precisions at full size ({dims.layers} L, {dims.hidden}): the backbone step, {rounds} interleaved "
              f"rounds of {frames} steps (c = 1) and {max(2, frames // 4)} steps of {batch} takes (c = {batch}); copy "
              f"floor {floor_bps / 1e9:.1f} GB/s (read + write) measured in this run",
              ["precision", "weight GB/step", "ms/frame c=1", "speed-up vs bf16", "weight GB/s", "% of floor",
               "frames/s c=1", f"frames/s c={batch}", f"c={batch} vs bf16", "prefill 40 tok ms", "RTF @25 fps"],
              speed),
    ]
    if fidelity:
        tables.append(Table(f"Fidelity against bf16 (same weights): prefill logits cosine; {fidelity_steps} "
                            "teacher-forced steps", ["precision", "prefill cosine", "min step cosine",
                                                     "median step cosine", "greedy agreement per codebook (cb0 … cb7)"],
                            fidelity))
    if probe:
        probes = [[kind, f"{p['peak_rss'] / 1e9:.2f}", f"{p['load_s']:.1f}", p["precision"]]
                  for kind in probe for p in [rss_probe(root, kind)]]
        tables.append(Table("Load in a fresh process (Engine.load from the memory-mapped checkpoint)",
                            ["precision asked", "peak RSS GB", "load s", "precision run"], probes))
    return tables


__all__ = ["checkpoint", "bench_precision", "rss_probe", "step_bytes"]
