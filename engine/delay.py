"""The delay pattern, the stop rule and the length guards (SPEC D5, Part 2 §4, §5.2, §5.5).

The model emits *rows*: codebook k of row r holds frame r − k, so the 8 codebooks of one frame are
spread over 8 consecutive rows and a take of T frames needs T + 7 rows. Everything here is pure
host-side bookkeeping on small integer arrays; nothing touches the model.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .config import FRAME_RATE
from .tokenizer import estimate_seconds
from .types import DEFAULT_REPEAT_GUARD, check_max_frames, check_repeat_guard

# Length cap when the caller gives none (SPEC D5): never more rows than the references allow
# (SG `max_new_tokens` 2048 ≈ 81.6 s), never less than a few seconds.
MAX_ROWS = 2048
MIN_AUTO_SECONDS = 4.0
# The automatic cap allows 3× the speaking-rate estimate (slow styles, pauses, sfx).
CAP_FACTOR = 3.0


def _as_long(x) -> torch.Tensor:
    return x.long() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x), dtype=torch.long)


def apply_delay(codes, boc: int, eoc: int) -> torch.Tensor:
    """Frames [T, K] → delayed rows [T + K − 1, K]:
    `rows[r, k] = BOC if r < k; codes[r − k, k] if k ≤ r < k + T; EOC after` (SG `apply_delay_pattern`).
    This is the layout of a reference clip inside a voice-clone prompt."""
    codes = _as_long(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be [frames, codebooks], got shape {tuple(codes.shape)}")
    frames, books = codes.shape
    rows = torch.full((frames + books - 1, books), eoc, dtype=torch.long)
    for k in range(books):
        rows[:k, k] = boc
        rows[k:k + frames, k] = codes[:, k]
    return rows


def undelay(rows, codebook_size: int = 1024) -> torch.Tensor:
    """Delayed rows [R, K] → frames [R − K + 1, K] with `frames[t, k] = rows[t + k, k]`; any value that
    is not a codec code (BOC, EOC, or negative) becomes 0 — never clamp: 1025 → 1023 would be a real code."""
    rows = _as_long(rows)
    if rows.ndim != 2:
        raise ValueError(f"rows must be [rows, codebooks], got shape {tuple(rows.shape)}")
    count, books = rows.shape
    frames = max(count - books + 1, 0)
    out = torch.empty((frames, books), dtype=torch.long)
    for k in range(books):
        out[:, k] = rows[k:k + frames, k]
    out[(out >= codebook_size) | (out < 0)] = 0
    return out


def default_max_frames(text: str) -> int:
    """Length cap for a take when the caller gives none: 25 frames/s over 3× the speaking-rate estimate
    of the text (`tokenizer.estimate_seconds`, the same estimate the studio shows), at least a few
    seconds, and never more than MAX_ROWS rows."""
    seconds = max(MIN_AUTO_SECONDS, CAP_FACTOR * estimate_seconds(text))
    return min(math.ceil(seconds * FRAME_RATE), MAX_ROWS - 7)


@dataclass
class StopRule:
    """The SGLang-Omni per-row state machine (SPEC D5, Part 2 §5.2), plus the length cap and the
    repeated-code guard.

    `push(row)` takes the codes sampled at step s (one per codebook), forces the codebooks k > s to BOC
    while the delay window is open, and returns the row to emit and feed back. `stop_reason` is set
    once the take is over: "eoc" (cb0 EOC at a step ≥ K, then K − 2 more rows: rows = t + K − 1,
    frames = t), "max_frames" (rows = max_frames + K − 1, nothing forced at the cap) or
    "repeat_guard" (the last `repeat_guard` frames are identical; None disables it)."""

    codebooks: int = 8
    boc: int = 1024
    eoc: int = 1025
    max_frames: int | None = None
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD
    step: int = 0
    countdown: int | None = None
    stop_reason: str | None = None
    _frames: list = field(default_factory=list, repr=False)
    _rows: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        # The same checks as SamplingParams', without its MAX_FRAMES: a long take's row budget may pass it.
        self.max_frames = check_max_frames(self.max_frames, limit=None)
        self.repeat_guard = check_repeat_guard(self.repeat_guard)

    @property
    def delay(self) -> int:
        return self.codebooks - 1

    @property
    def max_rows(self) -> int | None:
        return None if self.max_frames is None else self.max_frames + self.delay

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def force(self, row: list[int]) -> list[int]:
        """The delay window: at step s only codebooks k ≤ s are real."""
        s = self.step
        return [c if k <= s else self.boc for k, c in enumerate(row)]

    def push(self, row) -> list[int]:
        if self.done:
            raise RuntimeError("push() after the take has stopped")
        row = self.force([int(c) for c in row])
        s = self.step
        if self.countdown is not None:
            self.countdown -= 1
        elif s >= self.codebooks and row[0] == self.eoc:
            self.countdown = self.codebooks - 2
        self._rows.append(row)
        self.step += 1
        if self.step >= self.codebooks:  # frame step − K is now complete
            t = self.step - self.codebooks
            frame = tuple(self._rows[t + k][k] for k in range(self.codebooks))
            self._frames.append(tuple(c if 0 <= c < self.boc else 0 for c in frame))
        if self.countdown == 0:
            self.stop_reason = "eoc"
        elif self.max_rows is not None and self.step >= self.max_rows:
            self.stop_reason = "max_frames"
        elif self._repeating():
            self.stop_reason = "repeat_guard"
        return row

    def _repeating(self) -> bool:
        n = self.repeat_guard
        if n is None or len(self._frames) < n or self.countdown is not None:
            return False
        last = self._frames[-1]
        return all(f == last for f in self._frames[-n:])

    @property
    def rows(self) -> list[list[int]]:
        return self._rows

    @property
    def complete_frames(self) -> int:
        """Frames whose 8 codes all exist (frame t is complete once row t + K − 1 exists). After an
        EOC stop only t frames count: the later ones are wind-down, dropped by the de-delay."""
        n = max(len(self._rows) - self.delay, 0)
        return n


def codes_sha256(codes: torch.Tensor) -> str:
    """Fingerprint of a take's frames (int16 little-endian, row-major): equal fingerprints mean the same
    codes, so two engines (in process, over HTTP) can be compared without float-rounding noise."""
    return hashlib.sha256(np.ascontiguousarray(torch.as_tensor(codes).cpu().numpy(), dtype="<i2").tobytes()).hexdigest()
