"""Pauses and the SSML subset (engine/ssml.py, engine/longform.py): a break or a [pause] marker is exactly
that much silence at a join of the long take; the subset maps onto our tags; malicious SSML is refused
quickly, in bounded memory, with a sentence."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from engine.config import SAMPLE_RATE
from engine.longform import SENTENCE_PAUSE, model_pauses, plan, split_pauses
from engine.longtake import LongTake
from engine.ssml import MAX_DEPTH, MAX_SSML_CHARS, from_ssml, is_ssml, read_text
from studio.takes.prepare import is_long
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine


def test_the_subset_maps_onto_our_text_and_tags():
    read = from_ssml('<speak xmlns="http://www.w3.org/2001/10/synthesis">Hello <break time="1.5s"/> world. '
                     '<sub alias="World Wide Web">WWW</sub> is <emphasis level="strong">big</emphasis>. '
                     '<prosody rate="slow">Slowly now.</prosody> <prosody rate="x-fast">Quick!</prosody> '
                     '<break time="250ms"/><break strength="strong"/>End.</speak>')
    assert read.text == ("Hello [pause 1.5s] world. World Wide Web is big. <|prosody:speed_slow|>Slowly now. "
                         "<|prosody:speed_very_fast|>Quick! [pause 0.25s] [pause 0.75s] End.")
    assert read.warnings == []


def test_what_is_not_supported_is_dropped_with_a_warning_naming_it():
    read = from_ssml('<speak><p><s>One.</s><s>Two <say-as interpret-as="characters">AB</say-as>.</s></p>'
                     '<p><phoneme alph="ipa" ph="x">Three</phoneme>. <prosody pitch="high" rate="80%">Four.</prosody>'
                     '</p></speak>')
    assert read.text == "One.Two AB.\n\nThree. <|prosody:speed_slow|>Four."
    assert read.warnings[0] == "<prosody pitch> is not supported (only rate); it was ignored"
    assert read.warnings[-1] == ("SSML elements not supported were dropped (their text kept): <phoneme>, <s> ×2, "
                                 "<say-as>")


def test_ssml_is_detected_by_its_root_or_asked_for():
    assert is_ssml('<?xml version="1.0"?>\n<speak>Hi</speak>') and is_ssml("  <speak version='1.1'>Hi</speak>")
    assert not is_ssml("I <speak> softly") and not is_ssml("<speaker>x</speaker>")
    assert read_text("Hi <break time='1s'/> there", ssml=True).text == "Hi [pause 1s] there"
    assert read_text("<speak>kept as typed</speak>", ssml=False).text == "<speak>kept as typed</speak>"
    assert read_text("no markup", ssml=None).text == "no markup"


@pytest.mark.parametrize("bad, message", [
    ("<speak>Hi <break time='1s'></speak>", "not well-formed"),
    ("<voice>Hi</voice>", "root element is <voice>"),
    ("<speak>" + "a" * MAX_SSML_CHARS + "</speak>", "limit is"),
], ids=["unclosed", "no speak root", "too long"])
def test_bad_ssml_gets_a_sentence(bad, message):
    with pytest.raises(ValueError, match=message):
        from_ssml(bad)


BILLION_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                  + "".join(f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'
                            for i in range(1, 10))
                  + ']><speak>&lol9;</speak>')
EXTERNAL = '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>'


MALICIOUS = {
    "billion laughs": (BILLION_LAUGHS, "DTD or entities"),
    "external entity": (EXTERNAL, "DTD or entities"),
    "deep nesting": ("<speak>" + "<s>" * 12_000 + "x" + "</s>" * 12_000 + "</speak>", "more than 16 deep"),
    "1 MB": ("<speak>" + "<break/>" * (2**20 // 8) + "</speak>", "limit is"),
    "many elements": ("<speak>" + "<break/>" * 12_000 + "</speak>", "more than 10000 elements"),
}


@pytest.mark.parametrize("name", MALICIOUS)
def test_malicious_ssml_is_refused_in_bounded_time_and_memory(name):
    ssml, message = MALICIOUS[name]
    tracemalloc.start()
    started = time.thread_time()  # this thread's CPU time: the parser's own work, whatever else runs
    try:
        with pytest.raises(ValueError, match=message):
            from_ssml(ssml)
        elapsed = time.thread_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 2.0, f"{name}: {elapsed:.2f} s of CPU"  # ~0.5 s at most here, with tracemalloc on
    assert peak < 32 * 2**20, f"{name}: {peak / 2**20:.1f} MB"


def test_nesting_at_the_limit_is_read():
    depth = MAX_DEPTH - 1
    assert from_ssml("<speak>" + "<emphasis>" * depth + "deep" + "</emphasis>" * depth + "</speak>").text == "deep"


def test_pause_markers_cut_segments_and_set_their_pause():
    assert split_pauses("a [pause 2s] b [PAUSE 300ms][pause]") == [("a", 2.0), ("b", 0.3), ("", 0.5), ("", 0.0)]
    segments = plan("One is here. Two is here. [pause 1.5s] Three [pause 2s][pause 250ms] four.\n\n"
                    "Five. [pause 0.7s]\n\nSix. [pause 30s]", normalize=False)
    assert [s.text for s in segments] == ["One is here.", "Two is here.", "Three", "four.", "Five.", "Six."]
    # a sentence join, a marker, two markers added up, a paragraph's end (replaced by its marker), a
    # marker capped at 10 s at the take's end
    assert [s.pause_after for s in segments] == [SENTENCE_PAUSE, 1.5, 2.25, 0.5, 0.7, 10.0]
    assert plan("[pause 3s] Hi.")[0].pause_after == 0.0  # no join before the first speech


def test_a_tiny_break_is_still_a_pause_and_never_read_aloud():
    for time_ in ("0.01ms", "0.00001s", "0s"):
        segments = plan(from_ssml(f"<speak>One.<break time='{time_}'/>Two.</speak>").text, normalize=False)
        assert [s.text for s in segments] == ["One.", "Two."], time_  # "1e-05s" was once spoken as text


def test_a_break_is_exactly_that_much_silence_in_the_take(shared_engine, tiny_checkpoint):
    engine = shared_engine(tiny_checkpoint, precision="fp32")
    text = read_text('<speak>The boat left at dawn.<break time="1.5s"/>The sea was calm.</speak>').text
    assert is_long(text)
    segments = plan(text, normalize=False)
    assert [s.pause_after for s in segments] == [1.5, 0.0]
    take = LongTake(engine, segments, seeds=[3, 4], max_frames=4)
    audio = take.run()
    (_, end), (start, _) = take.spans()
    assert start - end == int(1.5 * SAMPLE_RATE) == 36_000
    assert not np.any(audio[end:start])
    assert np.any(audio[end - 200:end]) and np.any(audio[start:start + 200])  # speech either side, faded


def test_a_pause_is_exact_silence_in_a_long_take_whatever_the_door():
    """One rule for every door (studio/takes/prepare.py): a text with a pause is a long take, whose join puts
    exactly that much silence; the model's own pause tags are left to texts that ask for them."""
    service = StudioService(FakeEngine())
    plan = service.plan(Order(text="<speak>Wait <break time='2s'/> now <foo>x</foo></speak>"))
    assert plan.long and [s.pause_after for s in plan.segments] == [2.0, 0.0]
    assert any("<foo>" in w for w in plan.warnings)
    assert model_pauses("a [pause 0.3s] b") == "a <|prosody:pause|> b"
