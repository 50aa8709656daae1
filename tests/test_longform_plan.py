"""Long-form planning (engine/longform.py) and text normalisation (engine/normalize.py): pure functions of
the text, no model."""

from __future__ import annotations

import re

import pytest

from engine.longform import (MAX_SEGMENT_SECONDS, MIN_SEGMENT_SECONDS, PARAGRAPH_PAUSE, SENTENCE_PAUSE,
                             TURN_PAUSE, parse_script, plan, split_sentences)
from engine.normalize import normalize_text
from engine.tokenizer import CONTROL_TAGS, estimate_seconds, lint_tags

TAG = re.compile(r"<\|[^<>|]{0,64}\|>")

SENTENCES = [
    "The committee met on a cold morning to discuss the budget for the coming year.",
    "Doctor Smith presented the numbers, which showed many new members since the spring.",
    "<|emotion:contemplation|>Everyone was quiet for a while.",
    "The heating was turned up, and someone went to fetch more coffee from the kitchen downstairs.",
    "Some asked whether the hall could be rented out for weddings in the summer months.",
    "<|emotion:enthusiasm|>Others wanted to hear about the plans for the new library wing!",
    "Was there money for it?",
    "Nobody could say for certain, but the treasurer promised an answer by the next meeting.",
]


def page(paragraphs: int = 3, repeat: int = 2) -> str:
    return "\n\n".join(" ".join(SENTENCES * repeat) for _ in range(paragraphs))


def test_first_segment_is_one_sentence():
    segments = plan(page(), normalize=False)
    assert segments[0].text == SENTENCES[0]
    assert segments[0].index == 0 and [s.index for s in segments] == list(range(len(segments)))


def test_segment_lengths_stay_within_bounds():
    segments = plan(page(paragraphs=3, repeat=3), normalize=False)
    assert len(segments) > 6
    for segment in segments[1:]:
        assert MIN_SEGMENT_SECONDS <= segment.seconds <= MAX_SEGMENT_SECONDS, segment
    # Nothing is lost or reordered: the segments read back as the text, sentence by sentence.
    assert " ".join(s.text for s in segments).split() == page(3, 3).split()


def test_a_sentence_longer_than_the_bound_is_cut_at_clauses_never_inside_a_tag():
    clause = "and then the long road went on past the river and the old mill"
    long = "<|emotion:awe|>It began, " + ", ".join([clause] * 12) + " <|prosody:long_pause|>at last."
    assert estimate_seconds(long) > MAX_SEGMENT_SECONDS
    segments = plan(f"Short first. {long}", normalize=False)
    assert all(s.seconds <= MAX_SEGMENT_SECONDS for s in segments)
    assert segments[1].text.startswith("<|emotion:awe|>It began,")
    for segment in segments:
        assert not re.search(r"<\|[^|>]*$|^[^<]*\|>", segment.text), segment.text  # no half tag at either end
        assert all(t in CONTROL_TAGS for t in TAG.findall(segment.text))
    assert " ".join(s.text for s in segments).count("<|prosody:long_pause|>") == 1


def test_delivery_tags_stay_at_the_start_of_their_sentence():
    text = ("First sentence here. Second one follows. <|emotion:sadness|>\n"
            "This one is sad. Then a neutral one. <|style:whispering|> And a whisper at the end.")
    sentences = split_sentences(text.replace("\n", " "))
    assert sentences == ["First sentence here.", "Second one follows.", "<|emotion:sadness|>This one is sad.",
                         "Then a neutral one.", "<|style:whispering|>And a whisper at the end."]
    for segment in plan(text, normalize=False, min_seconds=0.5, max_seconds=2.5):
        assert not [w for w in lint_tags(segment.text) if w.severity == "warning"], segment.text


def test_style_prefix_leads_every_segment_and_a_sentence_tag_replaces_its_kind():
    style = "<|emotion:contemplation|><|prosody:speed_slow|>"
    text = page() + "\n\n<|emotion:enthusiasm|>A new paragraph starts with joy. " + " ".join(SENTENCES)
    segments = plan(text, style=style, normalize=False)
    for segment in segments:
        assert segment.text.startswith("<|") and "<|prosody:speed_slow|>" in segment.text
        leading = re.match(r"(?:<\|[^<>|]{0,64}\|>)+", segment.text).group()
        emotions = [t for t in TAG.findall(leading) if t.startswith("<|emotion:")]
        assert len(emotions) == 1, segment.text  # never two contradicting emotions
    joyful = [s for s in segments if s.source.startswith("<|emotion:enthusiasm|>A new")]
    assert len(joyful) == 1 and joyful[0].text.startswith("<|prosody:speed_slow|><|emotion:enthusiasm|>A new")


def test_paragraph_breaks_get_the_longer_pause():
    segments = plan(page(paragraphs=3, repeat=1), normalize=False)
    ends = [i for i, s in enumerate(segments) if s.source.endswith(SENTENCES[-1])]
    assert len(ends) == 3
    for i, segment in enumerate(segments):
        expected = 0.0 if i == len(segments) - 1 else PARAGRAPH_PAUSE if i in ends else SENTENCE_PAUSE
        assert segment.pause_after == expected
    assert PARAGRAPH_PAUSE > SENTENCE_PAUSE


def test_a_script_maps_speakers_to_voices():
    script = ("Alice: Hello there, how are you today?\n"
              "[S1] I am fine, thanks.\n"
              "and still a little tired.\n"
              "alice: Good to hear.")
    segments = plan(script, voices={"Alice": "narrator", "S1": None}, normalize=False)
    assert [(s.speaker, s.voice, s.text) for s in segments] == [
        ("Alice", "narrator", "Hello there, how are you today?"),
        ("S1", None, "I am fine, thanks. and still a little tired."),
        ("Alice", "narrator", "Good to hear."),
    ]
    assert [s.pause_after for s in segments] == [TURN_PAUSE, TURN_PAUSE, 0.0]


def test_an_unknown_speaker_names_the_known_ones():
    with pytest.raises(ValueError) as info:
        parse_script("Alice: Hi.\nBob: Hello.", {"Alice": "a", "Carol": "c"})
    message = str(info.value)
    assert "line 2" in message and "'Bob'" in message and "'Alice'" in message and "'Carol'" in message
    with pytest.raises(ValueError, match="names no speaker"):
        parse_script("Hello.\nAlice: Hi.", {"Alice": "a"})


def test_planning_rejects_what_it_cannot_plan():
    with pytest.raises(ValueError, match="no text"):
        plan("  \n ")
    with pytest.raises(ValueError, match="only tags"):
        plan("<|emotion:elation|> <|prosody:pause|>")
    with pytest.raises(ValueError, match="only control tags"):
        plan("Hello.", style="calm <|emotion:relief|>")


@pytest.mark.parametrize("written, spoken", [
    ("It costs $3.50.", "It costs three dollars and fifty cents."),
    ("We sold 1,234 units.", "We sold one thousand two hundred and thirty-four units."),
    ("It was 70 °F outside.", "It was seventy degrees Fahrenheit outside."),
    ("Dr. Smith is in.", "Doctor Smith is in."),
    ("Meet me at 10:30.", "Meet me at ten thirty."),
    ("Due on 2026-11-30.", "Due on November thirtieth, twenty twenty-six."),
    ("It is -5 °C, 50% off, 7:05.", "It is minus five degrees Celsius, fifty percent off, seven oh five."),
    ("In 1999 it was $1 and 2.5 km.", "In nineteen ninety-nine it was one dollar and two point five kilometers."),
    ("The 21st time, e.g. today.", "The twenty-first time, for example today."),
    ("<|emotion:pride|>We won 3 cups.", "<|emotion:pride|>We won three cups."),
])
def test_english_normalisation(written, spoken):
    assert normalize_text(written, "en") == spoken


def test_other_languages_are_left_unchanged():
    for text, language in [("Il fait 20 °C à 10:30, M. Dupont paie 3,50 €.", "fr"),
                           ("Es kostet $3.50 am 2026-11-30.", "de"), ("今天是2026-11-30，10:30。", "zh")]:
        assert normalize_text(text, language) == text


def test_auto_normalises_only_the_paragraphs_that_read_as_english():
    english = "It costs $3.50 at 10:30. Then more text follows here."
    french = "Il fait 20 °C à 10:30, M. Dupont paie 3,50 €. Le chien est dans la maison."
    german = "Der Hund ist in dem Haus und wartet auf den Mann, der um 10:30 kommt."
    spoken = " ".join(s.text for s in plan("\n\n".join([english, french, german])))
    assert "three dollars and fifty cents at ten thirty" in spoken
    assert "Il fait 20 °C à 10:30, M. Dupont paie 3,50 €." in spoken and "um 10:30 kommt" in spoken
    assert normalize_text(french, "auto") == french and normalize_text(english, "auto") != english


def test_normalisation_is_on_by_default_and_switchable():
    text = "It costs $3.50. Then more text follows here."
    assert plan(text)[0].text == "It costs three dollars and fifty cents."
    assert plan(text)[0].source == "It costs $3.50."
    assert plan(text, normalize=False)[0].text == "It costs $3.50."
