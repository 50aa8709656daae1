"""`Order`: what was asked for one take, the one spelling every door writes (the page, its live player, the
speech API, its WebSocket, MCP, Wyoming, a project's render), and `OrderError`, a bad order's sentence with
the field it is about.

    order = Order(text="Hello there.", voice="Narrator", style="Calm narrator", params=SamplingParams.of(seed=7),
                  door="api")
    plan = prepare(service, order)     # studio/takes/prepare.py: checked, resolved, planned
    handle = run(service, plan)        # studio/takes/run.py: its TakeHandle, into the GPU line

Nothing here is resolved: `voice` is as the person wrote it (a saved voice's id or name, an alias such as
`alloy`, "default" or empty for the model's own voice), `style` a preset's name or a tag prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.types import SamplingParams
from studio.takes.admission import OWNER, Caller

DEFAULT_VOICE = "default"  # the model's own voice (no reference clip), by name, at every door


class OrderError(ValueError):
    """A bad order: the sentence for the person, the `field` of `Order` it is about ("text", "voice", "style",
    "speed", "clip", "voices", "params"), and a stable `code` where one applies ("invalid_ssml", …)."""

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None):
        super().__init__(message)
        self.field, self.code = field, code


@dataclass(frozen=True)
class Order:
    """One take as asked. `params.seed=None` draws a seed when the take is planned (`plan.params.seed`)."""

    text: str
    voice: str | None = None  # as written: a saved voice's id or name, an alias, "default"/None: zero-shot
    style: str | None = None  # a style preset's name or a tag prefix (SPEC D1); None: the voice's or alias's
    speed: float | None = None  # 0.25-4.0 as a prosody tag that replaces the style's own speed tag
    params: SamplingParams = field(default_factory=SamplingParams)
    clip: tuple[np.ndarray, int] | None = None  # (samples, sample rate): a one-off clone
    clip_text: str | None = None  # the clip's transcript
    voices: Mapping[str, str | None] | None = None  # a script: speaker → voice as written (None: zero-shot)
    clean: bool = False  # speak chat text: markdown, code, URLs and emoji removed (studio/text/clean.py)
    clean_actions: str = "speak"  # with `clean`: "speak" or "skip" the *actions*
    ssml: bool | None = None  # the text is SSML; None decides by its root (engine/ssml.py)
    normalize: bool = True  # numbers, dates and units written out as words (English text), before the dictionary
    dictionary: Any = None  # a recipe's pronunciation rules (studio/text/pronounce.py) instead of the studio's
    long: bool = False  # planned as a long take even when one prompt would hold it (the Long form tab's table)
    listen: bool = False  # a long take's segments are transcribed and retried when heard wrong
    caller: Caller = OWNER  # whose take: its limits, its voices and its turn in the line
    door: str = "api"  # where it came in: "ui", "api", "ws", "mcp", "wyoming", "project"; the history says so

    def check(self) -> None:
        """The checks that need nothing but the order itself (OrderError with a sentence)."""
        if not isinstance(self.text, str) or not self.text.strip():
            raise OrderError("Text is empty: type something to say.", field="text")
        for what, name, value in (("Text", "text", self.text), ("The style", "style", self.style),
                                  ("The clip's transcript", "clip", self.clip_text)):
            _check_unicode(what, name, value)
        if self.clip is not None:
            audio, sr = self.clip
            if not isinstance(sr, int | np.integer) or sr <= 0 or np.asarray(audio).size == 0:
                raise OrderError("The reference clip is empty or has no sample rate; upload or record it again.",
                                 field="clip")
            if self.voices:
                raise OrderError("A script takes its voices from its voices map; a one-off reference clip cannot "
                                 "be combined with it.", field="clip")
            if voice_named(self.voice):
                raise OrderError("Give either a saved voice or a reference clip, not both.", field="clip")


def voice_named(voice: str | None) -> bool:
    """Whether `voice` names a voice (not empty, not "default")."""
    return voice is not None and bool(str(voice).strip()) and str(voice).strip().lower() != DEFAULT_VOICE


def _check_unicode(what: str, name: str, value: str | None) -> None:
    """Refuse text that is not valid Unicode: a lone surrogate (JSON allows "\\ud800") breaks the tokenizer."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OrderError(f"{what} holds an invalid character at position {exc.start} (a lone UTF-16 surrogate). "
                         "Send valid Unicode text.", field=name) from None


__all__ = ["DEFAULT_VOICE", "Order", "OrderError", "voice_named"]
