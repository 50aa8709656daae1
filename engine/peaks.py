"""True peaks and the look-ahead limiter that holds every take under a ceiling (pure numpy/scipy, no model).

* `sample_peaks` / `true_peak`: the signal oversampled 4× with a polyphase filter, as ITU-R BS.1770-4
  Annex 2 asks, so the peaks between samples count (a DAC or an MP3 encoder makes them real).
* `limit`: a look-ahead peak limiter over a whole signal; `PeakLimiter` is the same for audio that
  streams by: a sample leaves once the samples its gain depends on have arrived (HOLD_SECONDS later), so
  what has been sent never needs another gain. Every take passes one on its way out (the long take's
  segments, engine/joins.py; a single take, studio/takes/service.py), so no take leaves over PEAK_CEILING_DB,
  whatever the model made: the demo's random weights make +2 to +8 dBTP.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import minimum_filter1d, uniform_filter1d
from scipy.signal import resample_poly

from .config import SAMPLE_RATE

PEAK_CEILING_DB = -1.0  # dBTP: every take's true-peak ceiling (EBU R128's and the podcast platforms')
# The limiter aims this far under the ceiling: its gain moves between samples too, which the per-sample need
# cannot see. Without it, noise at up to +12 dBTP and tones up to 11 kHz came out ≤ 0.001 dB over.
PEAK_MARGIN_DB = 0.01
OVERSAMPLE = 4  # BS.1770-4 Annex 2's true-peak meter oversamples 4×
PEAK_BLOCK = 1 << 20  # samples oversampled at once (~44 s at 24 kHz)
PEAK_CONTEXT = 64  # samples of context each side of a block: the polyphase filter reaches 10 input samples
LOOKAHEAD_S = 0.005  # the limiter starts turning down 5 ms before a peak and lets go 5 ms after


def to_db(linear: float) -> float:
    """Linear amplitude → dB (−inf for 0)."""
    return 20.0 * math.log10(linear) if linear > 0 else -math.inf


def sample_peaks(audio: np.ndarray) -> np.ndarray:
    """Per sample, the largest absolute value of `audio` oversampled 4× between it and the next sample (the
    sample itself included). Oversampled a block at a time with PEAK_CONTEXT samples of context on each side,
    so a long take never holds 4× its length."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    n = audio.size
    peaks = np.abs(audio)
    for start in range(0, n, PEAK_BLOCK):
        lo, end = max(0, start - PEAK_CONTEXT), min(n, start + PEAK_BLOCK)
        hi = min(n, end + PEAK_CONTEXT)
        up = np.abs(resample_poly(audio[lo:hi], OVERSAMPLE, 1))[(start - lo) * OVERSAMPLE:(end - lo) * OVERSAMPLE]
        peaks[start:end] = np.maximum(peaks[start:end], up.reshape(end - start, OVERSAMPLE).max(axis=1))
    return peaks


def true_peak(audio: np.ndarray) -> float:
    """The largest absolute value of `audio` oversampled 4× (linear; the samples themselves count too)."""
    peaks = sample_peaks(audio)
    return float(peaks.max()) if peaks.size else 0.0


def _half_widths(rate: int) -> tuple[int, int]:
    """The limiter's two filters' half-widths in samples: the running minimum's (the look-ahead) and the
    smoothing average's (half of it)."""
    w = max(1, int(rate * LOOKAHEAD_S))
    return w, w // 2


def _gain(peaks: np.ndarray, rate: int, ceiling_db: float) -> np.ndarray | None:
    """The limiter's gain per sample (None: nothing is over the ceiling). A running minimum of the needed
    gain over ±w, then averaged over ±w/2: each average covers only minima that include the peak's own
    need, so no peak escapes, and the gain never jumps."""
    need = np.minimum(1.0, 10.0 ** (ceiling_db / 20.0) / np.maximum(peaks, 1e-12))
    if need.min() >= 1.0:
        return None
    w, h = _half_widths(rate)
    gain = minimum_filter1d(need, 2 * w + 1, mode="nearest")
    return np.minimum(uniform_filter1d(gain, 2 * h + 1, mode="nearest"), 1.0)


def limit(audio: np.ndarray, rate: int, ceiling_db: float, peaks: np.ndarray | None = None) -> np.ndarray:
    """A look-ahead peak limiter: every oversampled peak over `ceiling_db` is taken down to it, the gain
    easing in and out over LOOKAHEAD_S. `peaks`: `sample_peaks(audio)` when the caller has them."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    if audio.size == 0:
        return audio
    gain = _gain(sample_peaks(audio) if peaks is None else peaks, rate, ceiling_db)
    return audio if gain is None else audio * gain


def peak_ceiling(cut_db: float) -> dict:
    """What a take's recipe says of the ceiling: `{"peak_ceiling": {"dbtp": …, "gain_db": …}}` when the
    limiter cut (`cut_db` < 0, its deepest cut), else nothing."""
    return {"peak_ceiling": {"dbtp": PEAK_CEILING_DB, "gain_db": round(cut_db, 2)}} if cut_db < 0 else {}


class PeakLimiter:
    """`limit` at `ceiling_db` − PEAK_MARGIN_DB for audio that arrives in pieces: `feed` returns the samples
    that are final (all but the last `hold`), `flush` the rest at the end. A sample's gain depends on the
    peaks within the filters' reach of it, and a peak on PEAK_CONTEXT samples around it, so each release
    recomputes only the held samples with that much context kept from before: the output is `limit` of the
    whole stream, to rounding. `gain_db` is the deepest cut made so far (0.0: it never acted)."""

    def __init__(self, rate: int = SAMPLE_RATE, ceiling_db: float = PEAK_CEILING_DB):
        self.rate, self.target_db = rate, ceiling_db - PEAK_MARGIN_DB
        self.hold = sum(_half_widths(rate)) + PEAK_CONTEXT  # ~10 ms at 24 kHz
        self.gain_db = 0.0
        self._sent = np.zeros(0)  # the last `hold` samples released, as they came: the next ones' context
        self._held = np.zeros(0)

    def feed(self, audio: np.ndarray) -> np.ndarray:
        self._held = np.concatenate([self._held, np.asarray(audio, dtype=np.float64).reshape(-1)])
        return self._release(self._held.size - self.hold)

    def flush(self) -> np.ndarray:
        """Everything still held (the stream has ended: its last samples need no more context)."""
        return self._release(self._held.size)

    def whole(self, audio: np.ndarray) -> np.ndarray:
        """`audio` as one stream of its own, fed and flushed (the limiter must be fresh)."""
        return np.concatenate([self.feed(audio), self.flush()])

    def _release(self, n: int) -> np.ndarray:
        if n <= 0:
            return np.zeros(0, np.float32)
        window = np.concatenate([self._sent, self._held])
        at = self._sent.size
        gain = _gain(sample_peaks(window), self.rate, self.target_db)
        out = self._held[:n]
        if gain is not None:
            gain = gain[at:at + n]
            out = out * gain
            self.gain_db = min(self.gain_db, to_db(float(gain.min())))
        self._sent = window[max(0, at + n - self.hold):at + n]
        self._held = self._held[n:]
        return out.astype(np.float32)


__all__ = ["LOOKAHEAD_S", "OVERSAMPLE", "PEAK_BLOCK", "PEAK_CEILING_DB", "PEAK_CONTEXT", "PEAK_MARGIN_DB",
           "PeakLimiter", "limit", "peak_ceiling", "sample_peaks", "to_db", "true_peak"]
