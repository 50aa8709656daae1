"""Chapters in plain text as people write them: a line of its own that says "Chapter 1", "CHAPTER ONE",
"Part II", "Chapter 3: The Storm", "Prologue" starts a chapter. What comes before the first heading gives the
book its title (a short first line that is not a sentence) and its author (a line "by …"); any more text
there is a chapter of its own. A heading with no text before the next one ("Part II" over "Chapter 3") is
kept in front of the next one's title, so "Part II · Chapter 3" is what the chapter is called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER_WORDS = ("one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
                 "sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|"
                 "hundred|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last")
_NUMBER = rf"(?:\d{{1,4}}|[ivxlcdm]{{1,8}}|(?:{_NUMBER_WORDS})(?:[ -](?:{_NUMBER_WORDS}))*)"
# "Chapter 3", "CHAPTER THREE", "Part II", "Book 2: Title", "Chapter 3. Title", "Chapter 3 — Title"
_NUMBERED = re.compile(rf"^(?:chapter|part|book|volume|act)\s+{_NUMBER}(?:\s*[:.\-–—]\s*.*|\s*)$", re.IGNORECASE)
_NAMED = re.compile(r"^(?:prologue|epilogue|preface|foreword|introduction|afterword|interlude)(?:\s*[:.\-–—]\s*.*)?$",
                    re.IGNORECASE)
_BY = re.compile(r"^by\s+(.{1,100})$", re.IGNORECASE)
MAX_HEADING_CHARS = 100  # longer is a sentence, even one that starts "Chapter one of my life …"
MAX_TITLE_LINE = 100


@dataclass(frozen=True)
class Found:
    """What the text's headings say: (title, text) per chapter, the book's title and author ("" when none)."""
    chapters: list[tuple[str, str]]
    title: str = ""
    author: str = ""


def is_heading(line: str) -> bool:
    line = " ".join(line.split())
    return 0 < len(line) <= MAX_HEADING_CHARS and bool(_NUMBERED.match(line) or _NAMED.match(line))


def split_chapters(text: str) -> Found | None:
    """The chapters the headings in `text` mark, or None when it has no heading (one chapter, as pasted)."""
    lines = text.splitlines()
    cuts = [n for n, line in enumerate(lines) if is_heading(line)]
    if not cuts:
        return None
    title, author, opening = _front(lines[:cuts[0]])
    chapters: list[tuple[str, str]] = [("Opening", opening)] if opening else []
    waiting = ""  # a heading with no text of its own ("Part II"), said before the next chapter's title
    for n, start in enumerate(cuts):
        end = cuts[n + 1] if n + 1 < len(cuts) else len(lines)
        heading = " ".join(lines[start].split())
        body = "\n".join(lines[start + 1:end]).strip()
        name = f"{waiting} · {heading}" if waiting else heading
        if not body:
            waiting = name
            continue
        chapters.append((name, body))
        waiting = ""
    if not chapters:
        return None
    return Found(chapters, title, author)


def _front(lines: list[str]) -> tuple[str, str, str]:
    """(title, author, the rest) of the lines before the first heading."""
    rest = [line.strip() for line in lines]
    while rest and not rest[0]:
        rest.pop(0)
    title = author = ""
    if rest and len(rest[0]) <= MAX_TITLE_LINE and not rest[0].endswith((".", "!", "?", ",", ";")):
        title = " ".join(rest.pop(0).split())
    for n, line in enumerate(rest[:3]):
        if found := _BY.match(line):
            author = found.group(1).strip()
            del rest[n]
            break
    return title, author, "\n".join(rest).strip()


__all__ = ["Found", "is_heading", "split_chapters"]
