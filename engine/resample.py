"""Band-limited resampling that reproduces `torchaudio.functional.resample` with its defaults.

The codec's semantic branch was trained on 16 kHz audio produced by torchaudio's windowed-sinc resampler
(Hann window, 6 zero crossings, roll-off 0.99). Voice-clone codes are an argmin over codebook distances, so
a different resampler (librosa, scipy, soxr) can flip codes; this module evaluates the same formula in the
same float32 operation order so the result matches torchaudio bit for bit, without depending on torchaudio
(no CPU wheel matches the torch we ship).

Algorithm (torchaudio `_get_sinc_resample_kernel` / `_apply_sinc_resample_kernel`): after dividing both
rates by their gcd, output sample j of each phase is a dot product of the input with a Hann-windowed sinc
centred at j / new; the `new` phases form the output channels of one strided conv1d over the input.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

LOWPASS_FILTER_WIDTH = 6  # zero crossings of the sinc on each side (torchaudio default)
ROLLOFF = 0.99  # cut-off as a fraction of the lower Nyquist frequency (torchaudio default)


@lru_cache(maxsize=8)
def _sinc_kernel(orig: int, new: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """Kernel [new, 1, 2·width + orig] and its half-width for rates already divided by their gcd.

    Computed on the CPU in `dtype` (the waveform's dtype, as torchaudio does) and cached: it depends only on
    the rates."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    idx = torch.arange(-width, width + orig, dtype=dtype)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=dtype)[:, None, None] / new + idx
    t *= base
    t = t.clamp_(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t *= math.pi
    scale = base / orig
    kernel = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernel *= window * scale
    return kernel, width


def resample(wav: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """Resample the last axis of a floating-point tensor from `orig_rate` to `new_rate` Hz.

    Output length is ceil(len · new / orig), as in torchaudio."""
    if not wav.is_floating_point():
        raise ValueError(f"resample needs a floating-point waveform, got {wav.dtype}")
    if orig_rate <= 0 or new_rate <= 0 or int(orig_rate) != orig_rate or int(new_rate) != new_rate:
        raise ValueError(f"sample rates must be positive integers (got {orig_rate} and {new_rate})")
    if orig_rate == new_rate:
        return wav
    gcd = math.gcd(int(orig_rate), int(new_rate))
    orig, new = int(orig_rate) // gcd, int(new_rate) // gcd
    kernel, width = _sinc_kernel(orig, new, wav.dtype)
    kernel = kernel.to(wav.device)
    shape = wav.shape
    flat = wav.reshape(-1, shape[-1])
    length = flat.shape[-1]
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernel, stride=orig)  # [batch, new phases, steps]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)
    out = out[..., : math.ceil(new * length / orig)]
    return out.reshape(shape[:-1] + out.shape[-1:])
