"""The Studio tab's plan line under the text box: what Generate will do ("one take, ~6 s", "long take: 31
segments, ~3 min"), a bad order's sentence instead, nothing for an empty box; the page's handler called
in-process over the service with a scripted engine, and its wiring read from the built Blocks."""

from __future__ import annotations

import re

import pytest

from studio.api.access import Access
from studio.takes.service import StudioService
from studio.views.page import Page
from studio.voices import VoiceLibrary
from tests.fakes import FakeEngine

SENTENCE = "The quiet river carried the last of the autumn leaves past the mill and into the town. "


@pytest.fixture
def page(tmp_path):
    service = StudioService(FakeEngine(), VoiceLibrary(tmp_path / "voices"), None)
    page = Page(service)
    page.blocks = page.build()
    yield page
    service.close()


def plan(page, text, **kw):
    form = {"text": text, "style": "", "voice": "", "clip": None, "clip_text": "", "temperature": 0.8,
            "top_p": 0.8, "top_k": 30, "seed": -1, "max_frames": 0, "repeat_guard": 32, "clean": False,
            "clean_actions": "speak", "request": None}
    return page.takes.plan(**{**form, **kw})


def test_a_short_text_is_one_take(page):
    line = plan(page, "Hello there, this is the studio.")
    assert re.search(r"one take, ~\d+ s", line)
    assert "long take" not in line


def test_a_text_longer_than_one_prompt_is_a_long_take_of_segments(page):
    text = SENTENCE * 35  # ~3,000 characters, some three minutes of speech
    assert 2900 < len(text) < 3100
    found = re.search(r"long take: (\d+) segments, ~\d+ min", plan(page, text))
    assert found and int(found.group(1)) > 1


def test_an_unknown_voice_shows_its_sentence_naming_the_voice(page):
    line = plan(page, "Hello there.", voice="Nobody At All")
    assert "No voice called &#x27;Nobody At All&#x27;" in line and "one take" not in line


def test_an_empty_text_shows_nothing(page):
    assert plan(page, "") == ""
    assert plan(page, "  \n ") == ""
    assert plan(page, None) == ""


def test_a_visitor_of_a_public_page_is_planned_with_the_public_limits():
    service = StudioService(FakeEngine(), None, None)
    try:
        visitor_page = Page(service, Access("key", public_page=True))  # no request: not the owner
        line = plan(visitor_page, SENTENCE * 15)  # ~1,300 characters, over a visitor's 1,000
        assert "The public page speaks up to 1000 characters" in line and "long take" not in line
        assert "long take" in plan(Page(service), SENTENCE * 15)  # the owner's own page plans it whole
    finally:
        service.close()


def test_the_plan_line_follows_the_text_voice_and_style(page):
    fns = [f for f in page.blocks.fns.values() if f.fn == page.takes.plan]
    studio = page.studio
    assert fns and all(f.outputs == [studio.plan] and f.trigger_mode == "always_last" for f in fns)
    triggers = {target for f in fns for target in f.targets}
    for component in (studio.text, studio.voice, studio.style):
        assert (component._id, "change") in triggers
    assert all(studio.text in f.inputs and studio.voice in f.inputs and studio.style in f.inputs for f in fns)


def test_one_take_shows_its_frame_budget_and_the_plans_notes(page):
    line = plan(page, "Hello <|bogus|> there.", max_frames=50)
    assert "budget 50 frames (2 s)" in line and "auto" not in line
    assert 'class="hs-lint"' in line and "bogus" in line  # the tag lint Generate would warn with
    assert re.search(r"budget \d+ frames \(\d+ s, auto\)", plan(page, "Hello there."))


def test_a_take_its_length_cap_would_cut_says_so_before_generate(page):
    text = "This sentence takes a good few seconds to say, far more than one second."
    line = plan(page, text, max_frames=25)  # 1 s
    assert re.search(r"one take, ~\d+ s, but cut at 1 s: Max length is shorter than the text", line)
    assert "cut" not in plan(page, text)  # the automatic cap fits the text
