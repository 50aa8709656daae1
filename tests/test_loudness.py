"""studio/audio/loudness.py and studio/audio/acx.py: BS.1770 loudness of every take, normalisation to a target under a true-peak ceiling, the
ACX check and its export preset, and where the studio shows them (take, page, HTTP API)."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess

import numpy as np
import pyloudnorm
import pytest
import soundfile as sf
import soxr

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.views import panel, render
from studio.audio.acx import EXPORT_PRESETS, acx_check, export, master, room_tone
from studio.audio.loudness import TARGETS, measure, normalize, resolve_target
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine

RATE = SAMPLE_RATE


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """A voice-like test signal: a gliding 140 Hz harmonic tone in 4 Hz syllables, words of 0.8 s with 0.3 s gaps,
    a little breath noise, and one click (a sharp peak that only a limiter can hold under a ceiling)."""
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * np.cumsum(140 + 20 * np.sin(2 * np.pi * 0.5 * t)) / RATE
    voiced = sum(0.6 ** k * np.sin(k * phase) for k in range(1, 9))
    syllables = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    words = (t % 1.1) < 0.8
    x = 0.15 * voiced * syllables * words + 0.002 * np.random.default_rng(seed).standard_normal(t.size)
    x[len(x) // 3] = 0.95
    return x.astype(np.float32)


def true_peak_db(x: np.ndarray) -> float:
    """An independent true-peak reading: the samples and soxr's 8× resampling (not the meter's polyphase 4×)."""
    x = x.astype(np.float64)
    return 20 * np.log10(max(np.abs(x).max(), np.abs(soxr.resample(x, RATE, 8 * RATE)).max()))


def lufs(x: np.ndarray) -> float:
    return pyloudnorm.Meter(RATE).integrated_loudness(x.astype(np.float64))


class SpeechLikeEngine(FakeEngine):
    """FakeEngine's takes (the real Chunks and Metrics) carrying `speech_like` audio instead of a constant."""

    def generate_stream(self, text, **kwargs):
        signal = speech_like(4.0)
        for i, chunk in enumerate(super().generate_stream(text, **kwargs)):
            audio = signal[i * SAMPLES_PER_FRAME:(i + 1) * SAMPLES_PER_FRAME] if len(chunk.audio) else chunk.audio
            yield dataclasses.replace(chunk, audio=audio)


# ------------------------------------------------------------------------------------------ acceptance

@pytest.mark.parametrize("target", ["audiobook", "podcast", "broadcast", -20.0])
def test_a_take_normalised_to_a_target_measures_it_under_the_ceiling(target):
    take = speech_like(6.0)
    done = normalize(take, RATE, target, ceiling_db=-1.0)
    goal = resolve_target(target)
    assert abs(lufs(done.audio) - goal) <= 0.5
    assert true_peak_db(done.audio) <= -1.0 + 0.1 and done.after.true_peak_db <= -1.0
    assert done.before.lufs == pytest.approx(lufs(take), abs=1e-6) and done.audio.dtype == np.float32
    assert done.limited  # the click would have gone over the ceiling at every one of these gains


def test_the_acx_report_of_a_bad_clip_fails_on_the_right_line_and_a_good_one_passes():
    good = master(speech_like(8.0), RATE, EXPORT_PRESETS["acx"])
    report = acx_check(good, RATE)
    assert report.passed, report.as_dict()
    head = int(0.75 * RATE)
    spike = good.copy()
    spike[len(spike) // 2] = 0.99
    noise = good + (10 ** (-50 / 20) * np.random.default_rng(3).standard_normal(good.size)).astype(np.float32)
    bad = {"rms": good * 10 ** (-8 / 20), "peak": spike, "noise_floor": noise, "head_room_tone": good[head:],
           "tail_room_tone": np.concatenate([good, room_tone(6.0, RATE, -70.0)]).astype(np.float32)}
    for line, clip in bad.items():
        assert acx_check(clip, RATE).failed == [line], (line, acx_check(clip, RATE).as_dict())
    shown = render.acx_html(acx_check(bad["peak"], RATE))
    assert 'id="acx-peak" class="fail"' in shown and 'id="acx-rms" class="pass"' in shown and "fails: peak" in shown


# ------------------------------------------------------------------------------------------ units

def test_targets_are_names_numbers_or_off():
    assert [resolve_target(n) for n in TARGETS] == [-16.0, -18.0, -23.0]
    assert resolve_target("off") is None and resolve_target(None) is None and resolve_target("-20") == -20.0
    for bad in ("loud", -60, True, float("nan")):
        with pytest.raises(ValueError):
            resolve_target(bad)
    with pytest.raises(ValueError, match="ceiling"):
        normalize(speech_like(1.0), RATE, "podcast", ceiling_db=3.0)


def test_the_true_peak_read_a_block_at_a_time_equals_the_whole_signals(monkeypatch):
    from scipy.signal import resample_poly

    from engine import peaks

    x = np.random.default_rng(1).standard_normal(10_007) * 0.1
    x[999:1003] = [0.5, -0.9, 0.9, -0.5]  # an intersample peak right at a block's edge
    whole = max(np.abs(x).max(), np.abs(resample_poly(x, 4, 1)).max())
    monkeypatch.setattr(peaks, "PEAK_BLOCK", 1000)
    assert peaks.true_peak(x) == pytest.approx(whole, rel=1e-12) and whole > 0.9


def test_the_streaming_meter_reads_what_the_whole_signal_reads():
    from studio.audio.loudness import LoudnessMeter

    rng = np.random.default_rng(2)
    for seconds in (5.05, 3.0, 0.3):  # a block ending in a half hop, whole hops, shorter than one block
        take, meter, pos = speech_like(seconds), LoudnessMeter(RATE), 0
        while pos < take.size:
            step = int(rng.integers(1, 9000))
            meter.feed(take[pos:pos + step])
            pos += step
        whole, streamed = measure(take, RATE), meter.result()
        assert streamed.true_peak_db == pytest.approx(whole.true_peak_db, abs=1e-9)
        assert (streamed.lufs is None) == (whole.lufs is None) and streamed.lufs == pytest.approx(whole.lufs, abs=1e-6)


def test_silence_and_clips_shorter_than_a_block_are_left_as_they_are():
    for clip in (np.zeros(RATE, np.float32), speech_like(0.3)):
        done = normalize(clip, RATE, "podcast")
        assert done.before.lufs is None and np.array_equal(done.audio, clip) and done.gain_db == 0.0
    assert measure(np.zeros(0, np.float32), RATE).as_dict() == {"lufs": None, "true_peak_dbtp": None}


@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="the ACX export is checked with ffprobe")
def test_the_acx_export_is_192k_cbr_mp3_at_44k1_with_room_tone():
    out = export(speech_like(5.0), RATE, "acx")
    assert out.report.passed and out.mime == "audio/mpeg"
    assert out.audio.size == pytest.approx(RATE * (0.75 + 2.0) + speech_like(5.0).size, rel=0.1)
    probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name,sample_rate,bit_rate",
                            "-show_entries", "packet=size", "-of", "json", "-"], input=out.data, capture_output=True,
                           check=True)
    facts = json.loads(probe.stdout)
    assert facts["streams"][0] == {"codec_name": "mp3", "sample_rate": "44100", "bit_rate": "192000"}
    assert {int(p["size"]) for p in facts["packets"]} <= {626, 627}  # constant bit rate: every frame the same size
    with pytest.raises(ValueError, match="silent"):
        export(np.zeros(RATE, np.float32), RATE)


# ------------------------------------------------------------------------------------------ in the studio

@pytest.fixture()
def service():
    service = StudioService(SpeechLikeEngine(frames=100))  # 4 s takes
    yield service
    service.close()


def test_every_take_is_measured_and_the_page_shows_and_levels_it(service, tmp_path):
    from studio.views.page import Page

    take = service.synthesize(Order(text="Hello there."))
    assert take.loudness.lufs == pytest.approx(lufs(take.audio), abs=1e-6)
    assert take.loudness.true_peak_db == pytest.approx(true_peak_db(take.audio), abs=0.2)
    shown = panel.metrics_html(take.metrics, state="done", loudness=take.loudness)
    assert f'id="m-lufs">{take.loudness.lufs:.1f}<' in shown
    assert render.result_json(take, [])["loudness"] == take.loudness.as_dict()
    page = Page(service)
    path = page.takes.take_file(take, "wav", "audiobook")
    audio, _ = sf.read(path, dtype="float32")
    assert abs(lufs(audio) - TARGETS["audiobook"]) <= 0.5 and path != page.takes.take_file(take, "wav")
    assert 'id="acx-verdict"' in page.takes._acx_check([take.id], "audiobook")


def test_the_api_normalises_on_request_and_reports_loudness(service):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    app = FastAPI()
    api.register(app, service, request_timeout=10.0)
    with TestClient(app) as client:
        r = client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": "wav", "loudness": "audiobook",
                                                   "true_peak": -2.0})
        assert r.status_code == 200
        audio, _ = sf.read(io.BytesIO(r.content), dtype="float32")
        assert abs(lufs(audio) + 18) <= 0.5 and float(r.headers["X-Loudness-LUFS"]) == pytest.approx(-18, abs=0.5)
        assert float(r.headers["X-True-Peak-dBTP"]) <= -2.0 and "X-Loudness-Gain-dB" in r.headers
        plain = client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": "flac"})
        assert float(plain.headers["X-Loudness-LUFS"]) == pytest.approx(service.history[-1].loudness.lufs, abs=0.01)
        sse = client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": "pcm", "stream_format": "sse"})
        done = json.loads(sse.text.strip().split("\n\n")[-1].removeprefix("data: "))
        assert done["metrics"]["loudness"] == service.history[-1].loudness.as_dict()
        bad = client.post("/v1/audio/speech", json={"input": "Hi.", "loudness": "very loud"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "loudness"
