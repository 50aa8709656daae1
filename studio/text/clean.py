"""Chat text → speakable text: what an LLM writes (markdown, code, links, emoji) cleaned before it is spoken.

    clean_text("## Hi\\n\\nSee [the docs](https://x.io) and `pip install`. 🎉")   # "Hi.\\n\\nSee the docs and."
    clean_text("*waves* Hello!", actions="skip")                                 # "Hello!"

The markdown is parsed (markdown-it-py, CommonMark with tables and strikethrough), not matched with
regexes, so nesting, code fences and escapes mean what a renderer shows. What is kept: the words of
paragraphs, headings, list items, quotes and table cells (a block ends a sentence; a table row's cells are
joined with commas) and the text of links. What goes: the marks, code blocks and inline code, images, raw
HTML, URLs (links' targets, autolinks, bare ones) and emoji. The model's control tags (`<|...|>`) are kept
byte for byte where they stood. `*actions*` (emphasis written with single asterisks, as chat roleplay
writes stage directions) are spoken as words, or skipped with `actions="skip"`.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Literal

from markdown_it import MarkdownIt

from engine.tokenizer import TAG_RE

Actions = Literal["speak", "skip"]
ACTIONS: tuple[Actions, ...] = ("speak", "skip")

# Tags ride through the parser as one private-use character each (plane 15), which markdown treats as a
# letter: no mark inside a tag (`speed_very_slow`'s underscores, the bars) can be read as markdown.
_SLOT = 0xF0000
_SLOT_RE = re.compile("[\U000F0000-\U000FFFFD]")
_BARE_URL_RE = re.compile(r"(?:\bhttps?://|\bwww\.)[^\s<>]*[^\s<>.,;:!?)\]'\"]", re.IGNORECASE)
_SPACE_RE = re.compile(r"[ \t\u00a0]+")
_SPACE_BEFORE_PUNCT_RE = re.compile(r" +([.,;:!?])")
_EMPTY_BRACKETS_RE = re.compile(r"\(\s*\)|\[\s*\]")
_EMOJI_JOINERS = frozenset("\u200d\ufe0e\ufe0f\u20e3")  # ZWJ, variation selectors, the keycap mark
# Blocks of symbols (category So) that are pictographs; So elsewhere (©, °, CJK signs) is kept.
_EMOJI_BLOCKS = ((0x2300, 0x23FF), (0x2460, 0x27BF), (0x2900, 0x297F), (0x2B00, 0x2BFF), (0x3030, 0x303D),
                 (0x3297, 0x3299), (0x1F000, 0x1FAFF))

_md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def is_emoji(ch: str) -> bool:
    """A pictograph, a skin-tone modifier, a tag character or a joiner that only builds emoji."""
    cp = ord(ch)
    if ch in _EMOJI_JOINERS or 0x1F3FB <= cp <= 0x1F3FF or 0xE0020 <= cp <= 0xE007F:
        return True
    return unicodedata.category(ch) == "So" and any(lo <= cp <= hi for lo, hi in _EMOJI_BLOCKS)


def clean_text(text: str, *, actions: Actions = "speak") -> str:
    """`text` with its markdown, code, URLs and emoji removed and its control tags untouched; '' when nothing
    speakable is left. `actions`: "speak" keeps the words of `*actions*`, "skip" drops them."""
    if actions not in ACTIONS:
        raise ValueError(f"Actions must be one of {', '.join(ACTIONS)} (got {actions!r}).")
    tags: list[str] = []

    def hide(match: re.Match) -> str:
        tags.append(match.group())
        return chr(_SLOT + len(tags) - 1)

    hidden = TAG_RE.sub(hide, _SLOT_RE.sub("", text))
    blocks = [_finish(block) for block in _blocks(_md.parse(hidden), actions)]
    spoken = "\n\n".join(block for block in blocks if block)
    return _SLOT_RE.sub(lambda m: tags[ord(m.group()) - _SLOT], spoken)


def _blocks(tokens, actions: Actions) -> list[str]:
    """The text of each block that has words: every inline run outside tables, one line per table row.
    Code blocks, fences, raw HTML blocks and rules carry no inline run, so they go."""
    out: list[str] = []
    row: list[str] | None = None
    for tok in tokens:
        if tok.type == "tr_open":
            row = []
        elif tok.type == "tr_close" and row is not None:
            out.append(", ".join(cell for cell in map(_finish_cell, row) if cell))
            row = None
        elif tok.type == "inline":
            text = _inline(tok.children or [], actions)
            (row if row is not None else out).append(text)
    return out


def _inline(children, actions: Actions) -> str:
    """One inline run as words: marks dropped, code and images dropped, a link's text kept but not its target,
    an autolink dropped whole, `*actions*` kept or dropped."""
    parts: list[str] = []
    hiding: list[bool] = []  # one entry per open em / link: whether its content is dropped
    for i, tok in enumerate(children):
        kind = tok.type
        if kind == "em_open":  # `***so***` is bold italics, not an action
            after = next((t for t in children[i + 1:] if t.type != "text" or t.content), None)
            bold = after is not None and after.type == "strong_open"
            hiding.append(actions == "skip" and tok.markup == "*" and not bold)
        elif kind == "link_open":
            hiding.append(tok.markup == "autolink")
        elif kind in ("em_close", "link_close"):
            if hiding:
                hiding.pop()
        elif any(hiding):
            continue
        elif kind == "text":
            parts.append(tok.content)
        elif kind in ("softbreak", "hardbreak"):
            parts.append("\n")  # a script's lines ("Alice: ...") stay lines
        # code_inline, image, html_inline, strong/s marks: nothing spoken
    return "".join(parts)


def _words(text: str) -> str:
    text = "".join(ch for ch in _BARE_URL_RE.sub("", text) if not is_emoji(ch))
    text = _EMPTY_BRACKETS_RE.sub("", text)
    lines = (_SPACE_BEFORE_PUNCT_RE.sub(r"\1", _SPACE_RE.sub(" ", line)).strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if _speakable(line))


def _speakable(line: str) -> bool:
    """Whether a line holds a word or a tag (a line of leftover punctuation is dropped)."""
    return any(ch.isalnum() or _SLOT <= ord(ch) for ch in line)


def _finish_cell(text: str) -> str:
    return _words(text).rstrip(".,;:")


def _finish(text: str) -> str:
    """A block's words, ending as a sentence: a heading or list item without a full stop would run on into
    the next block when spoken."""
    text = _words(text)
    if text and text[-1].isalnum():
        text += "."
    return text
