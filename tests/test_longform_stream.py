"""A 3,000-character text streamed as one take on the demo checkpoint, and the join shaping
(engine/longtake.py) on synthetic audio."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import SAMPLE_RATE
from engine.joins import FADE_SECONDS, KEEP_SECONDS, MAX_GAIN_DB, WINDOW, shape_segment, speech_rms
from engine.longform import PARAGRAPH_PAUSE, SENTENCE_PAUSE, plan
from engine.longtake import LongTake
from tests.helpers import tone

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

# A join may not step by more than this between neighbouring samples (−60 dBFS): the fades take every
# segment to within ~1e-4 of zero at its ends, while the demo's noise-like audio steps by ~0.1.
JOIN_STEP = 1e-3

PARAGRAPH = ("The lighthouse keeper climbed the stairs every evening at six. He wound the clock, trimmed the wick "
             "and polished the great lens until it shone. <|emotion:contemplation|>Some nights he wondered who "
             "was out there, watching the beam sweep across the water. Ships passed without a sound. In the "
             "morning he wrote the weather in his book: wind, cloud, the height of the waves. ")


def long_text() -> str:
    paragraphs = []
    while sum(map(len, paragraphs)) < 3000:
        paragraphs.append(PARAGRAPH.strip())
    return "\n\n".join(paragraphs)


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine()


def test_a_long_text_streams_as_the_assembled_take(engine):
    text = long_text()
    assert len(text) >= 3000
    segments = plan(text)
    assert len(segments) >= 8
    calls = []
    real = engine.generate_stream

    def counting(*args, **kwargs):  # how many engine chunks exist when the take's first audio comes
        for chunk in real(*args, **kwargs):
            calls.append(chunk)
            yield chunk

    engine.generate_stream = counting
    try:
        take = LongTake(engine, segments, seed=2026)
        chunks = []
        for chunk in take.stream():
            if not chunks:
                first_after = len(calls)
            chunks.append(chunk)
    finally:
        del engine.generate_stream
    # TTFA is a short take's: the first audio leaves as soon as the engine's first chunk of a one-sentence
    # prompt (the same prompt a one-sentence take builds) exists. (Times: docs/PERFORMANCE.md.)
    assert first_after == 1 and len(chunks[0].audio) > 0
    assert take.prompts[0].ids == engine.build_prompt(segments[0].text).ids
    assert [c.done for c in chunks][-1] == len(segments) == chunks[-1].total

    streamed = np.concatenate([c.audio for c in chunks])
    assembled = take.assemble()
    assert np.array_equal(streamed, assembled)

    spans = take.spans()
    for i, segment in enumerate(segments[:-1]):
        end, start = spans[i][1], spans[i + 1][0]
        assert start - end == round(segment.pause_after * SAMPLE_RATE)
        assert segment.pause_after in (SENTENCE_PAUSE, PARAGRAPH_PAUSE)
        assert not assembled[end:start].any()
        # No step at either side of the pause: the fades end on (nearly) zero.
        assert abs(assembled[end - 1]) < JOIN_STEP and abs(assembled[start]) < JOIN_STEP
    assert sum(s.pause_after == PARAGRAPH_PAUSE for s in segments) == text.count("\n\n")


def test_a_join_trims_silence_to_the_kept_decay():
    silence = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([silence[:SAMPLE_RATE // 2], tone(1.0, pitch=220, amplitude=0.3), silence])
    shaped = shape_segment(audio, trim_start=True, reference_rms=None)
    keep = int(KEEP_SECONDS * SAMPLE_RATE)
    assert len(shaped) == SAMPLE_RATE + 2 * keep  # 40 ms kept on each side of the tone
    untrimmed_start = shape_segment(audio, trim_start=False, reference_rms=None)
    assert len(untrimmed_start) == SAMPLE_RATE // 2 + SAMPLE_RATE + keep


def test_a_join_fades_both_ends():
    shaped = shape_segment(np.full(SAMPLE_RATE // 2, 0.5, np.float32), trim_start=True, reference_rms=None)
    fade = int(FADE_SECONDS * SAMPLE_RATE)
    assert abs(shaped[0]) < JOIN_STEP and abs(shaped[-1]) < JOIN_STEP  # unfaded, the step would be 0.5
    assert np.abs(np.diff(shaped)).max() < 0.01  # a raised cosine over 120 samples: at most 0.5·π/240
    assert np.all(shaped[fade:-fade] == 0.5)


def test_loudness_is_matched_within_limits():
    quiet, loud = tone(1.0, pitch=220, amplitude=0.05), tone(1.0, pitch=220, amplitude=0.3)
    reference = speech_rms(tone(1.0, pitch=220, amplitude=0.1))
    matched = speech_rms(shape_segment(quiet, trim_start=True, reference_rms=reference))
    assert matched == pytest.approx(reference, rel=0.01)
    # 0.3 → 0.1 would need −9.5 dB: the gain stops at −MAX_GAIN_DB.
    limited = speech_rms(shape_segment(loud, trim_start=True, reference_rms=reference))
    assert limited == pytest.approx(speech_rms(loud) * 10 ** (-MAX_GAIN_DB / 20), rel=0.01)
    assert WINDOW * 100 == SAMPLE_RATE
