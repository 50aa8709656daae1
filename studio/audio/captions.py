"""Captions of the studio's takes: a single take (one segment over its audio) or a long take (its segments'
exact spans), with word times from the studio's ASR when it is on (studio/audio/asr.py). The cue maths and the
file formats are engine/captions.py's; this module only gathers each take's texts, spans and audio.

    found = take_captions(take, level="sentence", transcriber=asr)   # Take or LongTake
    found.cues, found.estimated, found.note
    found.srt(), found.vtt()

A project chapter is captioned the same way from its own plain data: `captions(texts, spans, total,
audio=…)` with each segment's text, its [start, end) samples in the chapter's audio, and the chapter's length.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from engine.captions import Cue, cues, to_srt, to_vtt, units
from engine.config import SAMPLE_RATE
from engine.longtake import LongTake


@dataclass(frozen=True)
class Captions:
    """A take's cues, whether any is estimated, and why no ASR was used (None when it was)."""

    cues: list[Cue]
    note: str | None = None

    @property
    def estimated(self) -> bool:
        return any(c.estimated for c in self.cues)

    def srt(self) -> str:
        return to_srt(self.cues)

    def vtt(self) -> str:
        return to_vtt(self.cues)

    def as_list(self) -> list[dict]:
        return [c.as_dict() for c in self.cues]


def captions(texts: list[str], spans: list[tuple[int, int]], total: int, *, level: str = "sentence",
             audio: np.ndarray | None = None, transcriber=None, sample_rate: int = SAMPLE_RATE) -> Captions:
    """Cues for segments `texts` over `spans` of a `total`-sample take. With a `transcriber` that is on and
    the take's `audio`, each segment (of more than one unit) is transcribed for its word times; otherwise
    the times inside a segment are estimated, and `note` says why. Pass the page's or the API's transcriber
    through the line (studio/takes/service.py `transcriber_for`): transcribing is device work."""
    note = "no speech recognition: times inside a segment are estimated from character share"
    words = None
    if level != "segment":
        off = transcriber.off_note if transcriber is not None else "no transcriber is configured"
        if audio is None and off is None:
            off = "the take's audio was not kept"
        if off is None:  # a segment of one unit has nothing inside it to time
            try:
                words = [transcriber.words(audio[start:end], sample_rate) if len(units(text, level)) > 1 else None
                         for text, (start, end) in zip(texts, spans)]
                note = None
            except TimeoutError:  # the GPU line's ServiceBusy: no slot came free for the transcription in time
                note = f"{note} (the GPU was busy: no slot for the transcription)"
        else:
            note = f"{note} ({off.rstrip('.')})"
    found = cues(texts, spans, total, level=level, words=words, sample_rate=sample_rate)
    return Captions(found, note if any(c.estimated for c in found) else None)


def take_captions(take, *, level: str = "sentence", transcriber=None, audio: np.ndarray | None = None) -> Captions:
    """Captions of a studio `Take` (studio/takes/service.py) or a `LongTake`; `audio` is the take's, for a long
    take streamed without keeping it (None: the take's own, if it kept it)."""
    if isinstance(take, LongTake):
        listening = level != "segment" and transcriber is not None and transcriber.off_note is None
        if audio is None and listening and take.keep_audio and all(s is not None for s in take.shaped):
            audio = take.assemble()  # only the transcriber reads it
        return captions(shown_texts(take.segments), take.spans(), take.total_samples(), level=level, audio=audio,
                        transcriber=transcriber)
    audio = np.asarray(take.audio if audio is None else audio)
    return captions([take.prompt_text], [(0, len(audio))], len(audio), level=level, audio=audio,
                    transcriber=transcriber, sample_rate=take.sample_rate)


def shown_texts(segments) -> list[str]:
    """Each segment's text for its captions: as written (`source`), except where the planner cut one long
    sentence into pieces (only the first piece holds the source, whole): those show what is spoken."""
    out = []
    for i, segment in enumerate(segments):
        continued = i + 1 < len(segments) and not segments[i + 1].source
        out.append(segment.text if continued or not segment.source else segment.source)
    return out


def captions_html(found: Captions | None, player: str) -> str:
    """The cue list shown under the player whose elem_id is `player` (studio/static/captions.js highlights
    the cue the player is showing)."""
    if found is None or not found.cues:
        return f'<div class="hs-captions" data-player="{player}"></div>'
    items = "".join(
        f'<li data-start="{c.start:.3f}" data-end="{c.end:.3f}" class="{"estimated" if c.estimated else "exact"}">'
        f'<span class="hs-cue-time">{_clock(c.start)}</span> {html.escape(c.text)}</li>' for c in found.cues)
    note = f'<p class="hs-captions-note">{html.escape(found.note)}</p>' if found.note else ""
    return f'<div class="hs-captions" data-player="{player}">{note}<ol>{items}</ol></div>'


def _clock(seconds: float) -> str:
    """m:ss.t: to the tenth of a second, so that short sentences in a row do not all read "0:00"."""
    minutes, tenths = divmod(round(seconds * 10), 600)
    return f"{minutes}:{tenths // 10:02d}.{tenths % 10}"


__all__ = ["Captions", "captions", "captions_html", "shown_texts", "take_captions"]
