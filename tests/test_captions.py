"""Captions (engine/captions.py, studio/audio/captions.py): cues from segment texts and exact sample spans, times
inside a segment from ASR words or estimated (and marked), SRT and WebVTT that the `srt` and `webvtt-py`
libraries read back."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import srt
import webvtt

from engine.captions import Cue, WordTime, cues, to_srt, to_vtt
from engine.config import SAMPLE_RATE
from engine.longform import plan
from engine.longtake import LongTake
from studio.audio.asr import Transcriber
from studio.audio.captions import captions, take_captions
from tests.fakes import AsrPipeline

SENTENCES = [f"Sentence number {word} is here." for word in [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
    "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]]


def vtt_seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@pytest.fixture(scope="module")
def engine(shared_engine, tiny_checkpoint):
    return shared_engine(tiny_checkpoint, precision="fp32", max_batch=1)


@pytest.fixture(scope="module")
def long_take(engine):
    segments = plan(" ".join(SENTENCES), normalize=False, min_seconds=4.0, max_seconds=9.0)
    take = LongTake(engine, segments, seeds=list(range(len(segments))), max_frames=4)  # seeds given: no retries
    take.run()
    return take


def test_a_long_take_of_twenty_sentences_is_captioned_on_its_exact_sample_offsets(long_take):
    take = long_take
    assert len(take.segments) >= 4 and any(s.text.count(".") > 1 for s in take.segments)
    found = take_captions(take, level="sentence")
    spans, total = take.spans(), len(take.assemble())
    assert total == take.total_samples()
    assert [c.text for c in found.cues] == SENTENCES  # one cue per sentence, in order

    firsts = {c.segment: c for c in reversed(found.cues)}  # each segment's first cue
    assert sorted(firsts) == list(range(len(spans)))
    for index, cue in firsts.items():
        assert abs(cue.start - spans[index][0] / SAMPLE_RATE) <= 1e-3
    # Monotonic and covering: the cues tile [0, the take's end).
    assert found.cues[0].start == 0.0 and abs(found.cues[-1].end - total / SAMPLE_RATE) < 1e-9
    for a, b in zip(found.cues, found.cues[1:]):
        assert a.start < a.end == b.start
    # Without an ASR, a cue with a boundary inside a segment is estimated; a one-sentence segment is not.
    for cue in found.cues:
        inside = sum(1 for c in found.cues if c.segment == cue.segment) > 1
        assert cue.estimated == inside
    assert found.estimated and "estimated" in found.note

    parsed = list(srt.parse(found.srt()))
    assert [p.content for p in parsed] == SENTENCES
    for p, cue in zip(parsed, found.cues):
        assert abs(p.start.total_seconds() - cue.start) <= 1e-3 and abs(p.end.total_seconds() - cue.end) <= 1e-3
        assert p.proprietary == ""  # nothing after the times: SRT has no place for "estimated"
    vtt = webvtt.from_buffer(io.StringIO(found.vtt()))
    assert [c.text for c in vtt.captions] == SENTENCES
    for c, cue in zip(vtt.captions, found.cues):
        assert abs(vtt_seconds(c.start) - cue.start) <= 1e-3 and abs(vtt_seconds(c.end) - cue.end) <= 1e-3
        assert c.identifier.endswith("estimated") == cue.estimated
    assert "\nNOTE " in found.vtt()


def test_segment_cues_start_on_the_segments_and_are_not_estimated(long_take):
    found = take_captions(long_take, level="segment")
    assert [round(c.start * SAMPLE_RATE) for c in found.cues] == [start for start, _ in long_take.spans()]
    assert not found.estimated and found.note is None
    assert "estimated" not in found.srt() and "NOTE" not in found.vtt()


def test_word_cues_split_a_segment_by_character_share():
    (a, b, c) = cues(["Hi there, friend."], [(0, 2400)], 4800, level="word")
    assert (a.text, b.text, c.text) == ("Hi", "there,", "friend.")
    # weights len+1: 3, 7, 8 of 18 over the 2400 speech samples; the last cue holds to the take's end
    assert round(b.start * SAMPLE_RATE) == 400 and round(c.start * SAMPLE_RATE) == 400 + 933
    assert c.end == 4800 / SAMPLE_RATE and all(x.estimated for x in (a, b, c))


def test_asr_words_give_the_times_inside_a_segment_and_a_missed_word_is_estimated():
    text = "The cat sat. A dog ran far. Birds sang loudly."
    heard = [WordTime("the", 0.0, 0.1), WordTime("cat", 0.1, 0.3), WordTime("sat", 0.3, 0.5),
             WordTime("a", 1.0, 1.1), WordTime("dog", 1.1, 1.3), WordTime("ran", 1.3, 1.5), WordTime("far", 1.5, 1.7),
             WordTime("words", 2.0, 2.2), WordTime("sang", 2.2, 2.4)]  # "Birds" misheard
    start = 4800
    found = cues([text], [(start, start + 3 * SAMPLE_RATE)], start + 4 * SAMPLE_RATE, words=[heard])
    assert [c.text for c in found] == ["The cat sat.", "A dog ran far.", "Birds sang loudly."]
    assert found[0].start == start / SAMPLE_RATE  # the segment's own start, not the ASR's
    assert found[1].start == (start + SAMPLE_RATE) / SAMPLE_RATE  # "A" heard at 1.0 s into the segment
    assert not found[0].estimated  # both its boundaries come from samples and the ASR
    assert found[1].estimated and found[2].estimated  # "Birds" was not heard: the third start is estimated
    assert found[1].start < found[2].start < found[2].end


def test_asr_times_out_of_order_are_not_trusted():
    heard = [WordTime("one", 0.0, 0.1), WordTime("two", 5.0, 5.1)]  # past the segment's end
    found = cues(["One. Two."], [(0, SAMPLE_RATE)], SAMPLE_RATE, words=[heard])
    assert found[1].estimated and 0 < found[1].start < 1.0


def test_the_transcriber_times_each_segment_of_the_audio():
    pipe = AsrPipeline([[("Hello", 0.0), ("there.", 0.2), ("How", 0.5), ("are", 0.6), ("you?", 0.7)],
                         [("Fine.", 0.0), ("Thanks.", 0.3)]])
    asr = Transcriber("fake", make_pipeline=lambda model, device: pipe)
    audio = np.zeros(3 * SAMPLE_RATE, np.float32)
    texts = ["Hello there. How are you?", "Yes.", "Fine. Thanks."]
    spans = [(0, SAMPLE_RATE), (SAMPLE_RATE, SAMPLE_RATE + 2400), (SAMPLE_RATE + 4800, 2 * SAMPLE_RATE)]
    found = captions(texts, spans, len(audio), audio=audio, transcriber=asr)
    # Each segment's own samples at 16 kHz; "Yes." is one sentence, with nothing inside it to time.
    assert pipe.calls == [(16000, 16000, "word"), (12800, 16000, "word")]
    assert [c.text for c in found.cues] == ["Hello there.", "How are you?", "Yes.", "Fine.", "Thanks."]
    assert found.cues[1].start == 0.5 and found.cues[4].start == (SAMPLE_RATE + 4800) / SAMPLE_RATE + 0.3
    assert not found.estimated and found.note is None


def test_with_asr_off_the_captions_say_why_they_are_estimated():
    found = captions(["One. Two."], [(0, SAMPLE_RATE)], SAMPLE_RATE, audio=np.zeros(SAMPLE_RATE, np.float32),
                     transcriber=Transcriber(None))
    assert found.estimated and "--asr none" in found.note


def test_bad_spans_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="ordered"):
        cues(["a", "b"], [(0, 100), (50, 200)], 300)
    with pytest.raises(ValueError, match="caption level"):
        cues(["a"], [(0, 100)], 100, level="paragraph")


def test_cue_text_never_ends_a_cue_early():
    cue = Cue(0.0, 1.0, "a --> b", 0, False)
    assert next(srt.parse(to_srt([cue]))).content == "a → b"
    assert webvtt.from_buffer(io.StringIO(to_vtt([cue]))).captions[0].text == "a → b"


# ------------------------------------------------------------------------------------------ the HTTP API
@pytest.fixture(scope="module")
def api_client(engine):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api
    from studio.takes.service import StudioService

    service = StudioService(engine)
    app = FastAPI()
    api.register(app, service, request_timeout=120.0)
    with TestClient(app) as client:
        yield client
    service.close()


def test_the_api_answers_audio_and_sentence_timestamps_in_one_json(api_client):
    import base64

    import soundfile as sf

    r = api_client.post("/v1/audio/speech", json={"input": "Hello there. How are you today?", "timestamps": "sentence",
                                                  "response_format": "wav", "max_frames": 4, "seed": 1})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    audio, rate = sf.read(io.BytesIO(base64.b64decode(body["audio"])))
    assert body["audio_format"] == "audio/wav" and rate == SAMPLE_RATE
    stamps = body["timestamps"]
    assert [s["text"] for s in stamps] == ["Hello there.", "How are you today?"]
    assert stamps[0]["start_time"] == 0.0 and abs(stamps[-1]["end_time"] - len(audio) / rate) < 1e-9
    assert stamps[0]["end_time"] == stamps[1]["start_time"] and all(s["estimated"] for s in stamps)
    assert body["estimated"] and "character share" in body["timestamps_note"]


def test_the_api_streams_word_timestamps_over_sse_with_exact_breaks(api_client):
    import json

    r = api_client.post("/v1/audio/speech", json={
        "input": "<speak>One two.<break time='1s'/>Three <unknown>four</unknown>.</speak>", "timestamps": "word",
        "stream_format": "sse", "response_format": "pcm", "max_frames": 4, "seed": 2})
    assert r.status_code == 200 and "<unknown>" in r.headers["x-warnings"]
    events = [json.loads(line[6:]) for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events][-2:] == ["speech.audio.timestamps", "speech.audio.done"]
    import base64
    pcm = np.frombuffer(b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"),
                        np.int16)
    stamps = events[-2]["timestamps"]
    assert [s["word"] for s in stamps] == ["One", "two.", "Three", "four."] == [s["text"] for s in stamps]
    assert [s["segment"] for s in stamps] == [0, 0, 1, 1]
    second = round(stamps[2]["start_time"] * SAMPLE_RATE)  # the second segment's first sample
    assert not np.any(pcm[second - SAMPLE_RATE:second]) and np.any(pcm[second:second + 100])
    assert abs(stamps[-1]["end_time"] - len(pcm) / SAMPLE_RATE) < 1e-9
    assert not stamps[2]["estimated"] or stamps[3]["estimated"]  # "Three"'s end is inside its segment


def test_bad_ssml_is_a_400_that_says_why(api_client):
    r = api_client.post("/v1/audio/speech", json={"input": "<speak>Hi <break></speak>", "timestamps": "word"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_ssml"
    assert "not well-formed" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------------ the files, strictly
SRT_TIMING = re.compile(r"\d{2}:\d{2}:\d{2},\d{3} --> \d{2}:\d{2}:\d{2},\d{3}")
ESTIMATED_CUES = [Cue(0.0, 1.0, "First one.", 0, False), Cue(1.0, 2.5, "Second one.", 0, True),
                  Cue(2.5, 3.25, "Third.", 1, True)]


def test_srt_timing_lines_are_the_formats_own_and_the_estimate_is_said_beside_them():
    text = to_srt(ESTIMATED_CUES)
    timing = [line for line in text.splitlines() if "-->" in line]
    assert timing == ["00:00:00,000 --> 00:00:01,000", "00:00:01,000 --> 00:00:02,500",
                      "00:00:02,500 --> 00:00:03,250"]
    assert all(SRT_TIMING.fullmatch(line) for line in timing) and "estimated" not in text
    parsed = list(srt.parse(text, ignore_errors=False))  # strict: anything after the times is an error
    assert [(p.content, p.proprietary) for p in parsed] == [("First one.", ""), ("Second one.", ""), ("Third.", "")]
    vtt = to_vtt(ESTIMATED_CUES)
    assert all(not line.endswith("estimated") for line in vtt.splitlines() if "-->" in line)
    assert vtt.startswith("WEBVTT\n\nNOTE ") and [c.as_dict()["estimated"] for c in ESTIMATED_CUES] == [False, True,
                                                                                                     True]


@pytest.mark.parametrize("kind", ["srt", "vtt"])
def test_webvtt_py_and_ffmpeg_read_our_files(kind, tmp_path):
    import shutil
    import subprocess

    path = tmp_path / f"take.{kind}"
    path.write_text(to_srt(ESTIMATED_CUES) if kind == "srt" else to_vtt(ESTIMATED_CUES), encoding="utf-8")
    read = webvtt.from_srt(str(path)) if kind == "srt" else webvtt.read(str(path))
    assert [(c.start, c.end, c.text) for c in read.captions] == [
        ("00:00:00.000", "00:00:01.000", "First one."), ("00:00:01.000", "00:00:02.500", "Second one."),
        ("00:00:02.500", "00:00:03.250", "Third.")]
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not on PATH (apt-get install ffmpeg)")
    out = tmp_path / "take.ass"
    run = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", "-i", str(path), str(out)], check=False,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr
    events = [line for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("Dialogue:")]
    assert [e.split(",")[1:3] for e in events] == [["0:00:00.00", "0:00:01.00"], ["0:00:01.00", "0:00:02.50"],
                                                   ["0:00:02.50", "0:00:03.25"]]
    assert [e.rsplit(",", 1)[1] for e in events] == ["First one.", "Second one.", "Third."]


# ------------------------------------------------------------------------------------------ the page
def test_the_cue_list_shows_times_finer_than_a_second():
    from studio.audio.captions import Captions, captions_html

    three = [Cue(0.0, 0.8, "One.", 0, False), Cue(0.8, 1.65, "Two.", 1, False), Cue(1.65, 62.5, "Three.", 2, False),
             Cue(62.5, 599.97, "Four.", 3, False)]
    shown = re.findall(r'<span class="hs-cue-time">([^<]*)</span>', captions_html(Captions(three), "long-take"))
    assert shown == ["0:00.0", "0:00.8", "0:01.6", "1:02.5"]  # 1.65 s is a tenth away, not "0:01"


def test_the_panel_under_a_player_gives_its_subtitles_the_cue_list_and_downloads(tmp_path):
    import gradio as gr

    from engine.types import SamplingParams
    from studio.audio.formats import write_audio
    from studio.takes.service import Order, StudioService
    from studio.views.captions import CaptionsPanel
    from tests.fakes import FakeEngine

    service = StudioService(FakeEngine(frames=25))
    try:
        take = service.synthesize(Order(text="<|emotion:awe|>First one. Second one here.",
                                                   params=SamplingParams(seed=3), door="ui"))
    finally:
        service.close()
    with gr.Blocks():
        panel = CaptionsPanel(tmp_path, "take")
        panel.build()
    wav = write_audio(tmp_path / "take-1.wav", take.audio, take.sample_rate)
    player, html, srt_button, _ = panel.show(take, wav, "take-1")
    assert isinstance(player, gr.Audio)  # the take's player, now with its subtitles
    assert [s["text"] for s in player.subtitles] == ["First one.", "Second one here."]
    assert player.subtitles[0]["start"] == 0.0 and player.subtitles[-1]["end"] == take.seconds
    assert 'data-player="take"' in html and html.count('class="estimated"') == 2
    parsed = list(srt.parse((tmp_path / "take-1.srt").read_text(encoding="utf-8")))
    assert [p.content for p in parsed] == ["First one.", "Second one here."]
    assert srt_button["visible"] and srt_button["value"] == str(tmp_path / "take-1.srt")
    assert (tmp_path / "take-1.vtt").read_text(encoding="utf-8").startswith("WEBVTT\n\nNOTE ")
    assert panel.show(None, None, "")[1] == '<div class="hs-captions" data-player="take"></div>'


# ------------------------------------------------------------------------------------------ long audio, the line
def test_audio_longer_than_one_whisper_window_is_heard_window_by_window():
    from studio.audio.asr import ASR_RATE, MAX_SECONDS, windows

    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(70 * SAMPLE_RATE)).astype(np.float32)
    for pause in (27.0, 54.0):  # a quiet 300 ms inside each window's last 5 s
        audio[int(pause * SAMPLE_RATE):int((pause + 0.3) * SAMPLE_RATE)] = 0.0
    pipe = AsrPipeline([[("one", 1.0)], [("two", 2.0)], [("three", 3.0)], [("four", 0.5)]])
    asr = Transcriber("fake", make_pipeline=lambda model, device: pipe)
    heard = asr.words(audio, SAMPLE_RATE)
    lengths = [n for n, _, _ in pipe.calls]
    assert len(lengths) == 3 and max(lengths) <= MAX_SECONDS * ASR_RATE and sum(lengths) == 70 * ASR_RATE
    cuts = np.cumsum(lengths)[:-1] / ASR_RATE  # each window ends inside the pause
    assert 27.0 < cuts[0] < 27.3 and 54.0 < cuts[1] < 54.3
    assert [w.word for w in heard] == ["one", "two", "three"]
    assert heard[0].start == 1.0 and heard[1].start == cuts[0] + 2.0 and heard[2].start == cuts[1] + 3.0
    assert windows(np.zeros(10, np.float32)) == [(0, 10)] and windows(np.zeros(0, np.float32)) == [(0, 0)]
    assert asr.transcribe(audio, SAMPLE_RATE) == ("four", None)  # a clip is heard for its first window only
    assert pipe.calls[-1][0] == MAX_SECONDS * ASR_RATE


def test_a_caption_transcription_takes_its_turn_in_the_gpu_line():
    """The page's and the API's transcriptions are device work: with the one slot busy, a caption's words wait
    for the take ahead of them, and they are heard on the line's worker, not the handler's thread."""
    import threading

    from studio.takes.admission import Caller
    from studio.takes.service import Order, StudioService
    from tests.fakes import FakeEngine

    heard_at = []  # (the take ahead had finished, on the main thread) at each transcription

    class Watching(AsrPipeline):
        def __call__(self, inputs, return_timestamps=None):
            heard_at.append((handle.finished.is_set(), threading.current_thread() is threading.main_thread()))
            return super().__call__(inputs, return_timestamps)

    asr = Transcriber("fake", make_pipeline=lambda model, device: Watching([[("Hi.", 0.0)]]))
    service = StudioService(FakeEngine(frames=40, delay=0.01), None, None)
    try:
        handle = service.start(Order(text="A take that holds the slot.", caller=Caller("v1")))
        chunks = handle.stream()
        next(chunks)  # the take is running: it holds the line's one slot
        drain = threading.Thread(target=lambda: list(chunks))
        drain.start()
        words = service.transcriber_for(asr, Caller("v2")).words(np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE)
        drain.join()
    finally:
        service.close()
    assert [w.word for w in words] == ["Hi."]
    assert heard_at == [(True, False)]
    assert service.transcriber_for(None) is None


def test_with_the_line_busy_the_captions_are_estimated_and_say_so():
    from studio.takes.gpu_queue import ServiceBusy

    def busy(fn, *args):
        raise ServiceBusy("no slot")

    asr = Transcriber("fake", make_pipeline=lambda model, device: AsrPipeline([])).through(busy)
    found = captions(["One. Two."], [(0, SAMPLE_RATE)], SAMPLE_RATE, audio=np.zeros(SAMPLE_RATE, np.float32),
                     transcriber=asr)
    assert found.estimated and "GPU was busy" in found.note
