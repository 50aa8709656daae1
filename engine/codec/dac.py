"""The codec's acoustic half: DAC encoder and decoder, with parameter names exactly as transformers'
`DacEncoder` / `DacDecoder` inside `HiggsAudioV2TokenizerModel` (weight norm already folded).

Higgs changes two things in DAC's decoder (transformers `_adjust_dac_decoder`): every ConvTranspose1d gets
`output_padding = stride % 2`, so each block multiplies the length exactly by its stride (960 samples per
frame for strides 8·5·4·2·3), and the final tanh is removed. Kernel sizes (7, 2·stride, 1), paddings and the
dilations 1/3/9 are fixed by the architecture; every width is read off the weight shapes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

RES_DILATIONS = (1, 3, 9)
RES_KERNEL = 7
OUTER_KERNEL = 7  # conv1 of both halves and conv2 of the decoder
ENCODER_OUT_KERNEL = 3  # conv2 of the encoder


class Snake(nn.Module):
    """x + sin²(αx) / α, per channel (DAC's periodic activation; the 1e-9 keeps α = 0 finite)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    """Snake → dilated conv k7 → Snake → conv k1, plus the input (length preserved)."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.snake1 = Snake(channels)
        self.conv1 = nn.Conv1d(channels, channels, RES_KERNEL, dilation=dilation,
                               padding=(RES_KERNEL - 1) * dilation // 2)
        self.snake2 = Snake(channels)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))


def _res_units(channels: int) -> tuple[ResidualUnit, ResidualUnit, ResidualUnit]:
    return tuple(ResidualUnit(channels, d) for d in RES_DILATIONS)


class DecoderBlock(nn.Module):
    """Snake → ConvTranspose (×stride) → three residual units."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.snake1 = Snake(in_ch)
        self.conv_t1 = nn.ConvTranspose1d(in_ch, out_ch, 2 * stride, stride=stride,
                                          padding=math.ceil(stride / 2), output_padding=stride % 2)
        self.res_unit1, self.res_unit2, self.res_unit3 = _res_units(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class EncoderBlock(nn.Module):
    """Three residual units → Snake → strided conv (÷stride)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        self.res_unit1, self.res_unit2, self.res_unit3 = _res_units(in_ch)
        self.snake1 = Snake(in_ch)
        self.conv1 = nn.Conv1d(in_ch, out_ch, 2 * stride, stride=stride, padding=math.ceil(stride / 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.res_unit3(self.res_unit2(self.res_unit1(x)))
        return self.conv1(self.snake1(x))


class DacDecoder(nn.Module):
    """Latent [B, latent, T] → waveform [B, 1, T·∏strides]."""

    def __init__(self, latent: int, width: int, strides: tuple[int, ...]):
        super().__init__()
        self.strides = tuple(strides)
        self.conv1 = nn.Conv1d(latent, width, OUTER_KERNEL, padding=OUTER_KERNEL // 2)
        self.block = nn.ModuleList(
            DecoderBlock(width >> i, width >> (i + 1), s) for i, s in enumerate(self.strides))
        out_ch = width >> len(self.strides)
        self.snake1 = Snake(out_ch)
        self.conv2 = nn.Conv1d(out_ch, 1, OUTER_KERNEL, padding=OUTER_KERNEL // 2)

    @classmethod
    def from_shapes(cls, sd: dict[str, torch.Tensor], prefix: str = "acoustic_decoder.") -> "DacDecoder":
        """Widths from conv1 [width, latent, 7]; strides from each block's ConvTranspose kernel (2·stride)."""
        width, latent, _ = sd[prefix + "conv1.weight"].shape
        strides = []
        while (key := f"{prefix}block.{len(strides)}.conv_t1.weight") in sd:
            strides.append(sd[key].shape[2] // 2)
        return cls(latent, width, tuple(strides))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.conv1(z)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))

    def receptive_field_frames(self) -> tuple[int, int]:
        """(left, right): how many input frames before / after a frame can change that frame's samples.

        Walks the layers backwards from the samples of one output frame, mapping each interval of output
        positions to the interval of input positions it reads (exact integer arithmetic, padding included),
        so a streaming window with this much context reproduces the one-shot decode."""
        hop = math.prod(self.strides)
        centre = 10_000  # any frame far from both ends: the decoder is shift-invariant by whole frames
        lo, hi = centre * hop, centre * hop + hop - 1

        def conv(m: nn.Conv1d, lo: int, hi: int) -> tuple[int, int]:
            span = m.dilation[0] * (m.kernel_size[0] - 1)
            return lo * m.stride[0] - m.padding[0], hi * m.stride[0] - m.padding[0] + span

        def conv_t(m: nn.ConvTranspose1d, lo: int, hi: int) -> tuple[int, int]:
            s, p, k = m.stride[0], m.padding[0], m.kernel_size[0]
            return -((-(lo + p - (k - 1))) // s), (hi + p) // s  # out n reads inputs i with n = i·s − p + j

        lo, hi = conv(self.conv2, lo, hi)
        for block in reversed(self.block):
            for unit in (block.res_unit3, block.res_unit2, block.res_unit1):
                lo, hi = conv(unit.conv1, *conv(unit.conv2, lo, hi))  # the branch covers the skip path
            lo, hi = conv_t(block.conv_t1, lo, hi)
        lo, hi = conv(self.conv1, lo, hi)
        return centre - lo, hi - centre


class DacEncoder(nn.Module):
    """Waveform [B, 1, L] → latent [B, latent, frames]."""

    def __init__(self, width: int, latent: int, strides: tuple[int, ...]):
        super().__init__()
        self.strides = tuple(strides)
        self.conv1 = nn.Conv1d(1, width, OUTER_KERNEL, padding=OUTER_KERNEL // 2)
        self.block = nn.ModuleList(
            EncoderBlock(width << i, width << (i + 1), s) for i, s in enumerate(self.strides))
        out_ch = width << len(self.strides)
        self.snake1 = Snake(out_ch)
        self.conv2 = nn.Conv1d(out_ch, latent, ENCODER_OUT_KERNEL, padding=ENCODER_OUT_KERNEL // 2)

    @classmethod
    def from_shapes(cls, sd: dict[str, torch.Tensor], prefix: str = "acoustic_encoder.") -> "DacEncoder":
        width = sd[prefix + "conv1.weight"].shape[0]
        latent = sd[prefix + "conv2.weight"].shape[0]
        strides = []
        while (key := f"{prefix}block.{len(strides)}.conv1.weight") in sd:
            strides.append(sd[key].shape[2] // 2)
        return cls(width, latent, tuple(strides))

    def frames(self, samples: int) -> int:
        """Output length for `samples` input samples (the strided convs; all others keep the length)."""
        for block in self.block:
            c = block.conv1
            samples = (samples + 2 * c.padding[0] - c.kernel_size[0]) // c.stride[0] + 1
        return samples

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        x = self.conv1(wav)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))
