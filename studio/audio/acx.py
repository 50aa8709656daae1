"""Audible's (ACX) submission rules, and the ACX export preset, for one chapter's samples.

* `acx_check(audio, rate)`: RMS −23…−18 dB, peak ≤ −3 dB (true peak, the stricter reading), noise floor
  ≤ −60 dB, room tone 0.5–1 s at the head and 1–5 s at the tail, each a pass/fail `Check` of an `AcxReport`
  (`render.acx_html` shows it). A project calls it with a chapter's float32 samples.
* `export(audio, rate, "acx")`: the preset applied to one chapter: speech trimmed, room tone added at the
  head and the tail, levelled to −20 dB RMS under −3.5 dBTP (studio/audio/loudness.py), 192 kbps CBR MP3 at
  44.1 kHz through ffmpeg.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import asdict, dataclass

import numpy as np

from studio.audio.formats import FormatError, ffmpeg_path, pcm_input_command, to_pcm16
from studio.audio.loudness import SILENCE_DB, level_to, rms_db, round_or_none, to_db, true_peak

ACX_RMS = (-23.0, -18.0)  # dB RMS
ACX_PEAK = -3.0  # dB
ACX_NOISE_FLOOR = -60.0  # dB RMS
ACX_HEAD = (0.5, 1.0)  # seconds of room tone before the first word
ACX_TAIL = (1.0, 5.0)  # and after the last
NOISE_WINDOW_S = 0.5  # the noise floor: the RMS of the quietest half second
FRAME_S = 0.02  # room tone is where 20 ms frames stay under the speech threshold
SPEECH_OVER_FLOOR_DB = 20.0
SPEECH_UNDER_LOUD_DB = 30.0
SPEECH_MIN_DB = -50.0


@dataclass(frozen=True)
class Check:
    """One line of a report: what was measured, the rule, pass or fail."""

    name: str
    value: float | None
    unit: str
    rule: str
    passed: bool


@dataclass(frozen=True)
class AcxReport:
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def as_dict(self) -> dict:
        return {"passed": self.passed, "failed": self.failed,
                "checks": [{**asdict(c), "value": round_or_none(c.value)} for c in self.checks]}


def _frame_db(audio: np.ndarray, rate: int, frame_s: float, hop_s: float) -> np.ndarray:
    """RMS in dB of windows of `frame_s` every `hop_s` (one window for shorter audio)."""
    size, hop = max(1, int(rate * frame_s)), max(1, int(rate * hop_s))
    if audio.size <= size:
        return np.array([rms_db(audio)])
    squares = np.concatenate([[0.0], np.cumsum(audio ** 2)])
    starts = np.arange(0, audio.size - size + 1, hop)
    mean = (squares[starts + size] - squares[starts]) / size
    return 10.0 * np.log10(np.maximum(mean, 10.0 ** (SILENCE_DB / 10.0)))  # digital silence reads SILENCE_DB


def noise_floor_db(audio: np.ndarray, rate: int) -> float:
    """The RMS of the quietest NOISE_WINDOW_S of `audio` (hop 50 ms), in dB."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    return float(_frame_db(audio, rate, NOISE_WINDOW_S, 0.05).min()) if audio.size else -math.inf


def speech_bounds(audio: np.ndarray, rate: int, floor: float | None = None) -> tuple[float, float] | None:
    """(start, end) in seconds of what is louder than room tone: 20 ms frames over SPEECH_MIN_DB and either
    SPEECH_OVER_FLOOR_DB over the noise floor (`floor`, when the caller has measured it) or within
    SPEECH_UNDER_LOUD_DB of the loud frames (a take with no half second of quiet has a "floor" that is
    speech). None when nothing is."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    if audio.size == 0:
        return None
    frames = _frame_db(audio, rate, FRAME_S, FRAME_S)
    loud = float(np.percentile(frames, 95)) - SPEECH_UNDER_LOUD_DB
    floor = noise_floor_db(audio, rate) if floor is None else floor
    threshold = max(SPEECH_MIN_DB, min(floor + SPEECH_OVER_FLOOR_DB, loud))
    loud = np.flatnonzero(frames > threshold)
    if loud.size == 0:
        return None
    return float(loud[0] * FRAME_S), float(min(audio.size / rate, (loud[-1] + 1) * FRAME_S))


def acx_check(audio: np.ndarray, rate: int, *, peak_db: float | None = None) -> AcxReport:
    """ACX's rules for one chapter file, each a pass/fail `Check` (`report.failed` names the lines that fail).
    `peak_db`: the true peak in dB when the caller has measured it already (studio/audio/loudness.py `measure`)."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    seconds = audio.size / rate
    rms, floor = rms_db(audio), noise_floor_db(audio, rate)
    peak = to_db(true_peak(audio)) if peak_db is None else peak_db
    bounds = speech_bounds(audio, rate, floor)
    head, tail = (bounds[0], seconds - bounds[1]) if bounds is not None else (None, None)

    def finite(value: float) -> float:
        return value if math.isfinite(value) else SILENCE_DB

    def within(value, low, high) -> bool:
        return value is not None and bool(low <= value <= high)

    return AcxReport((
        Check("rms", finite(rms), "dB", f"{ACX_RMS[0]:g} to {ACX_RMS[1]:g} dB RMS", within(rms, *ACX_RMS)),
        Check("peak", finite(peak), "dBTP", f"at most {ACX_PEAK:g} dB (true peak)", bool(peak <= ACX_PEAK)),
        Check("noise_floor", finite(floor), "dB", f"at most {ACX_NOISE_FLOOR:g} dB RMS (quietest 0.5 s)",
              bool(floor <= ACX_NOISE_FLOOR)),
        Check("head_room_tone", head, "s", f"{ACX_HEAD[0]:g} to {ACX_HEAD[1]:g} s before the first word",
              within(head, *ACX_HEAD)),
        Check("tail_room_tone", tail, "s", f"{ACX_TAIL[0]:g} to {ACX_TAIL[1]:g} s after the last word",
              within(tail, *ACX_TAIL)),
    ))


# ----------------------------------------------------------------------------------------------- export

@dataclass(frozen=True)
class ExportPreset:
    """How a chapter leaves the studio: levels, room tone and the file's format."""

    name: str
    format: str
    bitrate_kbps: int
    sample_rate: int
    rms_db: float  # the whole file's RMS
    ceiling_db: float  # true peak
    head_s: float  # room tone before the first word
    tail_s: float  # and after the last
    room_tone_db: float  # RMS of the room tone added


EXPORT_PRESETS = {
    # ACX: 192 kbps CBR MP3 at 44.1 kHz, one file per chapter; −20 dB RMS and −3.5 dBTP sit inside its
    # −23…−18 dB and −3 dB with room to spare for the MP3 encoder's own overshoot.
    "acx": ExportPreset("acx", "mp3", 192, 44100, rms_db=-20.0, ceiling_db=-3.5, head_s=0.75, tail_s=2.0,
                        room_tone_db=-70.0),
}


@dataclass(frozen=True)
class MasteredExport:
    data: bytes  # the encoded file
    mime: str
    audio: np.ndarray  # the mastered samples at the input's rate, before encoding
    report: AcxReport  # the ACX check of `audio`


def room_tone(seconds: float, rate: int, level_db: float, seed: int = 0) -> np.ndarray:
    """Quiet, steady noise at `level_db` RMS: what a recording's pauses sound like (ACX refuses digital
    silence between chapters' words as much as a noisy room). Seeded, so an export is reproducible."""
    noise = np.random.default_rng(seed).standard_normal(round(seconds * rate))
    return noise * (10.0 ** (level_db / 20.0))


def master(audio: np.ndarray, rate: int, preset: ExportPreset) -> np.ndarray:
    """`audio` with its own leading and trailing quiet cut, levelled so the whole file (room tone included)
    reads `preset.rms_db` under `preset.ceiling_db`, with the preset's room tone at the head and the tail."""
    audio = np.asarray(audio, dtype=np.float64).reshape(-1)
    bounds = speech_bounds(audio, rate)
    if bounds is None:
        raise ValueError("The chapter has no speech to export (it is silent).")
    speech = audio[int(bounds[0] * rate):math.ceil(bounds[1] * rate)]
    head = room_tone(preset.head_s, rate, preset.room_tone_db, seed=1)
    tail = room_tone(preset.tail_s, rate, preset.room_tone_db, seed=2)
    tone_energy, total = float(np.sum(head ** 2) + np.sum(tail ** 2)), speech.size + head.size + tail.size

    def file_rms(body: np.ndarray) -> float | None:  # the whole file's RMS once the room tone is around `body`
        energy = float(np.sum(body ** 2)) + tone_energy
        return to_db(math.sqrt(energy / total)) if energy > 0 else None

    levelled, _, _ = level_to(speech, rate, file_rms, preset.rms_db, preset.ceiling_db)
    return np.concatenate([head, levelled, tail]).astype(np.float32)


def export(audio: np.ndarray, rate: int, preset: str = "acx") -> MasteredExport:
    """One chapter through an export preset (`EXPORT_PRESETS`): mastered, checked and encoded with ffmpeg
    (constant bit rate, resampled to the preset's rate). Raises ValueError for an unknown preset or a
    silent chapter, FormatError when ffmpeg is missing or fails."""
    if preset not in EXPORT_PRESETS:
        raise ValueError(f"Unknown export preset {preset!r}; choose one of {', '.join(EXPORT_PRESETS)}.")
    spec = EXPORT_PRESETS[preset]
    mastered = master(audio, rate, spec)
    if ffmpeg_path() is None:
        raise FormatError("The ACX export needs ffmpeg (MP3), which is not on PATH; install it.")
    cmd = [*pcm_input_command(rate, preset), "-ar", str(spec.sample_rate), "-c:a", "libmp3lame",
           "-b:a", f"{spec.bitrate_kbps}k", "-f", spec.format, "pipe:1"]  # -b:a without -q/-abr: constant bit rate
    proc = subprocess.run(cmd, input=to_pcm16(mastered).tobytes(), capture_output=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise FormatError(f"ffmpeg could not encode the {preset} export: "
                          f"{proc.stderr.decode(errors='replace').strip()}")
    return MasteredExport(proc.stdout, "audio/mpeg", mastered, acx_check(mastered, rate))


__all__ = ["EXPORT_PRESETS", "AcxReport", "Check", "MasteredExport", "ExportPreset", "acx_check", "export", "master",
           "noise_floor_db", "room_tone", "speech_bounds"]
