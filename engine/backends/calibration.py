"""FP8 activation calibration of the cubin backend: the static per-tensor scales of the three quantised
inputs of every layer (what the qkv, gate_up and down GEMMs read), measured once at load.

The backend runs fixed prompts of the three kinds users send through its BF16 path (`CALIBRATION_PROMPTS`):
a short text prompt, a voice-clone prompt (SPEC D1: reference-audio rows, each the sum of 8 codebook
embeddings, where a text prompt has text embeddings) and a long context (a prompt filling the cache up to
LONG_CONTEXT_POSITIONS, then decode steps there fed fixed audio rows, `decode_inputs`). A scale taken from
the text prompt alone would clip what the other two drive higher. The prompts are fixed, never a
user's request, so a take's codes do not depend on which request came first, and the scales are the same
bits at every load of the same weights on the same kernels.

At each quantised input the pass records a histogram of the BF16 magnitudes it sees with one bin per BF16
magnitude (2^15 bins), per prompt kind: exact, so the amax (hence the scale) is the largest value seen,
and the rates under the final scales are counted exactly, not estimated:

    saturation  share of values clipped at FP8_MAX (|x| / scale > 448)
    underflow   share of values that are not zero but round to zero (|x| / scale <= 2^-10: the tie rounds
                to even, which is zero)

Both come from the BF16 values the pass sees; the fused quantisers divide the FP32 value before its BF16
rounding, so a value within a BF16 rounding of a boundary may land on its other side. Saturation on the
calibration prompts is zero by construction while CALIBRATION_HEADROOM >= 1; it is the figure to watch
on other prompts (the device check's `checkpoint` section).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import Dims
from engine.delay import apply_delay
from engine.prompt import clone_ids, zero_shot_ids

FP8_MAX = 448.0
# Static activation scales map the calibration amax to half the e4m3 range: one binade of headroom for
# prompts whose activations exceed the calibration prompts', at the cost of one bit near the top.
CALIBRATION_HEADROOM = 2.0
CALIBRATION_DECODE_STEPS = 16
# The text prompt: Qwen chat tokens around ordinary text ids (the self-check's prompt starts with it).
CALIBRATION_IDS = (151644, 872, 198, 9707, 11, 419, 374, 264, 2805, 22636, 11652, 369, 279, 7743, 1614, 13,
                   151645, 198, 151644, 77091, 198)
# Ordinary text: "Welcome to SpeakSwiftly. This is the first official Higgs Audio v3 parity fixture." in the
# real tokenizer's ids (SPEC D3); the clone prompt's transcript and text, the long context's text, cycled.
PASSAGE_IDS = (13936, 311, 67201, 55336, 398, 13, 1096, 374, 279, 1156, 3946, 472, 61147, 12352, 348, 18, 49615,
               12507, 13)
# 6 s of reference audio (users send clips of 1 to 30 s); fewer frames where the cache is shorter.
CLONE_REFERENCE_FRAMES = 150
# A long take: prompt and decode steps fill half the engine's default 4096-position cache (half the cache,
# where the backend's is shorter; so does the clone prompt at most).
LONG_CONTEXT_POSITIONS = 2048
CALIBRATION_PROMPTS = ("text", "voice clone", "long context")
SITES = ("qkv", "gate_up", "down")   # the quantised inputs of a layer, in the order of its step
# Every BF16 magnitude, by its bit pattern with the sign cleared: the histogram's bins, in increasing order.
MAGNITUDES = torch.arange(1 << 15, dtype=torch.int16).view(torch.bfloat16).float()


@dataclass(frozen=True)
class CalibrationPrompt:
    """One calibration prompt: ids (AUDIO_PLACEHOLDER at reference-audio rows), the delayed reference rows
    [R, 8] that fill them (None without), and the rows [steps, 8] its decode steps feed (None: none)."""
    kind: str
    ids: torch.Tensor
    ref_rows: torch.Tensor | None = None
    decode: torch.Tensor | None = None

    @property
    def positions(self) -> int:
        return len(self.ids) + (0 if self.decode is None else len(self.decode))


def calibration_prompts(dims: Dims, max_len: int, steps: int) -> list[CalibrationPrompt]:
    """The text, voice-clone and long-context prompts for a cache of `max_len` positions. Between them they
    cover text rows at early and late positions and audio rows at both: the text prompt's rows, the clone
    prompt's reference rows, and the long context's text and `steps` decode steps at its far end
    (`decode_inputs`). Deterministic: fixed ids, and reference codes from a fixed seed."""
    cache = min(max_len, dims.max_positions)
    half = cache // 2
    if len(CALIBRATION_IDS) > cache:
        raise ValueError(f"the calibration needs {len(CALIBRATION_IDS)} positions; the cache has {max_len}")
    transcript, said = list(PASSAGE_IDS[:6]), list(PASSAGE_IDS[6:])
    frames = max(1, min(CLONE_REFERENCE_FRAMES, half - len(clone_ids(said, 1, transcript)) - dims.codebooks + 2))
    codes = torch.randint(0, dims.codebook_size, (frames, dims.codebooks), generator=torch.Generator().manual_seed(0))
    rows = apply_delay(codes, dims.boc, dims.eoc)
    words = max(1, min(LONG_CONTEXT_POSITIONS, half) - steps - len(zero_shot_ids([])))
    prompts = [CalibrationPrompt("text", torch.tensor(CALIBRATION_IDS)),
               CalibrationPrompt("voice clone", torch.tensor(clone_ids(said, len(rows), transcript)), rows),
               CalibrationPrompt("long context", torch.tensor(zero_shot_ids([said[i % len(said)] for i in range(words)])),
                                 decode=decode_inputs(dims, steps))]
    return [p for p in prompts if p.positions <= cache]


def decode_inputs(dims: Dims, steps: int) -> torch.Tensor:
    """The rows [steps, 8] calibration decode steps feed: fixed codes in the delay pattern (step s has BOC in
    codebooks k > s, as a take's rows have). Fixed rather than the model's own greedy picks, so the pass
    needs no logits (the head does not run) and its inputs are the same whatever the weights' near-ties."""
    codes = torch.randint(0, dims.codebook_size, (max(steps, 1), dims.codebooks),
                          generator=torch.Generator().manual_seed(1))
    return apply_delay(codes, dims.boc, dims.eoc)[:steps]


def fp8_rates(x: torch.Tensor, scale: float) -> tuple[float, float]:
    """(saturation, underflow) of quantising `x` to e4m3 with a static `scale` (module docstring), as
    `kernels.ops.quantize_fp8` quantises: x / scale in fp32, clamped to ±FP8_MAX, rounded to nearest even."""
    q = x.float() / scale
    saturated = int((q.abs() > FP8_MAX).sum())
    zero = (q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() == 0) & (x != 0)
    return saturated / max(x.numel(), 1), int(zero.sum()) / max(x.numel(), 1)


class Recorder:
    """What the calibration pass sees at the quantised inputs: per prompt kind, layer and site, a histogram
    of BF16 magnitudes (on the device: one bincount per observation, no host sync until `result`). The
    backend sets `kind` before each prompt and calls `observe` at each quantised input."""

    def __init__(self, kinds: int, layers: int, device):
        self.kind = 0
        self.hist = torch.zeros(kinds, layers, len(SITES), len(MAGNITUDES), dtype=torch.long, device=device)

    def observe(self, layer: int, site: str, x: torch.Tensor) -> None:
        bits = x.detach().to(torch.bfloat16).contiguous().view(torch.int16).flatten() & 0x7FFF
        self.hist[self.kind, layer, SITES.index(site)] += torch.bincount(bits.int(), minlength=len(MAGNITUDES))

    def result(self, prompts: list[CalibrationPrompt], headroom: float = CALIBRATION_HEADROOM,
               scales: torch.Tensor | None = None) -> Calibration:
        """The scales (the amax over every kind, with `headroom`; or `scales` [layers, sites] as given, to
        count other prompts' values under a calibration's) and the counts under them."""
        hist = self.hist.cpu()
        seen = torch.where(hist > 0, torch.arange(len(MAGNITUDES)), -1).amax(-1)   # the largest bin with a count
        amax = torch.where(seen >= 0, MAGNITUDES[seen.clamp(min=0)], 0.0)            # [kinds, layers, sites]
        if scales is None:
            scales = amax.amax(0).clamp(min=1e-6) * headroom / FP8_MAX              # [layers, sites] fp32
        q = MAGNITUDES / scales[..., None]                                          # each bin's value / scale
        clipped = q > FP8_MAX
        zero = (q.clamp(max=FP8_MAX).to(torch.float8_e4m3fn).float() == 0) & (MAGNITUDES > 0)
        return Calibration(kinds=tuple(p.kind for p in prompts), positions=tuple(p.positions for p in prompts),
                           amax=amax, scales=scales, values=hist.sum(-1), saturated=(hist * clipped).sum(-1),
                           underflow=(hist * zero).sum(-1))


@dataclass(frozen=True)
class Calibration:
    """The outcome of a calibration (`CubinBackend.calibration`): per prompt kind, layer and site, the amax
    and the counts of values seen, saturated and underflowing under the final `scales` [layers, sites]."""
    kinds: tuple[str, ...]
    positions: tuple[int, ...]   # each prompt's positions, its decode steps included
    amax: torch.Tensor           # [kinds, layers, sites] fp32
    scales: torch.Tensor         # [layers, sites] fp32: the static activation scales
    values: torch.Tensor         # [kinds, layers, sites] counts
    saturated: torch.Tensor
    underflow: torch.Tensor

    def rates(self, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(saturation, underflow) [layers, sites] over every prompt, or over the prompt of `kind`."""
        pick = slice(None) if kind is None else slice(self.kinds.index(kind), self.kinds.index(kind) + 1)
        values = self.values[pick].sum(0).clamp(min=1).double()
        return self.saturated[pick].sum(0) / values, self.underflow[pick].sum(0) / values

    def set_by(self) -> dict[str, int]:
        """How many of the layers × sites scales each prompt kind set (its amax is the largest)."""
        top = self.amax.argmax(0).flatten().tolist()
        return {kind: top.count(k) for k, kind in enumerate(self.kinds)}

    @property
    def summary(self) -> str:
        sat, under = self.rates()
        worst = [(float(r.max()), divmod(int(r.argmax()), len(SITES))) for r in (sat, under)]
        where = [f"layer {i} {SITES[s]}" for _, (i, s) in worst]
        prompts = ", ".join(f"{k} ({n} positions)" for k, n in zip(self.kinds, self.positions))
        by = ", ".join(f"{k} {n}" for k, n in self.set_by().items())
        return (f"calibrated on {prompts}; scales set by {by} of {self.scales.numel()}; saturation max "
                f"{worst[0][0]:.3%} ({where[0]}), underflow max {worst[1][0]:.3%} ({where[1]})")
