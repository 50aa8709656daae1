"""Streaming decode that equals the one-shot decode, at the one-shot decode's cost.

Why stateful: the decoder's receptive field is 10 frames a side (`DacDecoder.receptive_field_frames`), so
the earlier decoder re-decoded a window of 10 + new + 10 frames per push: 20 extra frames on each of the
engine's 13 pushes for 10 s, 1.4–1.6× a one-shot decode as measured below. Instead every layer keeps the input
history its next outputs still read and computes each output once, when its whole input window has arrived
(`streaming_layers`); the codes → latent part (RVQ lookup + fc2) is per frame. The outputs are the one-shot
layers' outputs from the same dot products, so the stream equals `Codec.decode` up to the rounding of
conv blocking (~1e-7), and the conv work is exactly the one-shot work (`test_codec_stream`).

Measured (full-size random codec, 10 s = 250 frames, the engine's schedule 12, 4, 8, 16, 25…, fp32 CPU,
interleaved runs on a shared 2-core machine): with 1 thread, CPU time median of 7, one-shot 1,586 ms,
windowed 2,224 ms (1.40×), stateful 1,329 ms (0.84×: the matmul upsampler beats torch's conv_transpose);
with 2 threads in a quiet spell, wall median of 5, one-shot 821 ms, windowed 1,159 ms (1.41×), stateful
848 ms (1.03×, measured with F.conv_transpose1d in the upsampler, before the matmul). With 2 threads under
load (other jobs keeping ~4 runnable on the 2 cores) all three slow down and the stream most: one-shot 3,443,
stateful 6,939 (2.0×), windowed 10,394 ms (3.0×), CPU time alike: the stream runs the decoder's ops once
per push (14 times for 10 s, the flush included) on smaller tensors, and every parallel op waits for a preempted thread. So the
noise-free claim is the work count: every conv MAC and Snake sample is computed exactly as often as in
one-shot (`tests/test_codec_stream.py`); for a loaded CPU, one thread is the steadier setting.

The layers together hold back `lag` output samples (9,458 for strides 8·5·4·2·3, < 10 frames); samples are
returned in whole frames, those of every frame that has `right` frames after it, so a frame's audio comes
out as soon as it is final and the engine's look-ahead bookkeeping (`stream.right`) holds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from .streaming_layers import streaming_decoder

if TYPE_CHECKING:
    from .model import Codec


class StreamDecoder:
    """Incremental decoder over one utterance: `push` frames as they are generated, `flush` at the end."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self.hop = codec.hop
        with torch.inference_mode():
            like = codec.fc2.weight.new_zeros(0)
            self.layers = streaming_decoder(codec.acoustic_decoder, like)
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
                latent = self.codec.fc2(self.codec.quantizer.decode(frames))  # [n, latent], per frame
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
                self._take(self.layers.flush(self.codec.fc2.weight.new_zeros(0)))
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
