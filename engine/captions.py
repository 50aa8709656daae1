"""Captions for a take from plain data: each segment's text and its exact sample span → cues → SRT / WebVTT.

The model gives no word durations, but a take knows where every segment's samples start and end
(`LongTake.spans()`; a single take is one segment spanning its audio). So:

* a cue that starts a segment starts at that segment's first sample, exactly (summing chunk durations
  drifts; offsets counted in samples do not);
* within a segment, sentence (or word) boundaries come from an ASR's word timestamps when the caller has
  them (`WordTime`, relative to the segment's first sample), and otherwise from each unit's share of the
  segment's characters over its speech: such a cue is `estimated`, which is said beside the times, never
  in the timing line (WebVTT: a NOTE block and the cue identifier; the JSON form: each cue's `estimated`;
  SRT has no place for a note, so its timing lines are the format's own and nothing more);
* cues tile the take: each ends where the next begins, a segment's last cue holds through the pause
  after it, and the last ends with the audio.

Plain data in, so a single take, a long take and a project chapter all caption the same way:
`cues(texts, spans, total_samples, level=...)`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .config import SAMPLE_RATE
from .longform import PAUSE_RE, split_sentences
from .tokenizer import strip_tags

LEVELS = ("segment", "sentence", "word")

_WORD_RE = re.compile(r"\S+")
_FOLD_RE = re.compile(r"[\W_]+")


@dataclass(frozen=True, slots=True)
class Cue:
    """One caption: [start, end) in seconds, its text, the segment it belongs to, and whether a boundary of
    it was estimated from character share rather than taken from samples or heard by an ASR."""

    start: float
    end: float
    text: str
    segment: int
    estimated: bool

    def as_dict(self) -> dict:
        return {"text": self.text, "start_time": self.start, "end_time": self.end, "segment": self.segment,
                "estimated": self.estimated}


@dataclass(frozen=True, slots=True)
class WordTime:
    """A word as an ASR heard it, in seconds from its segment's first sample."""

    word: str
    start: float
    end: float


def caption_text(text: str) -> str:
    """What a caption shows of a segment's text: no control tags, no pause markers, one line."""
    return " ".join(PAUSE_RE.sub(" ", strip_tags(text)).split())


def cues(texts: list[str], spans: list[tuple[int, int]], total: int, *, level: str = "sentence",
         words: list[list[WordTime] | None] | None = None, sample_rate: int = SAMPLE_RATE,
         language: str = "en") -> list[Cue]:
    """The cues of a take whose segment i says `texts[i]` over samples `spans[i]` = [start, end) of the
    take's `total` samples. `level` is "segment", "sentence" or "word"; `words[i]` (optional) are the
    ASR's words of segment i."""
    _check_level(level)
    if len(texts) != len(spans):
        raise ValueError(f"{len(texts)} segment texts for {len(spans)} spans")
    if words is not None and len(words) != len(spans):
        raise ValueError(f"{len(words)} word lists for {len(spans)} spans")
    previous = 0
    for start, end in spans:
        if not previous <= start <= end <= total:
            raise ValueError(f"segment spans must be ordered inside the take's {total} samples, got {spans}")
        previous = end
    out: list[Cue] = []
    for i, (text, (start, end)) in enumerate(zip(texts, spans)):
        region_end = spans[i + 1][0] if i + 1 < len(spans) else total
        parts = units(text, level, language)
        if not parts:
            continue
        heard = words[i] if words is not None else None
        starts, guessed = _unit_starts(parts, start, end, heard, sample_rate)
        bounds = [*starts, region_end]
        for k, unit in enumerate(parts):
            estimated = guessed[k] or (k + 1 < len(parts) and guessed[k + 1])
            out.append(Cue(bounds[k] / sample_rate, bounds[k + 1] / sample_rate, unit, i, estimated))
    return out


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"caption level must be one of {', '.join(LEVELS)}, got {level!r}")


def units(text: str, level: str = "sentence", language: str = "en") -> list[str]:
    """The cues' texts of one segment at `level`: its caption text whole, its sentences, or its words."""
    _check_level(level)
    text = caption_text(text)
    if not text:
        return []
    if level == "segment":
        return [text]
    if level == "word":
        return _WORD_RE.findall(text)
    return split_sentences(text, language) or [text]


def _unit_starts(units: list[str], start: int, end: int, heard: list[WordTime] | None,
                 sample_rate: int) -> tuple[list[int], list[bool]]:
    """Each unit's first sample, and whether it was estimated. The first is the segment's start, exactly;
    the others are the ASR's time of the unit's first word where the ASR heard it, else the unit's
    character share of the speech between the known neighbours."""
    known: list[int | None] = [start] + [None] * (len(units) - 1)
    if heard:
        ours = [(k, _fold(w)) for k, unit in enumerate(units) for w in _WORD_RE.findall(unit)]
        theirs = [_fold(w.word) for w in heard]
        first_word = {}
        for n, (k, _) in enumerate(ours):
            first_word.setdefault(k, n)
        matcher = difflib.SequenceMatcher(None, [w for _, w in ours], theirs, autojunk=False)
        matched = {a + j: b + j for a, b, size in matcher.get_matching_blocks() for j in range(size)}
        for k in range(1, len(units)):
            n = first_word.get(k)
            if n is not None and n in matched:
                known[k] = start + round(heard[matched[n]].start * sample_rate)
    # ASR times out of order or outside the segment are not trusted.
    floor = start
    for k in range(1, len(units)):
        if known[k] is not None and not floor < known[k] < end:
            known[k] = None
        if known[k] is not None:
            floor = known[k]
    guessed = [value is None for value in known]
    weights = [len(u) + 1 for u in units]
    k = 1
    while k < len(units):
        if known[k] is not None:
            k += 1
            continue
        left = k - 1  # known
        right = next((j for j in range(k, len(units)) if known[j] is not None), len(units))
        right_at = known[right] if right < len(units) else end
        span_weight = sum(weights[left:right])
        acc = weights[left]
        for j in range(k, right):
            known[j] = known[left] + round((right_at - known[left]) * acc / span_weight)
            acc += weights[j]
        k = right
    return [int(v) for v in known], guessed


def _fold(word: str) -> str:
    return _FOLD_RE.sub("", word.casefold())


# ------------------------------------------------------------------------------------------- files
def _millis(seconds: float) -> int:
    return round(seconds * 1000)


def _clock(seconds: float, separator: str) -> str:
    ms = _millis(seconds)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


def _lines(text: str) -> str:
    """A cue's text, which may not hold a blank line (it would end the cue) nor "-->"."""
    return " ".join(text.split()).replace("-->", "→")


def to_srt(items: list[Cue]) -> str:
    """SubRip: numbered cues, each timing line exactly "00:00:01,000 --> 00:00:02,500" (strict readers refuse
    anything after the times, so which cues are estimated is said only by the WebVTT and JSON forms)."""
    blocks = []
    for n, cue in enumerate(items, start=1):
        blocks.append(f"{n}\n{_clock(cue.start, ',')} --> {_clock(cue.end, ',')}\n{_lines(cue.text)}\n")
    return "\n".join(blocks)


ESTIMATED_NOTE = ("NOTE Cues whose identifier says \"estimated\" have a time estimated from each sentence's or "
                  "word's share of the segment's characters (no speech recognition heard it); the start of every "
                  "segment is exact.")


def to_vtt(items: list[Cue]) -> str:
    """WebVTT: cue identifiers "n" (or "n estimated"), a NOTE block first when any cue is estimated."""
    head = "WEBVTT\n\n" + (ESTIMATED_NOTE + "\n\n" if any(c.estimated for c in items) else "")
    blocks = []
    for n, cue in enumerate(items, start=1):
        name = f"{n} estimated" if cue.estimated else str(n)
        blocks.append(f"{name}\n{_clock(cue.start, '.')} --> {_clock(cue.end, '.')}\n{_lines(cue.text)}\n")
    return head + "\n".join(blocks)


__all__ = ["ESTIMATED_NOTE", "LEVELS", "Cue", "WordTime", "caption_text", "cues", "to_srt", "to_vtt", "units"]
