"""Stateful, causal-by-lag versions of the DAC decoder's layers: each computes every output of the one-shot
layer exactly once, as soon as that output's whole input window has arrived.

Every stage takes a chunk `[1, C, n]` (any n ≥ 0, the next n time steps of its input) in `step` and returns the
next outputs that are final, and at the end of the utterance `flush` feeds the right zero padding and returns
the rest, so that the concatenated outputs equal the one-shot layer's output. The state a stage keeps is only
what a future output still reads:

* `StreamingConv1d` (stride 1, kernel K, dilation d, padding P = (K−1)·d/2): the last (K−1)·d input
  samples, initialised with the P zeros of the left padding; it lags its input by P samples.
* `StreamingConvTranspose1d` (stride s, kernel 2s): each input sample contributes 2s outputs; the
  contributions of the newest input that spill past the current chunk (s samples) are carried and
  overlap-added to the next chunk; the first `padding` outputs are cropped, and flush releases the carried
  outputs that the one-shot layer keeps (s − padding + output_padding of them).
* `StreamingResidualUnit`: the skip path buffers its input until the branch (which lags by its conv's
  padding) produces the matching outputs.
* Snake is pointwise (`Pointwise`); the chains (`Chain`) compose stages.

Each stage counts the work it does in `macs` (multiply-accumulates of its conv, the same measure one-shot
hooks give), so tests can show streaming does no more work than one-shot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .dac import DacDecoder, DecoderBlock, ResidualUnit


def _empty(like: torch.Tensor, channels: int) -> torch.Tensor:
    return like.new_zeros(1, channels, 0)


class Pointwise:
    """A per-sample module (Snake): no state, no lag."""

    def __init__(self, module: nn.Module, channels: int):
        self.module = module
        self.channels = channels
        self.lag = 0

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x) if x.shape[-1] else x

    def flush(self, like: torch.Tensor) -> torch.Tensor:
        return _empty(like, self.channels)


class StreamingConv1d:
    """A stride-1 `nn.Conv1d` with symmetric zero padding, fed in chunks."""

    def __init__(self, conv: nn.Conv1d, like: torch.Tensor):
        (k,), (d,), (p,), (s,) = conv.kernel_size, conv.dilation, conv.padding, conv.stride
        if s != 1 or 2 * p != (k - 1) * d or conv.groups != 1:
            raise ValueError(f"streaming needs a stride-1, 'same'-padded, ungrouped conv; got {conv}")
        self.conv = conv
        self.span = (k - 1) * d  # input samples before the newest one that an output reads
        self.lag = p
        self._macs_per_output = conv.in_channels * conv.out_channels * k
        self.macs = 0
        self._history = like.new_zeros(1, conv.in_channels, p)  # the left zero padding

    def step(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.cat([self._history, x], dim=-1) if self.span else x
        n = buf.shape[-1] - self.span
        if n <= 0:
            self._history = buf
            return _empty(x, self.conv.out_channels)
        self._history = buf[..., n:]
        self.macs += n * self._macs_per_output
        return F.conv1d(buf, self.conv.weight, self.conv.bias, dilation=self.conv.dilation)

    def flush(self, like: torch.Tensor) -> torch.Tensor:
        return self.step(like.new_zeros(1, self.conv.in_channels, self.lag))  # the right zero padding


class StreamingConvTranspose1d:
    """An `nn.ConvTranspose1d` with kernel 2·stride (DAC's upsamplers) fed in chunks, by overlap-add.

    Input sample i contributes W[:, :, :s]·x_i to output block i and W[:, :, s:]·x_i to block i + 1, so the
    chunk's contributions are one matmul [n, in] @ [in, out·2s] and a block is final once the input after it
    has arrived; the newest input's second half is carried to the next chunk. A matmul rather than
    F.conv_transpose1d: for the short chunks of the first block (1024 channels at frame rate) torch picks its
    slow native path: 16.5 ms for a 2-frame chunk against 2.0 ms for the matmul (and 29 vs 23 ms for 250 frames
    at once, 1 thread)."""

    def __init__(self, conv: nn.ConvTranspose1d, like: torch.Tensor):
        (k,), (s,), (p,), (op,) = conv.kernel_size, conv.stride, conv.padding, conv.output_padding
        if k != 2 * s or op > p or conv.groups != 1 or conv.dilation[0] != 1:
            raise ValueError(f"streaming needs kernel = 2·stride and output_padding ≤ padding; got {conv}")
        self.conv = conv
        self.stride = s
        self.lag = p  # outputs cropped at the start: output n is full-conv position n + p
        self._tail = s - p + op  # carried outputs the one-shot layer keeps after the last input
        self._weight = conv.weight.reshape(conv.in_channels, -1)  # [in, out·2s]
        self._macs_per_input = conv.in_channels * conv.out_channels * k
        self.macs = 0
        self._crop = p
        self._carry = like.new_zeros(1, conv.out_channels, s)  # no input before the first one
        self._bias = conv.bias.view(1, -1, 1) if conv.bias is not None else None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        n, out, s = x.shape[-1], self.conv.out_channels, self.stride
        if n == 0:
            return _empty(x, out)
        self.macs += n * self._macs_per_input
        parts = (x[0].t() @ self._weight).view(n, out, 2, s)
        first, second = parts[:, :, 0], parts[:, :, 1]
        y = first + torch.cat([self._carry, second[:-1]])  # block i: its own input + the one before
        self._carry = second[-1:].clone()  # not a view: the chunk's buffer can go
        y = y.permute(1, 0, 2).reshape(1, out, n * s)
        if self._crop:
            y, self._crop = y[..., self._crop:], max(0, self._crop - n * s)
        return y + self._bias if self._bias is not None else y

    def flush(self, like: torch.Tensor) -> torch.Tensor:
        out = self._carry[..., :self._tail]
        return out + self._bias if self._bias is not None else out


class Chain:
    """Stages in sequence; flush drains each stage's remainder through the stages after it."""

    def __init__(self, stages: list):
        self.stages = stages
        self.lag = 0  # in this chain's output samples; set by the builder (rates differ across stages)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage.step(x)
        return x

    def flush(self, like: torch.Tensor) -> torch.Tensor:
        x = None  # nothing is left upstream of the first stage
        for stage in self.stages:
            head = [] if x is None else [stage.step(x)]  # the stage takes its input's remainder first
            x = torch.cat([*head, stage.flush(like)], dim=-1)
        return x

    def convs(self):
        for stage in self.stages:
            if isinstance(stage, (StreamingConv1d, StreamingConvTranspose1d)):
                yield stage
            elif hasattr(stage, "convs"):
                yield from stage.convs()


class StreamingResidualUnit:
    """x + branch(x), with x held back until the branch's outputs for the same positions are ready."""

    def __init__(self, unit: ResidualUnit, like: torch.Tensor):
        self.branch = Chain([Pointwise(unit.snake1, unit.conv1.in_channels), StreamingConv1d(unit.conv1, like),
                             Pointwise(unit.snake2, unit.conv2.in_channels), StreamingConv1d(unit.conv2, like)])
        self.lag = unit.conv1.padding[0] + unit.conv2.padding[0]
        self._skip = _empty(like, unit.conv1.in_channels)

    def _add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._skip = torch.cat([self._skip, x], dim=-1) if x.shape[-1] else self._skip
        n = y.shape[-1]
        out = self._skip[..., :n] + y  # the one-shot order: input + branch
        self._skip = self._skip[..., n:]
        return out

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self.branch.step(x))

    def flush(self, like: torch.Tensor) -> torch.Tensor:
        out = self._add(self._skip[..., :0], self.branch.flush(like))
        assert self._skip.shape[-1] == 0, "residual branch and skip path lengths disagree"
        return out

    def convs(self):
        return self.branch.convs()


def _block(block: DecoderBlock, like: torch.Tensor) -> Chain:
    units = [StreamingResidualUnit(u, like) for u in (block.res_unit1, block.res_unit2, block.res_unit3)]
    conv_t = StreamingConvTranspose1d(block.conv_t1, like)
    chain = Chain([Pointwise(block.snake1, block.conv_t1.in_channels), conv_t, *units])
    chain.lag = conv_t.lag + sum(u.lag for u in units)
    return chain


def streaming_decoder(decoder: DacDecoder, like: torch.Tensor) -> Chain:
    """The stateful twin of `decoder`: latent chunks [1, latent, n frames] in, waveform chunks [1, 1, m] out.
    Its `lag` is the number of output samples it holds back until more frames (or the flush) arrive."""
    head, tail = StreamingConv1d(decoder.conv1, like), StreamingConv1d(decoder.conv2, like)
    blocks = [_block(b, like) for b in decoder.block]
    chain = Chain([head, *blocks, Pointwise(decoder.snake1, decoder.conv2.in_channels), tail])
    lag = head.lag  # in frames; each block multiplies the rate by its stride and adds its own lag
    for block, stride in zip(blocks, decoder.strides):
        lag = lag * stride + block.lag
    chain.lag = lag + tail.lag
    return chain
