"""Reference-clip preparation for voice cloning (SPEC D7, Part 2 §6.2).

Whatever the user hands us (a path, raw bytes, a file object, Gradio's `(sr, ndarray)` tuple) becomes
the one form the codec encoder wants: float32 mono at 24 kHz, leading/trailing silence trimmed, a
sane length, a sensible level, and zero-padded at the end to a whole number of 960-sample frames.
The padding is not cosmetic: with `len % 960 == 0` both encoder branches agree on T = len/960 and the
transformers re-pad path (480 zeros a side) never runs (SPEC Part 2 §7.3).

Every rejection is a `ReferenceAudioError` whose message says what is wrong and what to do, because
the studio and the HTTP API show it to the user as is.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
import soxr  # librosa's own resampler (a librosa dependency); imported directly to skip librosa's start-up cost

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME

log = logging.getLogger("higgs.audio")

# Trimming: frames quieter than peak − TRIM_TOP_DB count as silence (the Higgs ComfyUI node uses −42 dB).
TRIM_TOP_DB = 40.0
TRIM_FRAME_SECONDS = 0.02
TRIM_HOP_SECONDS = 0.005
# Kept on each side of the detected sound, so soft onsets (/s/, /h/) and release tails survive the trim.
TRIM_MARGIN_SECONDS = 0.04
# A side is trimmed only when it holds more silence than this. Besides sparing clips that are already
# tight, it makes preparation idempotent: a prepared clip (margin + < 1 frame of padding) passes through
# unchanged, so code that prepares again before encoding encodes exactly the stored samples.
TRIM_MIN_SECONDS = 0.1
# A clip whose loudest sample is below −60 dBFS holds nothing the encoder can use.
SILENCE_PEAK = 10 ** (-60 / 20)
# Loudness: bring the speech (non-silent frames) to −20 dBFS RMS, but never let the peak pass 0.95.
TARGET_RMS = 10 ** (-20 / 20)
MAX_PEAK = 0.95
# Gains smaller than this are not applied (inaudible, and keeps preparation idempotent), unless the
# peak is over MAX_PEAK.
GAIN_TOLERANCE_DB = 0.5
# Decoding is bounded by work, not by duration: a 56 KB FLAC of silence can claim 8 channels at 192 kHz for
# minutes, and decoding it whole took 0.9 GB. So the header is checked against a sample budget before any
# decoding, the file is decoded in blocks that are mixed down to mono as they arrive, and a running count
# stops a container that lied about its length. Memory stays O(MAX_DECODE_SAMPLES) whatever the file claims.
MAX_DECODE_SAMPLES = 120 * 48_000  # mono samples: 2 minutes at 48 kHz (23 MB as float32)
MAX_CHANNELS = 32
DECODE_BLOCK = 1 << 16  # frames per block (8 channels: 2 MB of float32)


class ReferenceAudioError(ValueError):
    """The reference clip cannot be used; the message tells the user why and what to do."""


@dataclass(frozen=True)
class PreparedReference:
    """A clip ready for the codec encoder: float32 mono 24 kHz, `len(wav) % SAMPLES_PER_FRAME == 0`."""

    wav: np.ndarray
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def frames(self) -> int:
        """Codec frames the encoder will produce for this clip (T = len/960)."""
        return len(self.wav) // SAMPLES_PER_FRAME


AudioSource = str | os.PathLike | bytes | bytearray | memoryview | BinaryIO | tuple | np.ndarray


def load_audio(source: AudioSource, *, sample_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Decode `source` to (float32 mono samples, sample rate) at its own rate.

    `source` is a path, encoded bytes, a binary file object, Gradio's `(sample_rate, ndarray)` tuple
    (int16 / int32 / float, shape [n] or [n, channels]) or a bare ndarray with `sample_rate`.
    WAV/FLAC/OGG/MP3 go through libsndfile; anything else (m4a, webm, …) through audioread/ffmpeg."""
    wav, rate, _ = _decode(source, sample_rate)
    return wav, rate


def prepare_reference(audio: AudioSource, *, sample_rate: int | None = None, max_seconds: float = 30.0,
                      min_seconds: float = 1.0, trim_long: bool = False) -> PreparedReference:
    """Turn a user's clip into codec-ready reference audio, or raise `ReferenceAudioError`.

    Steps: decode → downmix → trim silence → length limits (`trim_long` cuts an over-long clip at a
    quiet moment before `max_seconds` instead of refusing it) → resample to 24 kHz → loudness →
    zero-pad the end to whole 960-sample frames. `notes` lists, in words, what was changed."""
    if not 0 < min_seconds < max_seconds:
        raise ValueError(f"need 0 < min_seconds < max_seconds (got {min_seconds}, {max_seconds})")
    wav, rate, channels = _decode(audio, sample_rate)
    notes: list[str] = []
    if channels > 1:
        notes.append(f"mixed {channels} channels down to mono")

    peak = float(np.max(np.abs(wav)))
    if peak < SILENCE_PEAK:
        raise ReferenceAudioError("The reference clip is silent (nothing louder than -60 dBFS). "
                                  "Check the microphone or choose another file.")
    start, end = trim_bounds(wav, rate)
    trimmed = [f"{n / rate:.2f} s at the {side}" for n, side in ((start, "start"), (len(wav) - end, "end")) if n]
    if trimmed:
        notes.append("trimmed silence: " + " and ".join(trimmed))
    wav = wav[start:end]

    seconds = len(wav) / rate
    if seconds < min_seconds:
        raise ReferenceAudioError(f"The reference clip has only {seconds:.1f} s of sound after trimming silence; "
                                  f"it needs at least {min_seconds:g} s (3-15 s of clear speech works best).")
    if seconds > max_seconds:
        if not trim_long:
            raise ReferenceAudioError(f"The reference clip is {seconds:.1f} s long after trimming silence; the limit "
                                      f"is {max_seconds:g} s. Cut a shorter clip (3-15 s of clear speech works best).")
        wav = wav[:quiet_cut(wav, rate, int(max_seconds * rate))]
        notes.append(f"cut to the first {len(wav) / rate:.1f} s (the limit is {max_seconds:g} s)")

    if rate != SAMPLE_RATE:
        wav = soxr.resample(wav, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
        notes.append(f"resampled from {rate} Hz to {SAMPLE_RATE} Hz")

    wav, gain_db = normalize_loudness(wav, SAMPLE_RATE)
    if gain_db:
        notes.append(f"made {'louder' if gain_db > 0 else 'quieter'} by {abs(gain_db):.1f} dB")

    pad = -len(wav) % SAMPLES_PER_FRAME
    if pad:
        wav = np.concatenate([wav, np.zeros(pad, np.float32)])
    return PreparedReference(wav=np.ascontiguousarray(wav, dtype=np.float32), seconds=len(wav) / SAMPLE_RATE,
                             notes=notes)


def trim_bounds(wav: np.ndarray, rate: int, *, top_db: float = TRIM_TOP_DB,
                margin_seconds: float = TRIM_MARGIN_SECONDS) -> tuple[int, int]:
    """[start, end) of the part of `wav` louder than `top_db` below its loudest frame, plus a margin.
    Bounds are taken at frame centres: a frame that only grazes the sound already passes the threshold,
    so its edge would add up to a whole frame of silence on top of the margin. A side with no more than
    `TRIM_MIN_SECONDS` of silence is left as it is."""
    rms, hop, frame = _frame_rms(wav, rate)
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (-top_db / 20))
    margin = int(margin_seconds * rate)
    start = max(0, int(loud[0]) * hop + frame // 2 - margin)
    end = min(len(wav), int(loud[-1]) * hop + frame // 2 + margin)
    least = int(TRIM_MIN_SECONDS * rate)
    return (start if start > least else 0), (end if len(wav) - end > least else len(wav))


def normalize_loudness(wav: np.ndarray, rate: int) -> tuple[np.ndarray, float]:
    """Scale so the non-silent frames sit at `TARGET_RMS`, capped so the peak stays ≤ `MAX_PEAK`.
    Returns the scaled clip and the gain applied, in dB."""
    rms, _, _ = _frame_rms(wav, rate)
    active = rms[rms >= rms.max() * 10 ** (-TRIM_TOP_DB / 20)]
    speech_rms = float(np.sqrt(np.mean(active ** 2)))
    peak = float(np.max(np.abs(wav)))
    gain = min(TARGET_RMS / speech_rms, MAX_PEAK / peak)
    gain_db = 20 * float(np.log10(gain))
    if abs(gain_db) < GAIN_TOLERANCE_DB and peak <= MAX_PEAK:  # the peak cap is never waived
        return wav.astype(np.float32), 0.0
    return (wav * gain).astype(np.float32), gain_db


def _frame_rms(wav: np.ndarray, rate: int) -> tuple[np.ndarray, int, int]:
    """RMS of overlapping frames (20 ms every 5 ms); a clip shorter than a frame is one frame."""
    frame = max(1, int(TRIM_FRAME_SECONDS * rate))
    hop = max(1, int(TRIM_HOP_SECONDS * rate))
    if len(wav) <= frame:
        return np.array([np.sqrt(np.mean(wav.astype(np.float64) ** 2))]), hop, len(wav)
    # Cumulative sum of squares gives every window's energy in O(n) without a strided copy.
    power = np.concatenate([[0.0], np.cumsum(wav.astype(np.float64) ** 2)])
    starts = np.arange(0, len(wav) - frame + 1, hop)
    return np.sqrt(np.maximum(power[starts + frame] - power[starts], 0.0) / frame), hop, frame


def quiet_cut(wav: np.ndarray, rate: int, limit: int, search_s: float = 1.0) -> int:
    """Where to end a clip that must be at most `limit` samples: the quietest 20 ms frame in its last
    `search_s` seconds, so the cut falls between words rather than inside one."""
    window = wav[max(0, limit - int(search_s * rate)):limit]
    rms, hop, frame = _frame_rms(window, rate)
    return max(0, limit - len(window)) + int(np.argmin(rms)) * hop + frame // 2


def _downmix(data: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(data.mean(axis=1) if data.shape[1] > 1 else data[:, 0], dtype=np.float32)


def _decode(source: AudioSource, sample_rate: int | None) -> tuple[np.ndarray, int, int]:
    """Any accepted source → (float32 mono samples, rate, channels it had), validated: non-empty, finite."""
    if isinstance(source, tuple):
        if len(source) != 2 or not isinstance(source[1], np.ndarray):
            raise ReferenceAudioError("Audio given as a tuple must be (sample_rate, samples), as Gradio provides it.")
        data, rate = _from_array(source[1]), _check_rate(source[0])
        channels, data = data.shape[1], _downmix(data)
    elif isinstance(source, np.ndarray):
        if sample_rate is None:
            raise ReferenceAudioError("Audio given as a bare array needs its sample_rate.")
        data, rate = _from_array(source), _check_rate(sample_rate)
        channels, data = data.shape[1], _downmix(data)
    else:
        data, rate, channels = _decode_encoded(source)
    _check_size(len(data), rate, channels)
    if data.shape[0] == 0:
        raise ReferenceAudioError("The reference clip contains no samples. Choose a clip with speech in it.")
    if not np.all(np.isfinite(data)):
        raise ReferenceAudioError("The reference clip contains invalid samples (NaN or infinity). "
                                  "Re-export it from your audio editor and try again.")
    return data, rate, channels


def _check_rate(rate) -> int:
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or not 1000 <= rate <= 768_000:
        raise ReferenceAudioError(f"Sample rate {rate!r} is not a plausible audio sample rate.")
    return int(rate)


def _from_array(array: np.ndarray) -> np.ndarray:
    """Samples as Gradio or numpy users hold them → float32 [n, channels] in [-1, 1]."""
    if array.ndim == 1:
        array = array[:, None]
    elif array.ndim == 2:
        # Gradio gives [n, channels]; a [channels, n] array (librosa/torch habit) has the short axis first.
        if array.shape[0] < array.shape[1] and array.shape[0] <= 8:
            array = array.T
    else:
        raise ReferenceAudioError(f"Audio samples must be 1-D or [samples, channels] (got shape {array.shape}).")
    if array.dtype == np.uint8:
        return (array.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(array.dtype, np.integer):
        return (array.astype(np.float64) / float(-np.iinfo(array.dtype).min)).astype(np.float32)
    if np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float32)
    raise ReferenceAudioError(f"Audio samples of type {array.dtype} are not supported (use int16, int32 or float).")


def _decode_encoded(source) -> tuple[np.ndarray, int]:
    """Path / bytes / file object → float32 [n, channels], rate. libsndfile first, ffmpeg after."""
    path: Path | None = None
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ReferenceAudioError(f"No audio file at {path}.")
        if path.stat().st_size == 0:
            raise ReferenceAudioError("The audio file is empty. Choose a recording with speech in it.")
        payload: bytes | None = None
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            payload = bytes(source)
        elif hasattr(source, "read"):
            payload = source.read()
            if not isinstance(payload, bytes):
                raise ReferenceAudioError("The audio file object must be opened in binary mode.")
        else:
            raise ReferenceAudioError(f"Cannot read audio from a {type(source).__name__}; give a file path, bytes, "
                                      "or (sample_rate, samples).")
        if not payload:
            raise ReferenceAudioError("The audio file is empty. Choose a recording with speech in it.")
    try:
        with sf.SoundFile(path if path is not None else io.BytesIO(payload)) as f:
            rate, channels = f.samplerate, f.channels
            _check_size(f.frames, rate, channels)
            blocks = (_downmix(b) for b in f.blocks(DECODE_BLOCK, dtype="float32", always_2d=True))
            return _gather(blocks, rate, channels), rate, channels
    except ReferenceAudioError:
        raise
    except Exception:  # noqa: BLE001 — libsndfile cannot read it; ffmpeg may (m4a, webm, aac, …)
        pass
    if path is not None:
        return _decode_ffmpeg(path)
    with tempfile.NamedTemporaryFile(suffix=".audio") as tmp:
        tmp.write(payload)
        tmp.flush()
        return _decode_ffmpeg(Path(tmp.name))


def _decode_ffmpeg(path: Path) -> tuple[np.ndarray, int, int]:
    import audioread  # librosa's fallback decoder; only reached for formats libsndfile lacks

    try:
        with audioread.audio_open(str(path)) as f:
            rate, channels = int(f.samplerate), int(f.channels)
            if channels < 1 or rate < 1:
                raise ReferenceAudioError("The file could not be read as audio (no channels or sample rate).")
            duration = float(getattr(f, "duration", 0) or 0)
            _check_size(int(duration * rate), rate, channels)
            return _gather(_pcm_blocks(f, channels), rate, channels), rate, channels
    except ReferenceAudioError:
        raise
    except Exception as exc:  # noqa: BLE001 — every decoder failure means the same thing to the user
        log.info("no decoder read the clip: %r", exc)  # the detail is for the log, never the answer
        raise ReferenceAudioError("The file could not be read as audio. Use WAV, FLAC, OGG, MP3 or another "
                                  "common format.") from None


def _pcm_blocks(f, channels: int) -> Iterator[np.ndarray]:
    """audioread's 16-bit interleaved byte blocks → mono float32 blocks (a frame split across blocks is kept)."""
    frame_bytes = 2 * channels
    rest = b""
    for block in f:
        block = rest + block
        whole = len(block) // frame_bytes * frame_bytes
        rest = block[whole:]
        pcm = np.frombuffer(block[:whole], dtype="<i2").reshape(-1, channels)
        yield _downmix(pcm.astype(np.float32) / 32768.0)


def _gather(blocks: Iterable[np.ndarray], rate: int, channels: int) -> np.ndarray:
    """Concatenate mono blocks, stopping as soon as the running count passes the sample budget."""
    pieces, n = [], 0
    for block in blocks:
        n += len(block)
        _check_size(n, rate, channels)
        pieces.append(block)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _check_size(frames: int, rate: int, channels: int) -> None:
    """Refuse by what decoding would cost (samples, channels), before or while decoding."""
    if channels > MAX_CHANNELS:
        raise ReferenceAudioError(f"The audio file has {channels} channels; the limit is {MAX_CHANNELS}. "
                                  "Export a mono or stereo clip.")
    if frames > MAX_DECODE_SAMPLES:
        limit_s = MAX_DECODE_SAMPLES / 48_000
        raise ReferenceAudioError(f"The audio file is {frames / rate:.0f} s long at {rate} Hz; the limit is "
                                  f"{MAX_DECODE_SAMPLES:,} samples ({limit_s:.0f} s at 48 kHz, longer at lower "
                                  "rates). A reference clip should be 3-15 s of speech: cut a short clip first.")
