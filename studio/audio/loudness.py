"""Loudness to a standard: measured and normalised (studio/audio/acx.py checks it against ACX and exports it).

* `measure(audio, rate)`: integrated loudness (ITU-R BS.1770-4 through `pyloudnorm`: K-weighting, 400 ms
  blocks, the −70 LUFS and relative gates) and the true peak (engine/peaks.py: 4× oversampled with a
  polyphase filter, as BS.1770 Annex 2 asks, so peaks between samples count). `LoudnessMeter` reads the
  same of audio that streams by and is not kept.
* `normalize(audio, rate, target)`: gain to a target (`TARGETS`: −16 LUFS podcast, −18 audiobook,
  −23 broadcast) under a true-peak ceiling. Where the gain would push peaks over it, the look-ahead peak
  limiter every take passes (engine/peaks.py) takes them down, and the gain is corrected for what the
  limiter took (a few rounds), so the take lands on the target rather than below it.

All pure numpy/scipy on float32 mono; nothing here knows about takes or pages.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyloudnorm
from scipy.signal import lfilter, resample_poly

from engine.peaks import OVERSAMPLE, PEAK_CEILING_DB, PEAK_CONTEXT, limit, sample_peaks, to_db, true_peak

TARGETS = {"podcast": -16.0, "audiobook": -18.0, "broadcast": -23.0}  # LUFS; "off" (None) leaves a take as made
TARGET_RANGE = (-40.0, -5.0)
DEFAULT_CEILING = PEAK_CEILING_DB  # dBTP: a loudness target's ceiling, unless asked otherwise, is every take's
CEILING_RANGE = (-9.0, 0.0)
ROUNDS = 5  # gain / limit / measure rounds at most; each corrects the gain by what the limiter took
TOLERANCE_LU = 0.05
SILENCE_DB = -120.0  # what a level of digital silence reads as, in reports
ABSOLUTE_GATE = -70.0  # LUFS: BS.1770-4's absolute gate


@dataclass(frozen=True)
class Loudness:
    """A take's levels: integrated loudness in LUFS (None when shorter than one 400 ms block or silent) and
    true peak in dBTP (None for silence)."""

    lufs: float | None
    true_peak_db: float | None

    def as_dict(self) -> dict:
        return {"lufs": round_or_none(self.lufs), "true_peak_dbtp": round_or_none(self.true_peak_db)}


def round_or_none(value: float | None) -> float | None:
    """Two decimals for reports; None stays None."""
    return None if value is None else round(value, 2)


def integrated_lufs(audio: np.ndarray, rate: int) -> float | None:
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    meter = pyloudnorm.Meter(rate)
    if audio.size < int(meter.block_size * rate) + 1:
        return None
    value = meter.integrated_loudness(audio)
    return float(value) if math.isfinite(value) else None


def measure(audio: np.ndarray, rate: int) -> Loudness:
    peak = true_peak(audio)
    return Loudness(integrated_lufs(audio, rate), to_db(peak) if peak > 0 else None)


def _window_peak(chunk: np.ndarray, begin: int, end: int) -> float:
    """The true peak of `chunk[begin:end]`, the samples around it the oversampling filter's context."""
    up = np.abs(resample_poly(chunk, OVERSAMPLE, 1))[begin * OVERSAMPLE:end * OVERSAMPLE]
    return max(float(up.max()), float(np.abs(chunk[begin:end]).max()))


class LoudnessMeter:
    """`measure` for audio that arrives in pieces and is not kept (a streamed long take): pyloudnorm's own
    K-weighting filters run with their state carried from piece to piece, the energy of every 100 ms hop is
    kept (400 ms blocks start every 100 ms), and the BS.1770-4 gates run over them at the end, as
    `pyloudnorm.Meter.integrated_loudness` does over a whole signal; the true peak reads each piece once the
    next PEAK_CONTEXT samples have arrived. Memory: one float per 100 ms. (The filters are pyloudnorm's
    private `_filters`: the version is pinned.)"""

    def __init__(self, rate: int):
        meter = pyloudnorm.Meter(rate)
        self.rate, self._block = rate, meter.block_size
        self._stages = [(f.passband_gain, f.b, f.a, np.zeros(max(len(f.a), len(f.b)) - 1))
                        for f in meter._filters.values()]
        self._hop = round(rate * meter.block_size * (1 - meter.overlap))
        self._hops: list[float] = []  # the K-weighted sum of squares of every whole hop
        self._partial, self._partial_n, self._samples = 0.0, 0, 0
        self._left, self._pending, self._peak = np.zeros(0), np.zeros(0), 0.0

    def feed(self, audio: np.ndarray) -> None:
        x = np.asarray(audio, dtype=np.float64).reshape(-1)
        if x.size == 0:
            return
        self._samples += x.size
        self._pending = np.concatenate([self._pending, x])
        self._read_peaks()
        y = x
        for i, (gain, b, a, state) in enumerate(self._stages):
            y, state = lfilter(b, a, y, zi=state)
            self._stages[i] = (gain, b, a, state)
            y = gain * y
        squares, pos, need = y ** 2, 0, self._hop - self._partial_n
        while squares.size - pos >= need:  # close the open hop, then every whole hop of this piece
            self._hops.append(self._partial + float(squares[pos:pos + need].sum()))
            pos, need, self._partial, self._partial_n = pos + need, self._hop, 0.0, 0
        self._partial += float(squares[pos:].sum())
        self._partial_n += squares.size - pos

    def _read_peaks(self) -> None:
        """The true peak of the pending samples that have PEAK_CONTEXT samples after them."""
        if self._pending.size <= PEAK_CONTEXT:
            return
        chunk = np.concatenate([self._left, self._pending])
        end = chunk.size - PEAK_CONTEXT
        self._peak = max(self._peak, _window_peak(chunk, self._left.size, end))
        self._left, self._pending = chunk[max(0, end - PEAK_CONTEXT):end], chunk[end:]

    def result(self) -> Loudness:
        """The levels of everything fed so far (the meter can go on being fed)."""
        chunk = np.concatenate([self._left, self._pending])
        peak = max(self._peak, _window_peak(chunk, self._left.size, chunk.size)) if self._pending.size else self._peak
        true_peak_db = to_db(peak) if peak > 0 else None
        seconds = self._samples / self.rate
        if self._samples < int(self._block * self.rate) + 1:
            return Loudness(None, true_peak_db)
        hops = self._hops + ([self._partial] if self._partial_n else [])  # the last block may end in the open hop
        per_block = round(self._block * self.rate / self._hop)
        count = int(np.round((seconds - self._block) / (self._hop / self.rate))) + 1  # pyloudnorm's block count
        z = np.array([sum(hops[j:j + per_block]) for j in range(count)]) / (self._block * self.rate)
        with np.errstate(divide="ignore"):
            levels = -0.691 + 10.0 * np.log10(z)
        gated = z[levels >= ABSOLUTE_GATE]
        if gated.size == 0:
            return Loudness(None, true_peak_db)
        relative = -0.691 + 10.0 * np.log10(gated.mean()) - 10.0
        kept = z[(levels > relative) & (levels > ABSOLUTE_GATE)]
        value = -0.691 + 10.0 * np.log10(kept.mean()) if kept.size else -math.inf
        return Loudness(float(value) if math.isfinite(value) else None, true_peak_db)


def rms_db(audio: np.ndarray) -> float:
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    return to_db(float(np.sqrt(np.mean(audio ** 2)))) if audio.size else -math.inf


def resolve_target(value) -> float | None:
    """A target as asked: a name of `TARGETS`, a number of LUFS, or "off" / None → None (no normalisation)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return None
    if isinstance(value, str):
        key = value.strip().lower()
        if key in TARGETS:
            return TARGETS[key]
        try:
            value = float(key)
        except ValueError:
            raise ValueError(f"Loudness target {value!r} is not one of off, {', '.join(TARGETS)} or a number of "
                             "LUFS such as -18.") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("The loudness target must be a name (podcast, audiobook, broadcast), off, or LUFS.")
    low, high = TARGET_RANGE
    if not low <= float(value) <= high:
        raise ValueError(f"The loudness target must be between {low:g} and {high:g} LUFS (got {value:g}).")
    return float(value)


def check_ceiling(value: float) -> float:
    low, high = CEILING_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise ValueError(f"The true-peak ceiling must be between {low:g} and {high:g} dBTP (got {value!r}).")
    return float(value)


@dataclass(frozen=True)
class Normalized:
    """A normalised take: its samples, its levels before and after, the gain applied (dB, before limiting)
    and whether the limiter had to act."""

    audio: np.ndarray
    before: Loudness
    after: Loudness
    gain_db: float
    limited: bool
    target: float | None

    def as_dict(self) -> dict:
        return {"target_lufs": self.target, "gain_db": round(self.gain_db, 2), "limited": self.limited,
                "before": self.before.as_dict(), "after": self.after.as_dict()}


def level_to(audio: np.ndarray, rate: int, level: Callable[[np.ndarray], float | None], target: float,
             ceiling_db: float) -> tuple[np.ndarray, float, bool]:
    """`audio` scaled so `level(audio)` is `target`, peaks held under `ceiling_db`: gain, limit, measure
    again, correct the gain by the miss; the last step scales down if a peak still pokes over."""
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    start = level(x)
    if start is None:
        return x, 0.0, False
    gain_db, y, limited = target - start, x, False
    peaks = sample_peaks(x)  # oversampled once: the oversampling is linear, so a gain scales the peaks
    for _ in range(ROUNDS):
        factor = 10.0 ** (gain_db / 20.0)
        scaled = x * factor
        y = limit(scaled, rate, ceiling_db - 0.05, peaks * factor)
        limited = limited or not np.array_equal(y, scaled)
        reached = level(y)
        if reached is None or abs(reached - target) <= TOLERANCE_LU:
            break
        gain_db += target - reached
    peak = true_peak(y)
    ceiling = 10.0 ** (ceiling_db / 20.0)
    if peak > ceiling:
        y = y * (ceiling / peak)
    return y, gain_db, limited


def normalize(audio: np.ndarray, rate: int, target, ceiling_db: float = DEFAULT_CEILING) -> Normalized:
    """`audio` at `target` LUFS (see `resolve_target`; None leaves it as it is) with its true peak at or under
    `ceiling_db`. Too short or silent audio has no loudness to set and comes back unchanged."""
    target = resolve_target(target)
    ceiling_db = check_ceiling(ceiling_db)
    before = measure(audio, rate)
    if target is None or before.lufs is None:
        out = np.asarray(audio, dtype=np.float32)
        return Normalized(out, before, before, 0.0, False, target)
    y, gain_db, limited = level_to(audio, rate, lambda a: integrated_lufs(a, rate), target, ceiling_db)
    out = y.astype(np.float32)
    return Normalized(out, before, measure(out, rate), gain_db, limited, target)


__all__ = ["DEFAULT_CEILING", "TARGETS", "Loudness", "LoudnessMeter", "Normalized", "check_ceiling", "level_to",
           "limit", "measure", "normalize", "resolve_target", "rms_db", "round_or_none", "to_db", "true_peak"]
