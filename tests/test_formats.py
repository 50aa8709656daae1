"""studio.formats: every format decodes back to the right length; pcm is raw 16-bit little-endian."""

from __future__ import annotations

import io
import subprocess

import numpy as np
import pytest
import soundfile as sf

from studio.formats import FORMATS, FormatError, available_formats, encode_audio, ffmpeg_path, to_pcm16

SR = 24_000


def tone(seconds: float = 1.3) -> np.ndarray:
    t = np.arange(int(SR * seconds)) / SR
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def ffmpeg_decode(data: bytes) -> np.ndarray:
    out = subprocess.run([ffmpeg_path(), "-hide_banner", "-loglevel", "error", "-i", "pipe:0",
                          "-f", "s16le", "-ar", str(SR), "-ac", "1", "pipe:1"],
                         input=data, capture_output=True, check=True, timeout=60).stdout
    return np.frombuffer(out, dtype="<i2")


def test_pcm_is_raw_int16_le():
    wav = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0], dtype=np.float32)
    data, mime = encode_audio(wav, SR, "pcm")
    assert mime == "audio/pcm"
    assert len(data) == 2 * len(wav)
    assert np.frombuffer(data, "<i2").tolist() == [0, 16384, -16384, 32767, -32767, 32767]


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_roundtrip(fmt):
    wav = tone()
    data, mime = encode_audio(wav, SR, fmt)
    assert mime == f"audio/{fmt}"
    back, sr = sf.read(io.BytesIO(data), dtype="int16")
    assert sr == SR
    assert np.array_equal(back, to_pcm16(wav))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_ffmpeg_formats_decode_to_right_length(fmt):
    if ffmpeg_path() is None:
        pytest.skip("ffmpeg not on PATH")
    wav = tone()
    data, _ = encode_audio(wav, SR, fmt)
    back = ffmpeg_decode(data)
    # Lossy codecs pad by up to one or two codec frames (AAC priming is 1024 samples, mp3 frames are 1152).
    assert abs(len(back) - len(wav)) <= 2400, (fmt, len(back), len(wav))
    # And it is the tone, not silence: energy close to the source's.
    assert 0.5 < np.sqrt(np.mean((back / 32768.0) ** 2)) / np.sqrt(np.mean(wav ** 2)) < 1.5


def test_empty_audio_encodes():
    for fmt in ("wav", "flac", "pcm"):
        data, _ = encode_audio(np.zeros(0, np.float32), SR, fmt)
        assert isinstance(data, bytes)


def test_unknown_format_and_missing_ffmpeg(monkeypatch):
    with pytest.raises(FormatError, match="Unknown audio format"):
        encode_audio(tone(), SR, "ogg-vorbis")
    monkeypatch.setattr("studio.formats.shutil.which", lambda name: None)
    with pytest.raises(FormatError, match="needs ffmpeg"):
        encode_audio(tone(), SR, "mp3")
    assert available_formats() == ("wav", "pcm", "flac")
    assert set(FORMATS) == {"wav", "pcm", "flac", "mp3", "opus", "aac"}
