"""The checkpoint's `tokenizer.json`, its special ids, the 43 inline control tags, and a lint for tags.

Prompts are built from ids (SPEC D1), so the ids below are the contract with the model. A tokenizer file
is only accepted when it spells every special token with exactly these ids: a file that disagreed would
make every prompt wrong without any visible error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Structural special tokens (SPEC Part 2 §1.4).
ENDOFTEXT = 151643
TTS = 151667
AUDIO = 151670
AUDIO_END = 151671
TEXT = 151672
REF_AUDIO = 151679
REF_TEXT = 151680

SPECIAL: dict[str, int] = {
    "<|endoftext|>": ENDOFTEXT,
    "<|tts|>": TTS,
    "<|audio|>": AUDIO,
    "<|audio_end|>": AUDIO_END,
    "<|text|>": TEXT,
    "<|ref_audio|>": REF_AUDIO,
    "<|ref_text|>": REF_TEXT,
}

# First and last id of the added-token block of the real tokenizer (84 tokens, contiguous).
ADDED_FIRST = 151643
ADDED_LAST = 151726


@dataclass(frozen=True, slots=True)
class ControlTag:
    """One inline control tag (SPEC D2). `sentence_level` tags lead their sentence; the others
    (`sfx`, `pause`, `long_pause`) sit where the effect happens."""

    text: str
    category: str  # emotion | style | sfx | prosody | expressive
    value: str
    id: int
    sentence_level: bool


def _tags(category: str, prefix: str, first_id: int, values: str, sentence_level) -> list[ControlTag]:
    return [ControlTag(f"<|{prefix}:{v}|>", category, v, first_id + i, sentence_level(v))
            for i, v in enumerate(values.split())]


_EMOTIONS = ("elation amusement enthusiasm determination pride contentment affection relief contemplation "
             "confusion surprise awe longing arousal anger fear disgust bitterness sadness shame helplessness")
_PROSODY = "speed_very_slow speed_slow speed_fast speed_very_fast pitch_low pitch_high pause long_pause"

CONTROL_TAGS: dict[str, ControlTag] = {t.text: t for t in [
    *_tags("emotion", "emotion", 151681, _EMOTIONS, lambda v: True),
    *_tags("style", "style", 151704, "singing shouting whispering", lambda v: True),
    *_tags("sfx", "sfx", 151707, "cough laughter crying screaming burping humming sigh sniff sneeze", lambda v: False),
    *_tags("prosody", "prosody", 151716, _PROSODY, lambda v: v not in ("pause", "long_pause")),
    *_tags("expressive", "prosody", 151725, "expressive_high expressive_low", lambda v: True),
]}
CONTROL_TAG_IDS: frozenset[int] = frozenset(t.id for t in CONTROL_TAGS.values())


class HiggsTokenizer:
    """Text ↔ ids with the checkpoint's `tokenizer.json`. Encoding never adds special tokens: the prompt
    builders place them (SPEC D1)."""

    def __init__(self, tokenizer, source: str = "<memory>"):
        self._tok = tokenizer
        self.source = source
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        wanted = {**SPECIAL, **{tag.text: tag.id for tag in CONTROL_TAGS.values()}}
        missing = [name for name in wanted if name not in vocab]
        wrong = [f"{name} is {vocab[name]} (expected {wanted[name]})"
                 for name in wanted if name in vocab and vocab[name] != wanted[name]]
        if missing or wrong:
            parts = []
            if missing:
                parts.append(f"it lacks {len(missing)} special tokens ({', '.join(missing[:10])})")
            if wrong:
                parts.append("ids differ: " + "; ".join(wrong[:10]))
            raise ValueError(f"{source} is not the Higgs Audio v3 tokenizer: {', and '.join(parts)}. "
                             "Use the tokenizer.json that ships with the checkpoint.")
        self.special: dict[str, int] = {name: vocab[name] for name in SPECIAL}

    @classmethod
    def from_file(cls, path: str | Path) -> "HiggsTokenizer":
        from tokenizers import Tokenizer

        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no tokenizer file at {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise ValueError(f"{path} is not a readable tokenizer.json ({exc})") from None
        return cls(tok, source=str(path))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


# ---------------------------------------------------------------------------------------------------
# Tag lint: a pure function of the text, usable without any tokenizer file.

@dataclass(frozen=True, slots=True)
class TagWarning:
    position: int  # character offset of the tag in the text
    tag: str
    message: str
    severity: str  # "error": the tag will be read aloud or breaks the prompt; "warning": likely misplaced


TAG_RE = re.compile(r"<\|[^<>|]{0,64}\|>")  # a control tag as written in text (<|...|>), for every reader of tags
_SENTENCE_END = re.compile(r"""[.!?…。！？][\s"'”’)\]]*$""")


def _ends_sentence(chunk: str) -> bool:
    """Whether text following `chunk` starts a sentence: it ends in . ! ? (perhaps closed by quotes or
    brackets) or in a line break."""
    chunk = chunk.rstrip(" \t")
    return chunk.endswith("\n") or bool(_SENTENCE_END.search(chunk))


def lint_tags(text: str, *, clone: bool = False) -> list[TagWarning]:
    """Check inline tags against the rules of SPEC D2.

    * unknown `<|...|>` tags are read aloud as text, and structural tokens (`<|audio|>` …) break the prompt;
    * sentence-level tags (emotion, style, speed, pitch, expressive) must lead their sentence: only
      whitespace and other tags may sit between them and the previous sentence end (or the text start);
    * an `sfx` tag must be followed immediately, with no space, by its onomatopoeia (`<|sfx:laughter|>Haha`);
    * with a cloned voice, an emotion tag as the very first token can override the voice; putting one
      word before it keeps the voice.
    """
    warnings: list[TagWarning] = []
    at_sentence_start = True
    cursor = 0
    for match in TAG_RE.finditer(text):
        before = text[cursor:match.start()]
        if before.strip():
            at_sentence_start = _ends_sentence(before)
        cursor = match.end()
        raw = match.group()
        tag = CONTROL_TAGS.get(raw)
        if tag is None:
            if raw in SPECIAL or raw.startswith("<|reserved"):
                message = f"{raw} is a structural token, not a control tag; remove it from the text"
            else:
                message = f"{raw} is not a known control tag and would be read aloud; see the tag list"
            warnings.append(TagWarning(match.start(), raw, message, "error"))
            continue
        if tag.sentence_level and not at_sentence_start:
            warnings.append(TagWarning(match.start(), raw, f"{raw} is a sentence-level tag: put it at the start "
                                       "of its sentence (after the previous . ! or ?)", "warning"))
        if tag.category == "sfx":
            following = text[match.end():match.end() + 1]
            if not following or following.isspace() or text.startswith("<|", match.end()):
                warnings.append(TagWarning(match.start(), raw, f"{raw} should be followed immediately, with no "
                                           "space, by the sound written out (e.g. <|sfx:laughter|>Haha)", "warning"))
        if clone and tag.category == "emotion" and not text[:match.start()].strip():
            warnings.append(TagWarning(match.start(), raw, "with a cloned voice, an emotion tag as the very first "
                                       "token can override the voice; put one word before it", "warning"))
    return warnings


def strip_tags(text: str) -> str:
    """The text with every `<|...|>` tag removed (what is actually spoken)."""
    return TAG_RE.sub("", text)


# Speaking-rate estimate: conversational English runs ~150 words/min ≈ 15 characters/s (words average ~5
# letters plus a space). Pause tags add their silence. Used only to size length caps, never to cut audio.
CHARS_PER_SECOND = 15.0
PAUSE_SECONDS = {"<|prosody:pause|>": 0.5, "<|prosody:long_pause|>": 1.0}


def estimate_seconds(text: str) -> float:
    """Rough spoken duration of `text` in seconds: collapsed spoken characters / 15 plus pauses."""
    spoken = " ".join(strip_tags(text).split())
    pauses = sum(PAUSE_SECONDS.get(m.group(), 0.0) for m in TAG_RE.finditer(text))
    return len(spoken) / CHARS_PER_SECOND + pauses
