"""studio/text/clean.py: chat text (markdown, code, links, emoji) → the words to speak, the model's tags untouched."""

from __future__ import annotations

import pytest

from engine.tokenizer import CONTROL_TAGS
from studio.text.clean import clean_text, is_emoji


@pytest.mark.parametrize("raw,spoken", [
    ("## Results\n\nIt **worked**.", "Results.\n\nIt worked."),
    ("Nested ***bold italics*** and **bold with *em* inside**.", "Nested bold italics and bold with em inside."),
    ("Before.\n\n```python\nprint('*not* spoken')\n```\n\nAfter.", "Before.\n\nAfter."),
    ("Indented code:\n\n    x = 1\n\nDone.", "Indented code:\n\nDone."),
    ("Run `pip install openai` first.", "Run first."),
    ("Read [the docs](https://example.com/docs_page) today.", "Read the docs today."),
    ("See https://example.com/a_b?c=1. Or www.example.org, too.", "See. Or, too."),
    ("Mail <https://auto.link/x> now.", "Mail now."),
    ("A picture ![a cat](cat.png) here.", "A picture here."),
    ("| Name | Age |\n|---|---|\n| Ann | 31 |", "Name, Age.\n\nAnn, 31."),
    ("- one\n- two\n  1. nested", "one.\n\ntwo.\n\nnested."),
    ("> Quoted *text*\n\n---\n\nEnd", "Quoted text.\n\nEnd."),
    ("Great job 👍🏽! Family 👨‍👩‍👧 🇫🇷 at 70 °F ©", "Great job! Family at 70 °F ©"),
    ("<b>Bold</b> html and ~~struck~~ words", "Bold html and struck words."),
    ("Alice: Hello.\nBob: Hi there.", "Alice: Hello.\nBob: Hi there."),
    ("Price: 5 * 3 = 15", "Price: 5 * 3 = 15."),
])
def test_markdown_becomes_the_words_a_reader_says(raw, spoken):
    assert clean_text(raw) == spoken


def test_control_tags_survive_byte_for_byte_wherever_they_stand():
    raw = ("# <|emotion:awe|>Title\n\n<|prosody:speed_very_slow|>Slow *and <|prosody:pitch_low|>low* "
           "**<|style:whispering|>quiet** <|sfx:laughter|>Haha <|prosody:long_pause|> end.\n\n"
           "- <|emotion:elation|>item")
    got = clean_text(raw)
    assert got == ("<|emotion:awe|>Title.\n\n<|prosody:speed_very_slow|>Slow and <|prosody:pitch_low|>low "
                   "<|style:whispering|>quiet <|sfx:laughter|>Haha <|prosody:long_pause|> end.\n\n"
                   "<|emotion:elation|>item.")
    every = "".join(f"{tag} word{i}. " for i, tag in enumerate(CONTROL_TAGS))  # underscores, colons, bars
    assert clean_text(every).split() == every.split()


def test_actions_are_spoken_or_skipped_as_asked():
    raw = "*waves hand* Hello there! I *really* mean it. **Bold** and _underscored_ stay."
    assert clean_text(raw) == "waves hand Hello there! I really mean it. Bold and underscored stay."
    assert clean_text(raw, actions="skip") == "Hello there! I mean it. Bold and underscored stay."
    assert clean_text("***so*** good", actions="skip") == "so good."  # bold italics is no action
    with pytest.raises(ValueError, match="speak, skip"):
        clean_text(raw, actions="mumble")


@pytest.mark.parametrize("raw", ["```\nonly code\n```", "🎉🎉", "https://example.com", "`x`", "---", "*nod*"])
def test_nothing_speakable_cleans_to_empty(raw):
    assert clean_text(raw, actions="skip") == ""


def test_emoji_are_told_from_other_symbols():
    assert all(is_emoji(ch) for ch in "😀🎉👍\u200d\ufe0f🏽⭐☀✅")
    assert not any(is_emoji(ch) for ch in "©®°€→½aé中")
