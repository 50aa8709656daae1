"""Encode a float32 mono waveform into the response formats of the OpenAI speech API.

wav / pcm / flac are written in-process (soundfile, numpy); mp3 / opus / aac go through an `ffmpeg`
subprocess, because no pure-Python encoder for them is dependable. `pcm` is raw 16-bit little-endian
mono with no header: callers that stream it must send the sample rate beside it (PRODUCT §6: a
headerless stream saved as `.wav` is the most common "the output is broken" report).
"""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import soundfile as sf

MIME = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
FORMATS = tuple(MIME)
FFMPEG_FORMATS = ("mp3", "opus", "aac")

# ffmpeg output options per format: codec, container, bitrate. Opus runs at 24 kHz natively (one of its
# five legal rates), so no resampling happens; the ADTS container makes raw AAC playable and streamable.
_FFMPEG_ARGS = {
    "mp3": ["-c:a", "libmp3lame", "-b:a", "128k", "-f", "mp3"],
    "opus": ["-c:a", "libopus", "-b:a", "48k", "-f", "ogg"],
    "aac": ["-c:a", "aac", "-b:a", "96k", "-f", "adts"],
}


class FormatError(ValueError):
    """An unknown format, or one that needs ffmpeg where ffmpeg is missing."""


def ffmpeg_path() -> str | None:
    return shutil.which("ffmpeg")


def available_formats() -> tuple[str, ...]:
    """The formats this machine can encode right now (ffmpeg ones only when ffmpeg is on PATH)."""
    have_ffmpeg = ffmpeg_path() is not None
    return tuple(f for f in FORMATS if have_ffmpeg or f not in FFMPEG_FORMATS)


def to_pcm16(wav: np.ndarray) -> np.ndarray:
    """Clip to [-1, 1] and quantise to int16 (round to nearest, so silence stays exactly zero)."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    return np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2")


def encode_audio(wav: np.ndarray, sample_rate: int, fmt: str = "wav") -> tuple[bytes, str]:
    """Return `(data, mime_type)` for `wav` (float32 mono, any length including zero) in `fmt`."""
    fmt = (fmt or "wav").lower()
    if fmt not in MIME:
        raise FormatError(f"Unknown audio format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    pcm = to_pcm16(wav)
    if fmt == "pcm":
        return pcm.tobytes(), MIME[fmt]
    if fmt in ("wav", "flac"):
        buf = io.BytesIO()
        sf.write(buf, pcm, sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buf.getvalue(), MIME[fmt]
    return _ffmpeg_encode(pcm, sample_rate, fmt), MIME[fmt]


def _ffmpeg_encode(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    exe = ffmpeg_path()
    if exe is None:
        raise FormatError(
            f"Encoding {fmt} needs ffmpeg, which is not on PATH. Install it (e.g. `apt-get install ffmpeg`) "
            f"or ask for wav, flac or pcm."
        )
    cmd = [exe, "-hide_banner", "-loglevel", "error", "-f", "s16le", "-ar", str(sample_rate), "-ac", "1",
           "-i", "pipe:0", *_FFMPEG_ARGS[fmt], "pipe:1"]
    proc = subprocess.run(cmd, input=pcm.tobytes(), capture_output=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise FormatError(f"ffmpeg could not encode {fmt}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def write_audio(path, wav: np.ndarray, sample_rate: int) -> str:
    """Write `wav` to `path`, the format taken from the suffix; returns the path as a string."""
    path = str(path)
    data, _ = encode_audio(wav, sample_rate, path.rsplit(".", 1)[-1])
    with open(path, "wb") as f:
        f.write(data)
    return path
