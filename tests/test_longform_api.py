"""A long input and a multi-voice script planned (studio/takes/prepare.py) and streamed through the studio's
queue (studio/takes/run.py) on the demo checkpoint, and the Long form tab's helpers (studio/takes/longform.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.delay import apply_delay
from engine.longform import plan
from engine.longtake import LongTake
from engine.types import SamplingParams
from studio.takes.limits import MAX_INPUT_CHARS
from studio.takes.longform import regenerate_segment, segment_rows
from studio.takes.order import Order
from studio.takes.prepare import is_long
from studio.takes.service import StudioService
from studio.voices import VoiceLibrary
from tests.fakes import add_voices

# The demo engine in process, with the app's one torch thread (tests/conftest.py).
pytestmark = pytest.mark.demo_threads

SENTENCE = "The tide came in over the flats, slow and grey, and the birds lifted off the sand. "


@pytest.fixture(scope="module")
def service(tmp_path_factory, shared_engine):
    library = VoiceLibrary(tmp_path_factory.mktemp("voices"))
    service = StudioService(shared_engine(), library)
    add_voices(library, service, (("Narrator", 140.0), ("Guest", 220.0)))
    yield service
    service.close()


@pytest.mark.slow
def test_a_20k_character_input_streams_as_one_long_take(service):
    text = (SENTENCE * 300)[:20_000]
    assert is_long(text) and not is_long("Hello there.")
    request = Order(text=text, params=SamplingParams(seed=77, max_frames=12))
    chunks = list(service.stream(request))
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert chunks[-1].metrics.seed == 77 and chunks[0].metrics.ttfa_ms is not None
    streamed = np.concatenate([c.audio for c in chunks])
    # The same take made directly by the engine, with the same plan and seed.
    direct = LongTake(service.engine, plan(text), seed=77, max_frames=12)
    assert np.array_equal(streamed, direct.run())
    assert chunks[-1].metrics.frames == sum(t.codes.shape[0] for t in direct.takes)


def test_a_script_uses_each_speakers_voice(service, monkeypatch):
    seen = []
    real = service.engine.build_prompt

    def recording(text, *, voice=None):
        seen.append((text, voice))
        return real(text, voice=voice)

    monkeypatch.setattr(service.engine, "build_prompt", recording)
    script = "Host: Welcome back to the show.\n[S2] Thanks for having me.\nHost: Let us begin."
    request = Order(text=script, params=SamplingParams(seed=5, max_frames=10), voices={"Host": "Narrator", "S2": "Guest"})
    chunks = list(service.stream(request))
    assert chunks[-1].final
    codes = {name: service.voices.voice_ref(name, encode=service.encode_codes).codes for name in ("Narrator", "Guest")}
    expected = {"Welcome back to the show.": "Narrator", "Thanks for having me.": "Guest", "Let us begin.": "Narrator"}
    assert {text for text, _ in seen} == set(expected)
    for text, voice in seen:
        assert torch.equal(voice.codes, codes[expected[text]])
        prompt = real(text, voice=voice)
        assert torch.equal(prompt.ref_rows, apply_delay(codes[expected[text]], 1024, 1025))


def test_long_requests_are_checked_before_they_queue(service):
    with pytest.raises(ValueError, match="the map has 'Host'") as info:
        service.start(Order(text="Host: Hi.\nBob: Hello.", voices={"Host": "Narrator"}))
    assert "'Bob'" in str(info.value)
    with pytest.raises(ValueError, match=f"the limit for one take is {MAX_INPUT_CHARS}"):
        service.start(Order(text="a" * (MAX_INPUT_CHARS + 1)))
    with pytest.raises(ValueError, match="^temperature"):
        SamplingParams(temperature=5)  # a long take's settings are checked where they are built, as a short one's
    assert service.queue_depth == 0


def test_the_page_helpers_fill_the_table_and_regenerate_one_row(service):
    text = "\n\n".join([SENTENCE * 3] * 4)
    request = Order(text=text, params=SamplingParams(seed=9, max_frames=10), door="ui")
    handle = service.start(request, pieces=True)
    pieces = list(handle.stream())
    assert handle.finished.is_set() and handle.take is pieces[-1][0] and handle.seed == 9
    take = pieces[-1][0]
    assert all(t is take for t, _ in pieces) and pieces[-1][1].done == len(take.segments)
    rows = segment_rows(take)
    assert [r[0] for r in rows] == list(range(1, len(take.segments) + 1))
    assert all(r[5] in ("done", "cut short: too long", "cut short: repeating") for r in rows)
    before, spans = take.assemble(), take.spans()
    after = regenerate_segment(service, take, 2, seed=12345)
    redone = take.takes[2]
    assert redone.seed == 12345 + redone.retried  # cut short again, it moves on to the next seed
    assert segment_rows(take)[2][3] == redone.seed
    for i, ((a, b), (c, d)) in enumerate(zip(spans, take.spans())):
        assert np.array_equal(before[a:b], after[c:d]) == (i != 2)


def test_a_row_generated_again_gets_a_seed_no_other_row_has(service):
    """Row i's seed is the take's seed + i, so "the next seed" of a row is the next row's: the same reading twice.
    Generated again with no seed given, each row gets one of its own, and never one it tried before."""
    request = Order(text="\n\n".join([SENTENCE] * 4), long=True, params=SamplingParams(seed=40, max_frames=6),
                    door="ui")
    handle = service.start(request, pieces=True)
    take = list(handle.stream())[-1][0]
    assert len(take.segments) >= 3
    for index in (0, 1, 0):
        tried = {a.seed for a in take.takes[index].attempts}
        others = set(take.seeds[:index] + take.seeds[index + 1:])
        regenerate_segment(service, take, index)
        first = take.takes[index].attempts[0].seed  # a cut-short attempt is retried on the next seed (the engine's)
        assert first not in others and first not in tried, (index, first, take.seeds)
