"""Hostile text and careless takes: SSML behind an XML prolog or with a DTD (engine/ssml.py), pauses that add
up without bound (engine/longform.py, engine/joins.py, engine/longtake.py), and a take's true peak with no
loudness target (engine/peaks.py, studio/takes/service.py)."""

from __future__ import annotations

import tracemalloc

import httpx
import numpy as np
import pytest

from engine.config import SAMPLE_RATE
from engine.longform import MAX_PAUSE_SECONDS, plan
from engine.longtake import LongTake
from engine.ssml import read_text
from engine.types import SamplingParams
from studio.audio.formats import to_pcm16
from studio.audio.loudness import to_db, true_peak
from studio.takes.service import StudioService, Order

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

CEILING_DB = -1.0  # the ceiling the issue asks for on every take
# How far over the ceiling a limited take's true peak may read: the meter oversamples the gain's own
# movement, which the limiter's per-sample need does not see. Measured ≤ 0.01 dB on the demo's takes.
CEILING_TOLERANCE_DB = 0.05
FULL_SCALE = 32767


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine()


def speech(studio, body: dict) -> httpx.Response:
    """A small take asked of a running studio (few frames, so a take the old code let through is quick)."""
    return httpx.post(f"{studio.url}/v1/audio/speech", timeout=120,
                      json={"model": "higgs-audio-v3-tts", "response_format": "pcm", "seed": 5, "max_frames": 6,
                            **body})


# ------------------------------------------------------------------------------------------- SSML's prolog
W3C = ('<?xml version="1.0"?>\n<!DOCTYPE speak PUBLIC "-//W3C//DTD SYNTHESIS 1.0//EN" '
       '"http://www.w3.org/TR/speech-synthesis/synthesis.dtd">\n'
       '<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis">Hello there.</speak>')
LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
          + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">' for i in range(1, 10))
          + ']><speak>&lol9;</speak>')
XXE = '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>'
COMMENTED_DTD = '<!-- made by hand --><!DOCTYPE speak [<!ENTITY a "b">]><speak>&a;</speak>'


@pytest.mark.parametrize("prolog", ["<!-- read by the studio -->\n", '<?xml version="1.0"?>\n<!-- a note -->\n',
                                    '<?xml version="1.0"?><?xml-stylesheet href="s.xsl"?>',
                                    "\ufeff<!-- a --> <!-- b -->"],
                         ids=["comment", "declaration and comment", "processing instruction", "bom and comments"])
def test_ssml_behind_an_xml_prolog_is_read_as_ssml(prolog):
    # Before: not detected, so the markup itself was the text to speak.
    read = read_text(prolog + '<speak>Wait <break time="1s"/> now.</speak>')
    assert read.text == "Wait [pause 1s] now."


@pytest.mark.parametrize("ssml", [W3C, LAUGHS, XXE, COMMENTED_DTD],
                         ids=["w3c doctype line", "billion laughs", "external entity", "comment then dtd"])
def test_a_dtd_before_the_root_is_400_invalid_ssml(demo_studio, ssml):
    # Before: 200, and the markup read aloud.
    r = speech(demo_studio, {"input": ssml})
    assert r.status_code == 400, r.status_code
    error = r.json()["error"]
    assert error["code"] == "invalid_ssml" and error["param"] == "input"
    assert "may not contain a DOCTYPE" in error["message"], error["message"]
    assert "Error" not in error["message"] and "Traceback" not in error["message"]


# ------------------------------------------------------------------------------------------- pauses
BREAKS = 200
HUNDREDS_OF_BREAKS = "<speak>Hello there." + '<break time="10s"/>' * BREAKS + "Goodbye now.</speak>"  # 3.8 k chars


def test_breaks_in_a_row_clamp_to_one_breaks_cap():
    # Before: the 200 breaks added up to one 2,000 s pause.
    assert len(HUNDREDS_OF_BREAKS) < 4_000
    notes: list[str] = []
    segments = plan(read_text(HUNDREDS_OF_BREAKS).text, notes=notes)
    assert [s.pause_after for s in segments] == [MAX_PAUSE_SECONDS, 0.0]
    assert notes and f"{MAX_PAUSE_SECONDS:g} s" in notes[0]


def test_pauses_past_the_takes_budget_are_refused_naming_it():
    from engine.longform import PAUSE_BUDGET_SECONDS

    # 200 breaks with a word between each: 2,000 s of silence around ~40 s of speech. Before: planned as is.
    text = read_text("<speak>" + 'Go. <break time="10s"/>' * BREAKS + "</speak>").text
    with pytest.raises(ValueError, match=f"at most {PAUSE_BUDGET_SECONDS:g} s") as refused:
        plan(text)
    assert "2,000 s" in str(refused.value)
    # A take's pauses up to the budget are kept exactly.
    fine = plan(read_text("<speak>" + 'Go. <break time="10s"/>' * 6 + "End.</speak>").text)
    assert sum(s.pause_after for s in fine) == pytest.approx(60.0)


def test_pauses_past_the_budget_are_a_400_naming_it(demo_studio):
    text = "<speak>" + 'Go. <break time="10s"/>' * BREAKS + "</speak>"
    with httpx.stream("POST", f"{demo_studio.url}/v1/audio/speech", timeout=120,
                      json={"model": "higgs-audio-v3-tts", "input": text, "response_format": "pcm",
                            "max_frames": 2}) as r:
        status = r.status_code  # before: 200, and 2,000 s of silence streamed
        body = r.read() if status != 200 else b""
    assert status == 400
    assert "pauses may add up to at most 60 s" in httpx.Response(400, content=body).json()["error"]["message"]


def test_the_200_breaks_take_streams_its_silence_in_bounded_blocks(engine):
    from engine.joins import SILENCE_BLOCK

    # Before: one 2,000 s pause, allocated whole (192 MB of float32, more as it was joined to its segment).
    service = StudioService(engine)
    request = Order(text=HUNDREDS_OF_BREAKS, params=SamplingParams.of(seed=3, max_frames=4))
    tracemalloc.start()
    try:
        handle = service.start(request)
        chunks = list(handle.stream())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    service.close()
    assert chunks[-1].final and chunks[-1].metrics.stop_reason == "eoc"
    assert any("10 s" in w for w in handle.warnings), handle.warnings
    take = handle.take
    silence = take.total_samples() - sum(take.lengths)
    assert silence == MAX_PAUSE_SECONDS * SAMPLE_RATE
    pauses = [c.audio for c in chunks if len(c.audio) and not c.audio.any()]
    assert pauses and max(len(p) for p in pauses) <= SILENCE_BLOCK
    assert peak < 24 * 2**20, f"{peak / 2**20:.0f} MB"


@pytest.mark.parametrize("samples", [0, 1, 11_999, 12_000, 12_001, 240_000, 240_017])
def test_no_silence_block_exceeds_the_block_size(samples):
    from engine.joins import SILENCE_BLOCK, silence_blocks

    blocks = list(silence_blocks(samples))
    assert all(0 < len(b) <= SILENCE_BLOCK for b in blocks) and sum(map(len, blocks)) == samples
    assert all(b.dtype == np.float32 and not b.any() for b in blocks)


def test_a_long_takes_pauses_leave_in_blocks_no_larger_than_the_block(engine):
    from engine.joins import SILENCE_BLOCK

    segments = plan(read_text('<speak>One. <break time="10s"/> Two. <break time="3s"/> Three.</speak>').text)
    take = LongTake(engine, segments, seed=9, max_frames=3)
    chunks = list(take.stream())
    silent = [len(c.audio) for c in chunks if len(c.audio) and not c.audio.any()]
    assert sum(silent) == 13 * SAMPLE_RATE and max(silent) <= SILENCE_BLOCK
    assert [c.done for c in chunks if c.done > c.segment] == [1, 2, 3]  # each segment ends once
    assert np.array_equal(np.concatenate([c.audio for c in chunks]), take.assemble())


# ------------------------------------------------------------------------------------------- true peak
def over_full_scale(audio: np.ndarray) -> int:
    return int(np.count_nonzero(np.abs(to_pcm16(audio).astype(np.int32)) >= FULL_SCALE))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_plain_take_without_a_target_stays_under_the_ceiling(engine, seed):
    # Before: +2.9, +4.3 and +7.6 dBTP for these seeds, 11, 10 and 521 samples at int16 full scale.
    service = StudioService(engine)
    take = service.synthesize(Order(text="The kettle is on.",
                                               params=SamplingParams.of(seed=seed, max_frames=25)))
    service.close()
    peak_db = to_db(true_peak(take.audio))
    assert peak_db <= CEILING_DB + CEILING_TOLERANCE_DB, f"{peak_db:+.2f} dBTP"
    assert over_full_scale(take.audio) == 0
    ceiling = take.recipe()["peak_ceiling"]
    assert ceiling["dbtp"] == CEILING_DB and ceiling["gain_db"] < -1.0  # the demo's noise is always over it


def test_a_streamed_take_is_held_under_the_ceiling_as_it_streams(demo_studio):
    # Before: streamed as made, over the ceiling (the demo's takes peak at +2 to +8 dBTP).
    r = speech(demo_studio, {"input": "The kettle is on.", "max_frames": 25, "seed": 3})
    assert r.status_code == 200, r.text
    audio = np.frombuffer(r.content, "<i2").astype(np.float32) / FULL_SCALE
    assert len(audio) > SAMPLE_RATE // 2
    assert to_db(true_peak(audio)) <= CEILING_DB + CEILING_TOLERANCE_DB
    assert over_full_scale(audio) == 0


def test_a_long_take_stays_under_the_ceiling_and_says_what_the_limiter_took(engine):
    segments = plan("The first line is here. The second line follows it.\n\nA new paragraph ends the take.",
                    min_seconds=0.5, max_seconds=2.0)
    take = LongTake(engine, segments, seed=4, max_frames=20)
    streamed = np.concatenate([c.audio for c in take.stream()])
    assert np.array_equal(streamed, take.assemble())
    assert to_db(true_peak(streamed)) <= CEILING_DB + CEILING_TOLERANCE_DB and over_full_scale(streamed) == 0
    ceiling = take.recipe()["peak_ceiling"]
    assert ceiling["dbtp"] == CEILING_DB and ceiling["gain_db"] < -1.0


def test_the_streaming_limiter_is_the_whole_takes_limiter():
    from engine.peaks import PeakLimiter
    from studio.audio.loudness import limit

    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(3 * SAMPLE_RATE) * 0.4).astype(np.float32)  # peaks far over −1 dBTP
    limiter = PeakLimiter()
    pieces, at = [], 0
    for size in rng.integers(1, 5000, 200):
        pieces.append(limiter.feed(audio[at:at + size]))
        at += int(size)
    pieces += [limiter.feed(audio[at:]), limiter.flush()]
    streamed = np.concatenate(pieces)
    whole = limit(audio, SAMPLE_RATE, limiter.target_db)
    assert len(streamed) == len(audio) and np.allclose(streamed, whole, atol=1e-6)
    assert to_db(true_peak(streamed)) <= CEILING_DB + CEILING_TOLERANCE_DB and limiter.gain_db < -6
