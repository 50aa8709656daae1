"""The joins of a take made of segments (a long take, engine/longtake.py; a project's chapter,
studio/projects/library.py): pure numpy on float32 mono 24 kHz, no model.

Each segment's leading (after the first) and trailing silence is trimmed to `KEEP_SECONDS` around its
speech, its speech RMS matched to the take's first segment within ±`MAX_GAIN_DB`, `FADE_SECONDS`
raised-cosine fades put at both ends (so the step into and out of a pause is click-free), and its true peak
held under the take's ceiling (engine/peaks.py). The planned pause follows as exact silence, made in blocks
of at most SILENCE_BLOCK samples as it streams: a pause is never one array of its whole length.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .audio import MAX_PEAK
from .config import SAMPLE_RATE, SAMPLES_PER_FRAME
from .peaks import PeakLimiter

# Silence detection over 10 ms windows on a fixed grid from the segment start, with an absolute floor:
# the decision for a window never depends on audio after it, so the streamed first segment and the
# re-assembled take trim at exactly the same sample. -50 dBFS sits 30 dB under speech at the -20 dBFS the
# reference clips are normalised to (engine/audio.py TARGET_RMS). It is a chosen floor, not yet measured
# on the real model's pauses (only random weights here): measure the codec's silence level with the real
# checkpoint and set it just above.
WINDOW = SAMPLE_RATE // 100
SILENCE_DBFS = -50.0
KEEP_SECONDS = 0.04  # the decay kept around speech, as engine/audio.py TRIM_MARGIN_SECONDS
FADE_SECONDS = 0.005  # 120 samples: long enough that no step is audible, far shorter than a phoneme
MAX_GAIN_DB = 6.0
KEEP = int(KEEP_SECONDS * SAMPLE_RATE)
FADE = int(FADE_SECONDS * SAMPLE_RATE)
SILENCE_BLOCK = SAMPLE_RATE // 2  # samples of a pause made at once: 0.5 s, 48 KB of float32


def speech_bounds(audio: np.ndarray) -> tuple[int, int] | None:
    """[start, end) of the windows louder than SILENCE_DBFS, or None when the segment is silent."""
    loud = np.flatnonzero(_window_rms(audio) >= 10 ** (SILENCE_DBFS / 20))
    if not len(loud):
        return None
    return int(loud[0]) * WINDOW, min(len(audio), (int(loud[-1]) + 1) * WINDOW)


def _window_rms(audio: np.ndarray) -> np.ndarray:
    whole = len(audio) // WINDOW * WINDOW
    windows = audio[:whole].astype(np.float64).reshape(-1, WINDOW)
    rms = np.sqrt(np.mean(windows ** 2, axis=1))
    if whole < len(audio):
        rms = np.append(rms, np.sqrt(np.mean(audio[whole:].astype(np.float64) ** 2)))
    return rms


def speech_rms(audio: np.ndarray) -> float:
    """RMS of the windows that hold speech (silence would make a sparse segment look quiet)."""
    rms = _window_rms(audio)
    loud = rms[rms >= 10 ** (SILENCE_DBFS / 20)]
    return float(np.sqrt(np.mean(loud ** 2))) if len(loud) else 0.0


def shape_segment(audio: np.ndarray, *, trim_start: bool, reference_rms: float | None,
                  ceiling: bool = True) -> np.ndarray:
    """A segment's raw audio as it goes into the take: silence trimmed to KEEP_SECONDS (the start only when
    `trim_start`), gain to `reference_rms` within ±MAX_GAIN_DB and under MAX_PEAK (None: gain 1),
    raised-cosine fades at both ends and, with `ceiling`, its true peak under the ceiling (a long take
    passes False and limits the segment itself, to stream its first one and to read what the limiter took)."""
    first, last = speech_bounds(audio) or (0, 0)  # a silent segment keeps a KEEP_SECONDS stub
    start = max(0, first - KEEP) if trim_start else 0
    end = min(len(audio), last + KEEP)
    out = audio[start:end].astype(np.float32, copy=True)
    if reference_rms:
        limit = 10 ** (MAX_GAIN_DB / 20)
        gain = float(np.clip(reference_rms / max(speech_rms(out), 1e-12), 1 / limit, limit))
        peak = float(np.max(np.abs(out))) if len(out) else 0.0
        if peak * gain > MAX_PEAK:
            gain = MAX_PEAK / peak
        out *= np.float32(gain)
    n = min(FADE, len(out) // 2)
    if n:
        fade = ramp(n)
        out[:n] *= fade
        out[len(out) - n:] *= fade[::-1]
    return PeakLimiter().whole(out) if ceiling else out


def ramp(n: int) -> np.ndarray:
    """Raised-cosine fade-in of n samples (never exactly 0 or 1, so both ends move)."""
    return (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)


def anchor_frames(audio: np.ndarray, frames: int) -> slice:
    """Whole frames covering a segment's speech (all of them when it has none): the part of a zero-shot
    segment's codes that becomes the anchor of its speaker's later segments."""
    bounds = speech_bounds(audio)
    if bounds is None:
        return slice(0, frames)
    start = bounds[0] // SAMPLES_PER_FRAME
    end = min(frames, -(-bounds[1] // SAMPLES_PER_FRAME))
    return slice(start, max(end, start + 1))


def pause_samples(seconds: float) -> int:
    """The exact silence a pause of `seconds` puts after a segment, in samples."""
    return round(seconds * SAMPLE_RATE)


def silence_blocks(samples: int) -> Iterator[np.ndarray]:
    """`samples` of silence as consecutive blocks of at most SILENCE_BLOCK samples (none for 0)."""
    for start in range(0, samples, SILENCE_BLOCK):
        yield np.zeros(min(SILENCE_BLOCK, samples - start), np.float32)


__all__ = ["FADE", "FADE_SECONDS", "KEEP", "KEEP_SECONDS", "MAX_GAIN_DB", "SILENCE_BLOCK", "SILENCE_DBFS", "WINDOW",
           "anchor_frames", "pause_samples", "ramp", "shape_segment", "silence_blocks", "speech_bounds",
           "speech_rms"]
