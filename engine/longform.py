"""Long-form planning: a page of text, or a multi-voice script, → the segments one long take is made of.

Pure functions of the text (no model). Sentences come from `sentencex` (rule-based, ~300 languages, a
compiled wheel that segments 46k characters in 3 ms where pysbd takes 360 ms; both agree on abbreviations
such as "Dr." and "e.g."). They are packed into segments the model holds together:

* the first segment is one sentence, so the first audio comes as soon as that of a short take;
* later segments run `min_seconds`–`max_seconds` of speech by `tokenizer.estimate_seconds`, and never
  cross a paragraph or a speaker turn, so those joins get their own, longer pause;
* a sentence longer than `max_seconds` is cut at a clause (, ; :) and then at a space, never inside a tag;
* sentence-level tags (`<|emotion:…|>` …) stay at the start of their sentence (SPEC D2), and a style prefix
  leads every segment, so each segment starts in the same delivery.

A script is a text whose lines start with a speaker (`Alice: Hello.` or `[S1] Hello.`); with a `voices`
map every line's segments carry the voice of its speaker.

A pause marker, `[pause 1.5s]` (or `[pause 500ms]`, or `[pause]` for PAUSE_MARKER_SECONDS; SSML's
`<break>` becomes one, engine/ssml.py), ends a segment there: the segment before it gets exactly that
`pause_after`, which the long take inserts as silence at the join. Markers next to each other (nothing
spoken between) add up to at most MAX_PAUSE_SECONDS, one marker's cap; a marker at a paragraph's end
replaces the paragraph's pause; one before any speech has no join to sit at and is left out. All the
markers of a take together may ask for at most its pause budget: PAUSE_BUDGET_SECONDS, or
PAUSE_BUDGET_SHARE of its estimated speech when that is longer. A text asking for more is refused with a
sentence naming the budget (silence costs no generation: without one, 4 k characters of breaks would be
2,000 s of audio), rather than shortened: the pauses were written on purpose, and a take whose timing
quietly differs from its text is worse than a sentence that says what to change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from .normalize import AUTO, looks_english, normalize_text
from .tokenizer import CONTROL_TAGS, TAG_RE, estimate_seconds, strip_tags

# Segment length in seconds of speech (the speaking-rate estimate). One prompt is capped at 2048 rows
# (~81 s, SPEC D5) and the cap allows 3× the estimate, so a segment of at most 20 s always fits under it;
# at least 8 s keeps the joins few (one every few sentences) and gives each prompt context for prosody.
MIN_SEGMENT_SECONDS = 8.0
MAX_SEGMENT_SECONDS = 20.0

# The silence put at a join, after trimming each side's own silence (engine/longtake.py). The join keeps
# up to 40 ms of each segment's own decay on both sides, so 0.2 s inserted is heard as ~0.2–0.28 s: the
# middle of the 150–250 ms pause wanted between sentences, leaving room for the decay. Paragraphs get
# 0.5 s, speaker turns a step between the two. Not yet tuned by ear: the only weights on our machines are
# random. Within one segment the model makes its own pauses; these only need to sound like them.
SENTENCE_PAUSE = 0.2
TURN_PAUSE = 0.35
PARAGRAPH_PAUSE = 0.5

_PARAGRAPH_RE = re.compile(r"\n[ \t]*\n\s*")
_SPEAKER_RE = re.compile(r"^\s*(?:\[(?P<bracket>[^\]\n]{1,40})\]\s*:?|(?P<name>[^\W\d][\w .'-]{0,39}?)\s*:)\s+(?=\S)")
_CLAUSE_RE = re.compile(r"(?<=[,;:—])\s+")
_ATOM_RE = re.compile(r"(?:<\|[^<>|]{0,64}\|>|\S)+")
PAUSE_RE = re.compile(r"\[pause(?:\s+(\d{1,6}(?:\.\d{1,6})?)\s*(s|ms))?\s*\]", re.IGNORECASE)
PAUSE_MARKER_SECONDS = 0.5  # a bare [pause]
MAX_PAUSE_SECONDS = 10.0  # one marker (and one SSML <break>, engine/ssml.py) is at most this long, and so are
# markers in a row
PAUSE_BUDGET_SECONDS = 60.0  # a take's markers may ask for this much silence in all …
PAUSE_BUDGET_SHARE = 0.10  # … or this share of its estimated speech, when that is more


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a long take: what the model is given and how it joins the next piece."""

    index: int
    text: str  # what the model speaks: style prefix + (normalised) text
    source: str  # the text as written, for the segment table
    pause_after: float  # seconds of silence inserted after this segment (0 after the last)
    speaker: str | None = None  # the script's speaker, None for plain text
    voice: str | None = None  # the voice the `voices` map gives that speaker (None: zero-shot)

    @property
    def seconds(self) -> float:
        """Estimated seconds of speech (the studio's duration estimate)."""
        return estimate_seconds(self.text)


@dataclass(frozen=True, slots=True)
class _Sentence:
    text: str
    source: str
    block: int  # paragraph or script line it belongs to


def pause_seconds(match: re.Match) -> float:
    """The silence one PAUSE_RE match asks for, at most MAX_PAUSE_SECONDS."""
    number, unit = match.group(1), (match.group(2) or "s").lower()
    seconds = PAUSE_MARKER_SECONDS if number is None else float(number) / (1000 if unit == "ms" else 1)
    return min(seconds, MAX_PAUSE_SECONDS)


def has_pauses(text: str) -> bool:
    """Whether `text` holds a pause marker (it then needs the long form, which can insert exact silence)."""
    return isinstance(text, str) and PAUSE_RE.search(text) is not None


def split_pauses(text: str) -> list[tuple[str, float]]:
    """`text` cut at its pause markers: [(piece, seconds of silence after it)], the last piece's pause 0
    unless the text ends with a marker. Pieces are stripped and may be empty (two markers in a row)."""
    out, cursor = [], 0
    for match in PAUSE_RE.finditer(text):
        out.append((text[cursor:match.start()].strip(), pause_seconds(match)))
        cursor = match.end()
    out.append((text[cursor:].strip(), 0.0))
    return out


def model_pauses(text: str) -> str:
    """Pause markers as the model's own pause tags, for a take made of one prompt, which has no join to put
    exact silence at: up to 0.5 s `<|prosody:pause|>`, longer `<|prosody:long_pause|>`."""
    tagged = PAUSE_RE.sub(lambda m: " <|prosody:pause|> " if pause_seconds(m) <= 0.5 else " <|prosody:long_pause|> ",
                          text)
    return re.sub(r"[ \t]{2,}", " ", tagged)


def split_sentences(text: str, language: str = "en") -> list[str]:
    """The sentences of one paragraph, whitespace-stripped. Sentence-level tags left at the end of a
    sentence (after its full stop), or standing alone, move to the start of the next sentence, where
    SPEC D2 says they belong; after the last sentence they stay where they are. A paragraph of tags
    alone has no sentences."""
    import sentencex

    out: list[str] = []
    carry = ""
    for sentence in (s.strip() for s in sentencex.segment(_language(language), text)):
        sentence = f"{carry}{sentence}"
        carry = ""
        while (match := _trailing_tag(sentence)) is not None:
            carry = match.group() + carry
            sentence = sentence[:match.start()].rstrip()
        if strip_tags(sentence).strip():
            out.append(_tight(sentence))
        else:
            carry = sentence + carry
    if carry and out:
        out[-1] += carry
    return out


def _tight(sentence: str) -> str:
    """No whitespace between a sentence's leading tags and its first word (it would be spoken as a
    separate space token, as in studio/presets.apply_preset)."""
    tags, body = [], sentence
    while (match := TAG_RE.match(body)) is not None:
        tags.append(match.group())
        body = body[match.end():].lstrip()
    return "".join(tags) + body


def _trailing_tag(sentence: str) -> re.Match | None:
    """A sentence-level tag at the very end of `sentence`, after some spoken text."""
    for match in TAG_RE.finditer(sentence):
        if match.end() == len(sentence) and strip_tags(sentence[:match.start()]).strip():
            tag = CONTROL_TAGS.get(match.group())
            if tag is not None and tag.sentence_level:
                return match
    return None


def _language(language: str) -> str:
    """sentencex's language code; "auto" uses the English rules, which split on the sentence marks of
    every script (. ! ? 。 ！ ？)."""
    code = (language or "en").split("-")[0].lower()
    return "en" if code == AUTO else code


def parse_script(text: str, voices: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """A script → [(speaker, line text)], one entry per turn. A line that starts with no speaker continues
    the previous turn. Speakers are matched to `voices` without regard to case or brackets ("[S1]" = "S1");
    an unknown speaker raises ValueError naming the line and the speakers the map knows."""
    known = {_speaker_key(name): name for name in voices}
    if not known:
        raise ValueError("the voices map is empty; map each speaker of the script to a voice, e.g. "
                         "{\"Alice\": \"narrator\"}")
    turns: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _SPEAKER_RE.match(line)
        if match is None:
            if not turns:
                raise ValueError(f"line {number} of the script names no speaker; start it with one of "
                                 f"{_listing(known.values())} (e.g. \"{next(iter(known.values()))}: Hello.\")")
            speaker, said = turns[-1][0], f"{turns[-1][1]} {line.strip()}"
            turns[-1] = (speaker, said)
            continue
        name = (match.group("bracket") or match.group("name")).strip()
        key = _speaker_key(name)
        if key not in known:
            raise ValueError(f"line {number} of the script is spoken by {name!r}, whom the voices map does not "
                             f"know; the map has {_listing(known.values())}. Add {name!r} to it or fix the name.")
        turns.append((known[key], line[match.end():].strip()))
    if not turns:
        raise ValueError("the script has no lines; write lines such as \"Alice: Hello.\" or \"[S1] Hello.\"")
    return turns


def _speaker_key(name: str) -> str:
    return name.strip().strip("[]").strip().casefold()


def _listing(names) -> str:
    return ", ".join(repr(n) for n in names)


def plan(text: str, *, style: str = "", normalize: bool = True, language: str = AUTO,
         voices: Mapping[str, str | None] | None = None, min_seconds: float = MIN_SEGMENT_SECONDS,
         max_seconds: float = MAX_SEGMENT_SECONDS, notes: list[str] | None = None) -> list[Segment]:
    """Split `text` into the segments of one long take.

    `style` is a tag prefix put before every segment (a style preset's prefix, already checked by the
    caller). `normalize` writes numbers, dates, units … out as words (English only; see
    engine/normalize.py). `language` is a code such as "en" or "fr", or "auto": English rules for the
    sentences, and normalisation of the paragraphs that read as English. With `voices` (speaker → voice
    name, or None for zero-shot) the text is read as a script: each line is spoken by the voice of its
    speaker, and segments never span two lines. `notes` (a list) receives a sentence for each change made
    to the text's pauses (markers in a row cut to MAX_PAUSE_SECONDS). ValueError when the markers ask for
    more than the take's pause budget (module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("there is no text to speak; paste a paragraph or a script first")
    if not 0 < min_seconds <= max_seconds:
        raise ValueError(f"segment bounds must satisfy 0 < min ≤ max seconds, got {min_seconds}, {max_seconds}")
    if style and TAG_RE.sub("", style).strip():
        raise ValueError(f"the style prefix {style!r} may hold only control tags such as <|emotion:contemplation|>")
    if voices is not None:
        blocks = parse_script(text, voices)
        speakers = [speaker for speaker, _ in blocks]
        pause = TURN_PAUSE
        paragraphs = [said for _, said in blocks]
    else:
        paragraphs = [p.strip() for p in _PARAGRAPH_RE.split(text) if p.strip()]
        speakers = [None] * len(paragraphs)
        pause = PARAGRAPH_PAUSE

    # Blocks: the paragraphs (script lines), each cut at its pause markers. Segments never span two
    # blocks; `marked[b]` is the explicit silence after block b (None: the paragraph or turn pause).
    sentences: list[_Sentence] = []
    block_speakers: list[str | None] = []
    marked: list[float | None] = []
    asked: list[float] = []  # what the markers after each block asked for, before the cap on markers in a row
    for number, paragraph in enumerate(paragraphs):
        # "auto" decides per paragraph (a paragraph has enough words to tell; a sentence may not).
        reading = language if language != AUTO else "en" if looks_english(paragraph) else "unknown"
        pieces = split_pauses(paragraph)
        for i, (piece, silence) in enumerate(pieces):
            block = len(block_speakers)
            found = split_sentences(piece, language) if piece else []
            for sentence in found:
                spoken = normalize_text(sentence, reading) if normalize else sentence
                for part, part_source in _fit(spoken, sentence, max_seconds, style):
                    sentences.append(_Sentence(part, part_source, block))
            explicit = silence if i < len(pieces) - 1 else None
            if found:
                block_speakers.append(speakers[number])
                marked.append(explicit)
                asked.append(explicit or 0.0)
            elif explicit is not None and marked:  # nothing spoken between two markers: they add up, to a cap
                asked[-1] += explicit
                marked[-1] = min((marked[-1] or 0.0) + explicit, MAX_PAUSE_SECONDS)

    if not sentences:
        raise ValueError("the text has nothing to speak, only tags; add the words to say")
    _check_pauses(marked, asked, sentences, style, notes)
    groups: list[list[_Sentence]] = [[sentences[0]]]  # the first segment is one sentence (TTFA)
    rest = sentences[1:]
    for block in dict.fromkeys(s.block for s in rest):
        groups.extend(_pack([s for s in rest if s.block == block], style, min_seconds, max_seconds))

    segments = []
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        block = group[-1].block
        ends_block = last or groups[i + 1][0].block != block
        if ends_block and marked[block] is not None:
            after = marked[block]
        else:
            after = 0.0 if last else (pause if ends_block else SENTENCE_PAUSE)
        speaker = block_speakers[block]
        segments.append(Segment(index=i, text=_with_style(style, " ".join(s.text for s in group)),
                                source=" ".join(s.source for s in group), pause_after=after, speaker=speaker,
                                voice=None if voices is None else voices[speaker]))
    return segments


def _check_pauses(marked: list[float | None], asked: list[float], sentences: list[_Sentence], style: str,
                  notes: list[str] | None) -> None:
    """The pause budget (module docstring): ValueError naming it when the markers ask for more, and a note
    for each run of markers cut to MAX_PAUSE_SECONDS."""
    cut = [(a, m) for a, m in zip(asked, marked) if m is not None and a > m]
    if cut and notes is not None:
        notes.append(f"{len(cut)} run{'s' if len(cut) > 1 else ''} of pauses in a row (up to {max(cut)[0]:,.0f} s) "
                     f"{'were' if len(cut) > 1 else 'was'} cut to {MAX_PAUSE_SECONDS:g} s, the most one pause may last")
    total = sum(m for m in marked if m is not None)
    speech = sum(estimate_seconds(_with_style(style, s.text)) for s in sentences)
    budget = max(PAUSE_BUDGET_SECONDS, PAUSE_BUDGET_SHARE * speech)
    if total > budget + 1e-6:
        raise ValueError(f"the text asks for {total:,.0f} s of pauses ([pause] markers or SSML breaks) around about "
                         f"{speech:,.0f} s of speech; a take's pauses may add up to at most "
                         f"{PAUSE_BUDGET_SECONDS:g} s, or {PAUSE_BUDGET_SHARE:.0%} of its speech when that is "
                         "longer. Shorten the pauses or split the text into several takes.")


def _with_style(style: str, text: str) -> str:
    """`style` + `text`, where a sentence-level tag leading `text` replaces the style's tag of the same
    kind (a sentence marked <|emotion:sadness|> is not also told <|emotion:elation|>)."""
    if not style:
        return text
    own, body = set(), text
    while (match := TAG_RE.match(body)) is not None and match.group() in CONTROL_TAGS:
        own.add(_kind(CONTROL_TAGS[match.group()]))
        body = body[match.end():]
    kept = [t for t in TAG_RE.findall(style) if t not in CONTROL_TAGS or _kind(CONTROL_TAGS[t]) not in own]
    return "".join(kept) + text


def _kind(tag) -> str:
    """What a sentence-level tag sets: emotion, style, speed, pitch or expressiveness."""
    return tag.category if tag.category != "prosody" else tag.value.split("_")[0]


def _pack(sentences: list[_Sentence], style: str, min_seconds: float, max_seconds: float) -> list[list[_Sentence]]:
    """Sentences of one paragraph → consecutive groups of at most `max_seconds` each, as even as they can
    be: the fewest groups the bound allows sets a target length, and a small dynamic programme picks the
    cut points that minimise the squared distance of every group from it (greedy filling leaves a
    one-sentence stub at the end of a paragraph). A group under `min_seconds` costs extra, so only a
    paragraph too short for two proper segments yields one."""
    n = len(sentences)
    if n == 0:
        return []

    def seconds(i: int, j: int) -> float:  # sentences [i, j) as one segment
        return estimate_seconds(_with_style(style, " ".join(s.text for s in sentences[i:j])))

    total = seconds(0, n)
    target = max(min_seconds, total / max(1, math.ceil(total / max_seconds)))
    best = [0.0] + [math.inf] * n  # best[j]: cost of grouping sentences [0, j)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):
            length = seconds(i, j)
            if length > max_seconds and i < j - 1:
                break  # longer groups only grow
            cost = best[i] + (length - target) ** 2 + (max_seconds ** 2 if length < min_seconds else 0.0)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(sentences[cut[j]:j])
        j = cut[j]
    return groups[::-1]


def _fit(spoken: str, source: str, max_seconds: float, style: str) -> list[tuple[str, str]]:
    """A sentence longer than `max_seconds` cut into pieces that fit: at clause punctuation first, then at
    spaces. Tags hold no spaces or clause marks a cut could fall on, so a tag is never split; a tag that
    leads the sentence stays in the first piece. The source text is kept whole on the first piece."""
    if estimate_seconds(_with_style(style, spoken)) <= max_seconds:
        return [(spoken, source)]
    pieces: list[str] = []
    for clause in _split_outside_tags(spoken, _CLAUSE_RE):
        for part in _words_fitting(clause, max_seconds, style):
            if pieces and estimate_seconds(_with_style(style, f"{pieces[-1]} {part}")) <= max_seconds:
                pieces[-1] = f"{pieces[-1]} {part}"
            else:
                pieces.append(part)
    return [(piece, source if i == 0 else "") for i, piece in enumerate(pieces)]


def _split_outside_tags(text: str, pattern: re.Pattern) -> list[str]:
    """`text` split at the matches of `pattern` that do not fall inside a tag."""
    tags = [m.span() for m in TAG_RE.finditer(text)]
    pieces, cursor = [], 0
    for match in pattern.finditer(text):
        if not any(start < match.end() and match.start() < end for start, end in tags):
            pieces.append(text[cursor:match.start()])
            cursor = match.end()
    pieces.append(text[cursor:])
    return [p for p in pieces if p.strip()]


def _words_fitting(text: str, max_seconds: float, style: str) -> list[str]:
    out: list[str] = []
    for word in _atoms(text):
        if out and estimate_seconds(_with_style(style, f"{out[-1]} {word}")) <= max_seconds:
            out[-1] = f"{out[-1]} {word}"
        else:
            out.append(word)
    return out


def _atoms(text: str) -> list[str]:
    """Whitespace-separated words, where a tag (even one written with spaces inside) is part of one word."""
    return _ATOM_RE.findall(text)


__all__ = ["Segment", "plan", "parse_script", "split_sentences", "split_pauses", "has_pauses", "model_pauses",
           "pause_seconds", "PAUSE_RE", "PAUSE_MARKER_SECONDS", "MAX_PAUSE_SECONDS", "PAUSE_BUDGET_SECONDS",
           "PAUSE_BUDGET_SHARE", "MIN_SEGMENT_SECONDS",
           "MAX_SEGMENT_SECONDS", "SENTENCE_PAUSE", "TURN_PAUSE", "PARAGRAPH_PAUSE"]
