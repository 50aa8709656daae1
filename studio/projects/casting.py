"""Casting: a chapter's own narrator voice and style over the project's (`Chapter.cast`, `{"voice"?, "style"?}`),
and the project's export loudness. A chapter's voice speaks its narration (the lines no script speaker says;
a script's speakers keep the voices the project's `voices` map gives them, as in Long form), its style is put
before its text; both are in each segment's key (studio/projects/recipes.py), so casting a chapter makes
exactly its segments stale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from studio.audio.loudness import TARGETS
from studio.projects.types import SegmentRow

CAST_FIELDS = ("voice", "style")


def cast_of(edit: dict, current: dict, voice_id: Callable[[str], str | None], check_style: Callable[[str], str]
            ) -> dict:
    """The chapter's cast after `edit` (a PATCH chapter entry): `voice` a saved voice (by id or name, looked up
    as every take's voice is), `style` a preset or tag prefix; null or "" takes the project's back."""
    cast = dict(current)
    for name in CAST_FIELDS:
        if name not in edit:
            continue
        value = edit[name]
        if value is not None and not isinstance(value, str):
            raise ValueError(f"A chapter's `{name}` is a string, or null for the project's.")
        if not (value or "").strip():
            cast.pop(name, None)
        elif name == "voice":
            found = voice_id(value.strip())
            if found is None:
                raise ValueError(f"{value!r} is not a saved voice; a chapter is cast to one of the voices saved in "
                                 "the Voices tab (or null for the project's narrator).")
            cast["voice"] = found
        else:
            check_style(value.strip())  # ValueError for an unknown preset or a bad prefix
            cast["style"] = value.strip()
    return cast


def with_cast(settings: dict, cast: dict | None) -> dict:
    """The settings a chapter is planned with: the project's, its style replaced by the chapter's."""
    if cast and cast.get("style"):
        return {**settings, "style": cast["style"]}
    return settings


def cast_segments(segments: list[SegmentRow], cast: dict | None) -> list[SegmentRow]:
    """The chapter's narration (segments no script speaker says) in the chapter's voice."""
    voice = (cast or {}).get("voice")
    if not voice:
        return segments
    return [replace(s, voice=voice) if s.speaker is None and s.voice is None else s for s in segments]


def checked_loudness(value) -> str | None:
    """The project's export loudness: a target's name (studio/audio/loudness.py TARGETS), or None: as rendered."""
    if value in (None, "", "off"):
        return None
    if value not in TARGETS:
        raise ValueError(f"`loudness` is one of {', '.join(TARGETS)} or \"off\", not {value!r}.")
    return value


__all__ = ["CAST_FIELDS", "cast_of", "cast_segments", "checked_loudness", "with_cast"]
