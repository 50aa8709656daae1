"""Listen and retry: every segment of a long take or a project is transcribed by the studio's ASR
(studio/audio/asr.py) and scored by its word error rate against the text as spoken; a segment above the threshold
is generated again with the next seed, and the best attempt kept (engine/longtake.py `again` / `best`).

    listener = Listener(asr, above=0.25, retries=2)      # app.py: --asr, --retry-wer, --retry-max
    listener.off_note                                   # None when it listens, else why not (one line)
    LongTake(engine, segments, **listener.take_options())   # check, check_above, check_retries; {} when off
    listener.check(text, audio)                         # the WER of one segment, or None

The WER is jiwer's, over words normalised the same way on both sides: control tags removed, numbers, dates
and units written as English words (engine/normalize.py, so Whisper's "23" matches the planner's
"twenty-three"; the same on both sides in any language), case folded, punctuation and hyphens made spaces (apostrophes inside a word
kept). The reference is the text the model read: style prefix, normalisation and pronunciation dictionary
applied, so a respelling is heard as it was written. Whisper hears one 30 s window (studio/audio/asr.py
MAX_SECONDS): a segment that runs longer is judged on its first 30 s, and scores badly, as it should.
The transcription runs on the take's worker thread, in its turn in the line; the transcriber runs one call at
a time, whoever makes it.
"""

from __future__ import annotations

import re

import jiwer
import numpy as np

from engine.config import SAMPLE_RATE
from engine.normalize import normalize_text
from engine.tokenizer import strip_tags

DEFAULT_ABOVE = 0.25  # --retry-wer: about one word in four wrong (a starting point; not tuned on the real model)
DEFAULT_RETRIES = 2  # --retry-max
MAX_RETRIES = 10
_APOSTROPHES = re.compile(r"[’‘`]")
_NOT_WORD = re.compile(r"[^\w']+|(?<!\w)'|'(?!\w)|_")


def words(text: str) -> str:
    """`text` as the WER compares it: tags removed, numbers as (English) words, case folded, punctuation
    gone, one space between words."""
    text = normalize_text(strip_tags(text), "en").casefold()
    return " ".join(_NOT_WORD.sub(" ", _APOSTROPHES.sub("'", text)).split())


def wer(reference: str, heard: str) -> float | None:
    """The word error rate of `heard` against `reference` (substitutions, deletions and insertions over the
    reference's words; above 1 when much more is heard than written), None when the reference has no words."""
    reference, heard = words(reference), words(heard)
    if not reference:
        return None
    return float(jiwer.wer(reference, heard))


class Listener:
    """The studio's listen-and-retry policy over a transcriber (studio/audio/asr.py `Transcriber`, or anything with
    its `off_note` and `transcribe`); `transcriber=None` is off."""

    def __init__(self, transcriber, *, above: float = DEFAULT_ABOVE, retries: int = DEFAULT_RETRIES):
        if not above >= 0:
            raise ValueError(f"--retry-wer is a word error rate, 0 or more (0.25: one word in four wrong); got {above}")
        if not 0 <= retries <= MAX_RETRIES:
            raise ValueError(f"--retry-max is how many times a segment may be generated again, 0 … {MAX_RETRIES}; "
                             f"got {retries}")
        self.transcriber, self.above, self.retries = transcriber, float(above), int(retries)

    @property
    def off_note(self) -> str | None:
        """Why segments are not listened to (no ASR, or it failed to load), or None when they are."""
        why = "no transcriber is configured" if self.transcriber is None else self.transcriber.off_note
        if why is None:
            return None
        return f"Listen and retry is off: {why.rstrip('.')[:1].lower()}{why.rstrip('.')[1:]}; segments are not checked."

    def check(self, text: str, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> float | None:
        """The WER of one segment's `audio` against its `text`, or None when it cannot tell (ASR off or failed,
        a text with no words)."""
        if self.transcriber is None:
            return None
        heard, note = self.transcriber.transcribe(np.asarray(audio, dtype=np.float32), sample_rate)
        return None if note is not None else wer(text, heard)

    def take_options(self) -> dict:
        """LongTake's listening options (engine/longtake.py), or {} when off: the take then runs as without."""
        if self.off_note is not None:
            return {}
        return {"check": self.check, "check_above": self.above, "check_retries": self.retries}

    def describe(self) -> dict:
        """The policy as the API and the recipes show it."""
        return {"on": self.off_note is None, "above": self.above, "retries": self.retries, "note": self.off_note}


__all__ = ["DEFAULT_ABOVE", "DEFAULT_RETRIES", "Listener", "wer", "words"]
