"""Reference-clip preparation: every bad input is refused with a sentence, good input comes out as
24 kHz mono float32 padded to whole 960-sample frames (SPEC D7)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf

from engine.audio import (MAX_PEAK, TARGET_RMS, ReferenceAudioError, load_audio, prepare_reference)
from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.helpers import wav_bytes


def speechlike(seconds: float, rate: int, *, amplitude: float = 0.5, seed: int = 0) -> np.ndarray:
    """Voiced-sounding test signal: harmonics of a wobbling pitch under a syllable-rate envelope that
    never drops to silence (so trimming only removes padding we add around it)."""
    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    noise = np.random.default_rng(seed).normal(0, 0.02, len(t))
    x = voiced * envelope + noise
    return (amplitude * x / np.max(np.abs(x))).astype(np.float32)


def padded(sound: np.ndarray, rate: int, before: float, after: float) -> np.ndarray:
    return np.concatenate([np.zeros(int(before * rate), np.float32), sound, np.zeros(int(after * rate), np.float32)])


def refused(source, match: str, **kwargs) -> str:
    with pytest.raises(ReferenceAudioError, match=match) as info:
        prepare_reference(source, **kwargs)
    return str(info.value)


# ---- bad input ------------------------------------------------------------------------------------

def test_empty_file_is_refused(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    refused(empty, "empty")
    refused(b"", "empty")
    refused(io.BytesIO(b""), "empty")


def test_missing_file_is_refused(tmp_path):
    refused(tmp_path / "nope.wav", "No audio file")


def test_not_audio_is_refused(tmp_path):
    junk = b"this is a text document, not a recording\n" * 200
    message = refused(junk, "could not be read as audio")
    assert "WAV" in message
    path = tmp_path / "notes.wav"
    path.write_bytes(junk)
    refused(path, "could not be read as audio")


def test_wav_header_without_samples_is_refused():
    refused(wav_bytes(np.zeros(0, np.float32), 16000), "no samples")


def test_too_short_is_refused():
    rate = 16000
    clip = padded(speechlike(0.2, rate), rate, 0.5, 0.5)  # 1.2 s file, 0.2 s of sound
    message = refused((rate, clip), "only 0.[23] s of sound")
    assert "at least 1 s" in message


def test_silence_is_refused():
    refused((SAMPLE_RATE, np.zeros(3 * SAMPLE_RATE, np.float32)), "silent")
    refused((SAMPLE_RATE, np.full(3 * SAMPLE_RATE, 1e-5, np.float32)), "silent")
    refused((SAMPLE_RATE, np.zeros((3 * SAMPLE_RATE, 2), np.int16)), "silent")


def test_ten_minute_clip_is_refused_or_cut():
    rate = 8000  # a cheap 10-minute clip: 4.8 M samples
    long = np.tile(speechlike(2.0, rate), 300)
    assert len(long) / rate == 600
    message = refused((rate, long), "600.0 s long")
    assert "limit is 30 s" in message

    cut = prepare_reference((rate, long), trim_long=True)
    assert 29.0 <= cut.seconds <= 30.0
    assert len(cut.wav) % SAMPLES_PER_FRAME == 0
    assert any("cut to the first" in note for note in cut.notes)


def test_nan_and_inf_are_refused():
    clip = speechlike(3.0, SAMPLE_RATE)
    clip[1000] = np.nan
    refused((SAMPLE_RATE, clip), "NaN")
    clip[1000] = np.inf
    refused((SAMPLE_RATE, clip), "NaN or infinity")
    # A float WAV file can carry NaN too.
    clip[1000] = np.nan
    refused(wav_bytes(clip, SAMPLE_RATE, "FLOAT"), "NaN")


def test_bad_arrays_and_rates_are_refused():
    refused(speechlike(2.0, SAMPLE_RATE), "needs its sample_rate")
    refused((0, speechlike(2.0, SAMPLE_RATE)), "not a plausible")
    refused((SAMPLE_RATE, np.zeros((2, 2, 2))), "1-D or")
    refused(12345, "Cannot read audio")


# ---- good input -----------------------------------------------------------------------------------

def test_resample_downmix_trim_pad():
    rate = 44100
    sound = speechlike(2.0, rate)
    left = padded(sound, rate, 0.5, 0.3)
    stereo = np.stack([left, 0.5 * left], axis=1)  # [n, 2] as Gradio gives it
    out = prepare_reference((rate, stereo))

    assert out.wav.dtype == np.float32 and out.wav.ndim == 1
    assert len(out.wav) % SAMPLES_PER_FRAME == 0
    assert out.frames == len(out.wav) // SAMPLES_PER_FRAME
    assert out.seconds == len(out.wav) / SAMPLE_RATE
    # 2.0 s of sound, a 40 ms margin each side, at most one frame of padding.
    assert 2.0 <= out.seconds <= 2.0 + 0.08 + 0.02 + SAMPLES_PER_FRAME / SAMPLE_RATE
    # Leading silence is gone: sound starts within the margin.
    first = np.flatnonzero(np.abs(out.wav) > 0.01)[0]
    assert first <= 0.05 * SAMPLE_RATE
    # The padding is exact zeros at the end, shorter than one frame.
    last = np.flatnonzero(out.wav)[-1]
    assert len(out.wav) - 1 - last < SAMPLES_PER_FRAME
    notes = " | ".join(out.notes)
    assert "2 channels" in notes and "44100 Hz to 24000 Hz" in notes
    assert re.search(r"0\.4[5-6] s at the start and 0\.2[5-6] s at the end", notes)  # 0.5 / 0.3 s minus margins


def test_already_prepared_clip_is_unchanged_in_length():
    clip = speechlike(2.0, SAMPLE_RATE, amplitude=0.3)
    clip = clip[: len(clip) // SAMPLES_PER_FRAME * SAMPLES_PER_FRAME]
    out = prepare_reference((SAMPLE_RATE, clip))
    assert len(out.wav) == len(clip)
    assert not any("resampled" in n or "trimmed" in n for n in out.notes)


def test_preparation_is_idempotent():
    """Preparing a prepared clip (as stored by the voice library, 16-bit) changes nothing, so an encoder
    that prepares its input again encodes exactly the stored samples."""
    rate = 44100
    once = prepare_reference((rate, padded(speechlike(2.5, rate, amplitude=0.05), rate, 0.7, 0.9)))
    assert any("trimmed" in n for n in once.notes) and any("louder" in n for n in once.notes)
    twice = prepare_reference((SAMPLE_RATE, once.wav))
    np.testing.assert_array_equal(twice.wav, once.wav)
    assert twice.notes == []
    stored = np.round(once.wav * 32768).astype(np.int16)
    again = prepare_reference((SAMPLE_RATE, stored))
    np.testing.assert_array_equal(again.wav, stored / np.float32(32768))


def test_tight_clip_is_not_trimmed():
    rate = SAMPLE_RATE
    sound = speechlike(2.0, rate)
    out = prepare_reference((rate, padded(sound, rate, 0.05, 0.05)))
    assert not any("trimmed" in n for n in out.notes)
    assert len(out.wav) == -(-(len(sound) + 2 * int(0.05 * rate)) // SAMPLES_PER_FRAME) * SAMPLES_PER_FRAME


def test_loudness_is_normalised_without_clipping():
    rate = SAMPLE_RATE
    quiet = prepare_reference((rate, speechlike(3.0, rate, amplitude=0.01)))
    assert any("louder" in n for n in quiet.notes)
    assert np.max(np.abs(quiet.wav)) <= MAX_PEAK + 1e-6
    rms = np.sqrt(np.mean(quiet.wav[np.abs(quiet.wav) > 0] ** 2))
    assert rms > 0.5 * TARGET_RMS  # it got a lot louder, not just nudged

    # A full-scale square wave has RMS 1: it comes down to the target RMS (its peak equals its RMS).
    square = np.sign(np.sin(2 * np.pi * 200 * np.arange(3 * rate) / rate)).astype(np.float32)
    loud = prepare_reference((rate, square))
    assert any("quieter by 20.0 dB" in n for n in loud.notes)
    assert np.sqrt(np.mean(loud.wav[np.abs(loud.wav) > 0] ** 2)) == pytest.approx(TARGET_RMS, rel=0.05)

    # A spiky clip (one click far above the speech) is limited by the peak cap, not the RMS target.
    spiky = speechlike(3.0, rate, amplitude=0.05)
    spiky[rate] = 1.0
    capped = prepare_reference((rate, spiky))
    assert np.max(np.abs(capped.wav)) == pytest.approx(MAX_PEAK, abs=0.01)


def test_integer_inputs_are_scaled():
    rate = 16000
    x = speechlike(2.0, rate, amplitude=0.5)
    as16 = (x * 32767).astype(np.int16)
    as32 = as16.astype(np.int32) << 16
    a, _ = load_audio((rate, as16))
    b, _ = load_audio((rate, as32))
    np.testing.assert_allclose(a, x, atol=1e-4)
    np.testing.assert_allclose(b, x, atol=1e-4)
    channels_first, _ = load_audio((rate, np.stack([as16, as16])))  # [2, n] is recognised too
    np.testing.assert_allclose(channels_first, x, atol=1e-4)


def test_path_bytes_and_file_object_agree(tmp_path):
    rate = 22050
    x = speechlike(2.0, rate)
    path = tmp_path / "clip.flac"
    sf.write(path, x, rate)
    from_path = prepare_reference(path)
    from_str = prepare_reference(str(path))
    from_bytes = prepare_reference(path.read_bytes())
    with open(path, "rb") as f:
        from_file = prepare_reference(f)
    for other in (from_str, from_bytes, from_file):
        np.testing.assert_array_equal(other.wav, from_path.wav)


def test_min_and_max_arguments_are_checked():
    with pytest.raises(ValueError):
        prepare_reference((SAMPLE_RATE, speechlike(2.0, SAMPLE_RATE)), min_seconds=5, max_seconds=2)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_clip_prepares(tmp_path):
    path = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "The quick brown fox jumps over the lazy dog."],
                   check=True, timeout=60)
    raw, rate = load_audio(path)
    out = prepare_reference(path)
    assert len(out.wav) % SAMPLES_PER_FRAME == 0
    assert 1.0 <= out.seconds <= len(raw) / rate + 0.05
    assert np.max(np.abs(out.wav)) <= MAX_PEAK + 1e-6
    if rate != SAMPLE_RATE:
        assert any(f"from {rate} Hz" in n for n in out.notes)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")
@pytest.mark.parametrize("suffix", ["mp3", "m4a"])
def test_ffmpeg_encoded_clip_loads(tmp_path, suffix):
    rate = 22050
    src = tmp_path / "clip.wav"
    sf.write(src, speechlike(2.0, rate), rate)
    encoded = tmp_path / f"clip.{suffix}"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(src), str(encoded)], check=True, timeout=60)
    samples, got_rate = load_audio(encoded)
    assert got_rate == rate
    assert abs(len(samples) / rate - 2.0) < 0.1  # codec priming may add a few ms
    out = prepare_reference(encoded.read_bytes())  # bytes path: m4a goes through ffmpeg via a temp file
    assert 1.9 <= out.seconds <= 2.2 and len(out.wav) % SAMPLES_PER_FRAME == 0
