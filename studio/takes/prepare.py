"""`prepare(service, order) -> Plan`: an order checked, resolved and planned, once, in one order, on the
caller's thread (a bad order fails here, before it takes a place in the line):

    the caller's limit on the text sent → SSML → clean → the voice, its alias and the style (with notes)
    → the one single-or-long rule → segments → the pronunciation dictionary → the style prefix → tag lint

The one single-or-long rule: a script, an exact pause, or more speech than one prompt holds
(engine/longform.py MAX_SEGMENT_SECONDS; one prompt is cut at ~81 s) is one long take of segments, up to the
studio's --max-input-chars; anything else is one prompt. Every door follows it, so a text is voiced whole
whichever way it came in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config import FRAME_RATE
from engine.delay import default_max_frames
from engine.longform import MAX_SEGMENT_SECONDS, has_pauses, plan
from engine.normalize import AUTO, normalize_text
from engine.ssml import SPEED_TAGS, rate_tag, read_text
from engine.tokenizer import estimate_seconds, lint_tags, strip_tags
from engine.types import SamplingParams
from studio.takes.order import DEFAULT_VOICE, Order, OrderError, voice_named
from studio.text.clean import clean_text
from studio.text.presets import apply_preset
from studio.voices import VoiceNotFound
from studio.voices.aliases import OPENAI_VOICES

SPEED_RANGE = (0.25, 4.0)  # the OpenAI speech API's `speed`


@dataclass(frozen=True)
class Plan:
    """A prepared order: what the model will read and with which voices. `long`: one long take of `segments`;
    else one prompt, `prompt`. `voice` is the saved voice record (None: zero-shot or the order's clip),
    `records` the script's voices by name. `params` carry the seed the take runs with."""

    order: Order
    long: bool
    text: str  # the text as read: SSML read, cleaned (before the dictionary and the style)
    voice: Any
    style: str | None  # the style as resolved (a preset's name or a tag prefix), recorded in the take
    prefix: str  # its checked tag prefix, with the speed tag
    params: SamplingParams
    prompt: str = ""  # one prompt: the text the model reads
    fired: tuple = ()  # the pronunciation rules that fired on its text
    segments: tuple = ()  # a long take: its planned segments, respelled
    records: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    open: bool = False  # a long take whose text is still being written (the WebSocket's)
    alias: Any = None  # the alias the order's voice named (studio/voices/aliases.py), for a client wondering

    def shape(self) -> dict:
        """What the plan says will be spoken, without where it came from: equal for the same order at any door."""
        return {"long": self.long, "text": self.text, "voice": self.voice.id if self.voice is not None else None,
                "style": self.style, "prefix": self.prefix, "prompt": self.prompt,
                "segments": [(s.text, s.voice, s.pause_after) for s in self.segments],
                "records": {k: v.id for k, v in self.records.items()}, "params": self.params.as_dict(),
                "warnings": list(self.warnings)}

    def summary(self) -> str:
        """The plan in words, for the page before Generate: "one take, ~6 s" or "long take: 31 sentences, ~3 min";
        a take its length cap would cut says so, and where."""
        if not self.long:
            seconds = estimate_seconds(self.prompt)
            cap = (self.params.max_frames or default_max_frames(self.prompt)) / FRAME_RATE
            said = f"one take, ~{max(1, round(seconds))} s"
            if cap < seconds:
                return f"{said}, but cut at {cap:.0f} s: Max length is shorter than the text (raise it, or shorten " \
                       "the text)"
            return said
        seconds = sum(s.seconds + s.pause_after for s in self.segments)  # speech and its exact pauses
        size = f"~{seconds / 60:.0f} min" if seconds >= 90 else f"~{max(1, round(seconds))} s"
        return f"long take: {len(self.segments)} segments, {size}"


def is_long(text: str, voices: Mapping | None = None) -> bool:
    """The one single-or-long rule (module docstring)."""
    return bool(voices) or has_pauses(text) or estimate_seconds(text) > MAX_SEGMENT_SECONDS


def prepare(service, order: Order) -> Plan:
    """`order` checked and planned for `service` (studio/takes/service.py): OrderError, VoiceNotFound or
    ValueError with a sentence for a bad one."""
    order.check()
    service.limits.check_text(order.text, order.caller)
    text, notes = _read(order)
    voice, style, prefix, alias = resolve_voice_and_style(service, order, notes)
    params = service.limits.hold(order.params, text, order.caller).resolved()
    clone = voice is not None or order.clip is not None
    if order.long or is_long(text, order.voices):
        if service.engine.is_remote:
            raise OrderError("Long texts and scripts are generated in process; this studio drives a remote "
                             "server. Send at most one prompt's worth (about a minute of speech).", field="text")
        made: list[str] = []
        voices = {k: (v if voice_named(v) else None) for k, v in order.voices.items()} if order.voices else None
        try:
            segments = plan(text, style=prefix, normalize=order.normalize, voices=voices, notes=made)
        except ValueError as exc:
            raise OrderError(str(exc), field="text") from None
        records = {name: service.resolve_voice(name, order.caller)
                   for name in {s.voice for s in segments if s.voice is not None}}
        fired: list = []  # the rules that fired on any segment, in the order they first did (the recipe keeps them)

        def respelled(segment):
            record = records[segment.voice] if segment.voice is not None else voice
            spoken, rules = service.pronounce(segment.text, (record.id, record.name) if record is not None else (),
                                              only=order.dictionary)
            fired.extend(rule for rule in rules if rule not in fired)
            return dataclasses.replace(segment, text=spoken)
        segments = [respelled(segment) for segment in segments]
        clone = clone or bool(records)
        warnings = [*notes, *made, *(f"segment {s.index + 1}: {w.tag}: {w.message}"
                                     for s in segments for w in lint_tags(s.text, clone=clone))]
        return Plan(order, True, text, voice, style, prefix, params, segments=tuple(segments), records=records,
                    fired=tuple(fired), warnings=tuple(warnings), alias=alias)
    # Numbers written out as a long take's segments are, so the dictionary's rules see the same words.
    said = normalize_text(text.strip(), AUTO) if order.normalize else text.strip()
    spoken, fired = service.pronounce(said, (voice.id, voice.name) if voice is not None else (),
                                      only=order.dictionary)
    prompt = apply_preset(spoken, prefix)
    warnings = [*notes, *(f"{w.tag}: {w.message}" for w in lint_tags(prompt, clone=clone))]
    if service.engine.info.sampling_note:  # a remote server that sets sampling itself: say so rather than pretend
        warnings.append(service.engine.info.sampling_note)
    return Plan(order, False, text, voice, style, prefix, params, prompt=prompt, fired=tuple(fired),
                warnings=tuple(warnings), alias=alias)


def prepare_open(service, order: Order) -> Plan:
    """A long take whose text is still being written: only its voice, style and settings are checked now
    (its text comes sentence by sentence, each respelled as it comes)."""
    order = dataclasses.replace(order, text=order.text or "x")
    order.check()
    notes: list[str] = []
    voice, style, prefix, alias = resolve_voice_and_style(service, order, notes)
    if service.engine.is_remote:
        raise OrderError("Streamed text is generated in process; this studio drives a remote server.", field="text")
    params = order.params  # a sentence's own length cap holds each sentence under the public page's limit
    if params.max_frames is not None:
        params = service.limits.hold(params, "", order.caller)
    return Plan(order, True, "", voice, style, prefix, params.resolved(), warnings=tuple(notes), open=True,
                alias=alias)


def _read(order: Order) -> tuple[str, list[str]]:
    """The text to speak: SSML read (its pauses as markers), then chat text cleaned."""
    try:
        read = read_text(order.text, order.ssml)
    except ValueError as exc:
        raise OrderError(f"The text is not SSML this studio reads: {exc}", field="text", code="invalid_ssml") \
            from None
    text, notes = read.text, list(read.warnings)
    if not text.strip():
        raise OrderError("The text has no words to speak inside its SSML.", field="text")
    if order.clean:
        text = clean_text(text, actions=order.clean_actions or "speak")
        if not strip_tags(text).strip():
            raise OrderError("The text has nothing left to say once the markdown, code, links"
                             + (", emoji and *actions*" if order.clean_actions == "skip" else " and emoji")
                             + " are removed: send text with words in it, or turn cleaning off.",
                             field="text", code="empty_after_clean")
    return text, notes


def lookup_voice(service, name: str | None, caller) -> tuple[Any, Any, str | None]:
    """A voice as written → (its saved record or None, the alias it named or None, a note or None). A configured
    alias wins over a saved voice of that name, which wins over the built-in table; an OpenAI voice name nothing
    stands for is the model's own voice, with a note. VoiceNotFound naming the voice for anything else."""
    if not voice_named(name):
        return None, None, None
    key = str(name).strip()
    alias = service.resolve_alias(key, caller)
    if alias is not None:
        return (service.resolve_voice(alias.voice_id, caller) if alias.voice_id else None), alias, None
    try:
        return service.resolve_voice(key, caller), None, None
    except VoiceNotFound:
        if key.lower() in OPENAI_VOICES:
            return None, None, (f"'{key}' is an OpenAI voice name and no saved voice has it: used the default "
                                "(zero-shot) voice")
        raise VoiceNotFound(f"No voice called {key!r}: pick one from the voice list, or use {DEFAULT_VOICE!r} (or "
                            "no voice) for the model's own voice.") from None


def speed_tag(speed: float) -> str:
    """`speed` → the prosody tag that approximates it ('' for normal speed); OrderError out of range."""
    lo, hi = SPEED_RANGE
    if not lo <= speed <= hi:
        raise OrderError(f"speed must be between {lo} and {hi} (got {speed:g}).", field="speed")
    return rate_tag(speed)


def resolve_voice_and_style(service, order: Order, notes: list[str]) -> tuple[Any, str | None, str, Any]:
    """The order's voice record, its style as resolved, the style's tag prefix with the speed tag, and the alias
    its voice named (or None). The style
    is the order's, else its alias's, else its saved voice's own."""
    voice, alias, note = lookup_voice(service, order.voice, order.caller)
    if note:
        notes.append(note)
    style = order.style if order.style is not None and str(order.style).strip() else None
    if style is None and alias is not None:
        style = alias.style
    if style is None and voice is not None:
        style = voice.style or None
    try:
        prefix = service.resolve_style(style)
    except ValueError as exc:
        raise OrderError(str(exc), field="style") from None
    if order.speed is not None:
        tag = speed_tag(float(order.speed))
        if tag:
            replaced = [t for t in SPEED_TAGS if t in prefix]
            for t in replaced:  # an explicit speed wins over the style's own speed tag
                prefix = prefix.replace(t, "")
            prefix += tag
            notes.append(f"speed {float(order.speed):g} -> {tag}" + (f" (instead of {replaced[0]})" if replaced
                                                                      else ""))
    return voice, style, prefix, alias


__all__ = ["Plan", "SPEED_RANGE", "is_long", "prepare", "prepare_open", "lookup_voice", "resolve_voice_and_style",
           "speed_tag"]
