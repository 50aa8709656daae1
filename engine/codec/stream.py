"""Streaming decode by overlapping windows that equals the one-shot decode.

A frame's samples depend on the codes of `left` frames before it and `right` frames after it (the DAC
decoder's receptive field, `DacDecoder.receptive_field_frames`). So once `right` frames past frame f have
arrived, frame f is final: decoding the window [f − left, f + right] gives the same numbers as decoding
the whole utterance (the zero padding at the window's edges only reaches samples that are thrown away).
Each push decodes one bounded window — `left` context + the newly final frames + `right` look-ahead — so the
cost per call does not grow with the history; the overhead over one-shot is (left + right) frames per push,
which is why the engine should push small first chunks and larger later ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from .model import Codec


class StreamDecoder:
    """Incremental decoder over one utterance: `push` frames as they are generated, `flush` at the end."""

    def __init__(self, codec: "Codec"):
        self.codec = codec
        self.left, self.right = codec.receptive_field_frames
        self._frames = torch.zeros(0, codec.num_quantizers, dtype=torch.long, device=codec.device)
        self._base = 0  # global index of self._frames[0]
        self.received = 0  # frames pushed so far
        self.emitted = 0  # frames whose samples have been returned
        self.finished = False

    @property
    def buffered(self) -> int:
        """Frames kept for future windows (at most left + right: the cost of a push is bounded)."""
        return self._frames.shape[0]

    def push(self, frames) -> np.ndarray:
        """Add frames [n, 8]; return the samples of every frame that no later frame can change any more
        (possibly none: the first `right` frames are held back as look-ahead)."""
        if self.finished:
            raise ValueError("this stream was flushed; start a new one with codec.stream()")
        frames = self.codec.check_codes(frames)
        self._frames = torch.cat([self._frames, frames])
        self.received += frames.shape[0]
        return self._emit(self.received - self.right)

    def flush(self) -> np.ndarray:
        """Return the samples of all frames not yet returned (the end of the utterance has no look-ahead)."""
        if self.finished:
            raise ValueError("this stream was already flushed")
        self.finished = True
        return self._emit(self.received)

    def _emit(self, end: int) -> np.ndarray:
        if end <= self.emitted:
            return np.zeros(0, dtype=np.float32)
        start = max(0, self.emitted - self.left)
        stop = min(self.received, end + self.right)
        wav = self.codec.decode_tensor(self._frames[start - self._base: stop - self._base])
        hop = self.codec.hop
        out = wav[(self.emitted - start) * hop: (end - start) * hop].cpu().numpy()
        self.emitted = end
        keep = max(0, self.emitted - self.left)  # older frames can never be in a window again
        self._frames = self._frames[keep - self._base:]
        self._base = keep
        return out
