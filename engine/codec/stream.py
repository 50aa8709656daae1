"""Streaming decode that equals the one-shot decode, at the one-shot decode's cost.

Why stateful: the decoder's receptive field is 10 frames a side (`DacDecoder.receptive_field_frames`), so
the earlier decoder re-decoded a window of 10 + new + 10 frames per push: 20 extra frames on each of the
engine's 13 pushes for 10 s, 1.4–1.6× a one-shot decode (docs/PERFORMANCE.md). Instead every layer keeps the input
history its next outputs still read and computes each output once, when its whole input window has arrived
(`streaming_layers`); the codes → latent part (RVQ lookup + fc2) is per frame. The outputs are the one-shot
layers' outputs from the same dot products, so the stream equals `Codec.decode` up to the rounding of
conv blocking (~1e-7), and the conv work is exactly the one-shot work (`test_codec_stream`).

The noise-free claim is the work count: every conv MAC and Snake sample is computed exactly as often as in
one-shot (`tests/test_codec_stream.py`); the wall-clock figures, and why one thread is the steadier setting
on a loaded CPU, are in docs/PERFORMANCE.md.

The layers together hold back `lag` output samples (9,458 for strides 8·5·4·2·3, < 10 frames); samples are
returned in whole frames, those of every frame that has `right` frames after it, so a frame's audio comes
out as soon as it is final and the engine's look-ahead bookkeeping (`stream.right`) holds.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch
from torch import nn

from .streaming_layers import streaming_decoder


class FrameCodec(Protocol):
    """What the stream decoder needs of a codec (engine/codec/model.py `Codec`)."""

    hop: int  # samples per frame
    acoustic_decoder: nn.Module

    def check_codes(self, codes) -> torch.Tensor:
        """Codes [n, 8] validated, on the codec's device."""

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Validated codes [n, 8] → the decoder's input [n, latent], frame by frame."""


class StreamDecoder:
    """Incremental decoder over one utterance: `push` frames as they are generated, `flush` at the end."""

    def __init__(self, codec: FrameCodec):
        self.codec = codec
        self.hop = codec.hop
        with torch.inference_mode():
            self._like = next(codec.acoustic_decoder.parameters()).new_zeros(0)  # the decoder's dtype and device
            self.layers = streaming_decoder(codec.acoustic_decoder, self._like)
        # Frames a frame must have after it before its audio is final (the engine waits this long before
        # its first push); the layers' lag in samples, rounded up to frames.
        self.right = math.ceil(self.layers.lag / self.hop)
        self.received = 0  # frames pushed so far
        self.emitted = 0  # frames whose samples have been returned
        self.finished = False
        self._pending = np.zeros(0, dtype=np.float32)  # computed samples past the last returned frame

    @property
    def buffered(self) -> int:
        """Frames pushed whose audio is not returned yet (at most `right` after a push)."""
        return self.received - self.emitted

    def push(self, frames) -> np.ndarray:
        """Add frames [n, 8]; return the samples of every frame that no later frame can change any more
        (possibly none: the first `right` frames are held back as look-ahead)."""
        if self.finished:
            raise ValueError("this stream was flushed; start a new one with codec.stream()")
        frames = self.codec.check_codes(frames)
        if frames.shape[0]:
            with torch.inference_mode():
                latent = self.codec.latent(frames)  # [n, latent], per frame
                self._take(self.layers.step(latent.t()[None]))
            self.received += frames.shape[0]
        return self._emit(max(self.emitted, self.received - self.right))

    def flush(self) -> np.ndarray:
        """Return the samples of all frames not yet returned (the end of the utterance has no look-ahead)."""
        if self.finished:
            raise ValueError("this stream was already flushed")
        self.finished = True
        if self.received:
            with torch.inference_mode():
                self._take(self.layers.flush(self._like))
        return self._emit(self.received)

    def _take(self, wav: torch.Tensor) -> None:
        self._pending = np.concatenate([self._pending, wav[0, 0].cpu().numpy()])

    def _emit(self, end: int) -> np.ndarray:
        n = (end - self.emitted) * self.hop
        if self._pending.shape[0] < n:
            raise RuntimeError(f"streaming decoder lags more than right={self.right} frames "
                               f"({self._pending.shape[0]} of {n} samples ready)")
        out, self._pending = self._pending[:n], self._pending[n:]
        self.emitted = end
        return out
