"""Voice aliases: the names chat clients send (OpenAI's `alloy`, `nova`, …) → the studio's voices and styles.

Open WebUI, SillyTavern and the OpenAI SDK's examples send OpenAI's voice names. Each name stands for a saved
voice (one of the owner's preset voices first) or a style preset, so a client that was never configured
still gets distinct voices. The owner sets their own with `--voice-alias alloy=Narrator` (or
`HIGGS_VOICE_ALIASES="alloy=Narrator,nova=Calm narrator"`); every target is checked at start-up.

    aliases = VoiceAliases.build(["alloy=Narrator"], voices=catalog, presets=store)   # ValueError: a sentence
    aliases.get("ALLOY")        # Alias(name="alloy", voice_id="v_3f…", style=None, shown="Narrator", configured=True)
    aliases.get("nova")         # the built-in table: Alias(name="nova", voice_id=None, style="Excited", …)

Which wins for a name: a configured alias, then a saved voice of that name, then the built-in table
(`StudioService.resolve_alias`, which also holds a visitor of a public page to the voices they may use).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from studio.text.presets import check_style_prefix
from studio.voices import VoiceNotFound

# OpenAI's built-in voice names, in the order the built-in table gives them the preset voices.
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse",
                 "marin", "cedar")
# Without preset voices (or past their number) each name speaks zero-shot in a style of its own: a
# style preset of presets/styles.json, or for the last two a tag prefix of their own.
DEFAULT_STYLES = {
    "alloy": "Neutral", "ash": "Confident", "ballad": "Warm", "coral": "Joyful", "echo": "Calm narrator",
    "fable": "Thoughtful", "nova": "Excited", "onyx": "Slow and clear", "sage": "Whisper", "shimmer": "Amused",
    "verse": "Surprised", "marin": "<|emotion:contentment|><|prosody:pitch_high|>",
    "cedar": "<|emotion:determination|><|prosody:speed_slow|>",
}
ENV = "HIGGS_VOICE_ALIASES"
RESERVED = "default"  # always the zero-shot voice


@dataclass(frozen=True, slots=True)
class Alias:
    """One name and what it speaks with: a saved voice (`voice_id`) or a style (`style`: a preset name or a
    tag prefix). `shown` is the target as people read it; `configured`: set by the owner, not built in."""

    name: str
    voice_id: str | None
    style: str | None
    shown: str
    configured: bool

    def as_json(self) -> dict:
        return {"name": self.name, "voice_id": self.voice_id, "style": self.style, "target": self.shown,
                "configured": self.configured}


def parse_specs(specs: Iterable[str]) -> dict[str, str]:
    """`["alloy=Narrator", "nova=Calm narrator,echo=Ann"]` → {"alloy": "Narrator", …}; names in lower case.
    Raises ValueError with a sentence for a spec without `=`, an empty side, a repeated name or `default`."""
    out: dict[str, str] = {}
    for spec in specs:
        for item in str(spec).split(","):
            if not item.strip():
                continue
            name, sep, target = item.partition("=")
            name, target = name.strip().lower(), target.strip()
            if not sep or not name or not target:
                raise ValueError(f"{item.strip()!r} is not NAME=VOICE_OR_STYLE, e.g. alloy=Narrator.")
            if name == RESERVED:
                raise ValueError(f"{RESERVED!r} always means the zero-shot voice; alias another name.")
            if name in out:
                raise ValueError(f"{name!r} is aliased twice ({out[name]!r} and {target!r}); keep one.")
            out[name] = target
    return out


class VoiceAliases:
    """The name → `Alias` table: the owner's aliases over the built-in one."""

    def __init__(self, aliases: Iterable[Alias] = ()):
        self._aliases = {a.name: a for a in aliases}

    @classmethod
    def build(cls, specs: Iterable[str] = (), *, voices=None, presets=None) -> VoiceAliases:
        """The owner's aliases (`specs`, checked: each target a saved voice, a style preset or a tag prefix) over
        the built-in table. ValueError with a sentence naming the bad alias and what exists."""
        table = {a.name: a for a in default_aliases(voices, presets)}
        for name, target in parse_specs(specs).items():
            table[name] = _configured(name, target, voices, presets)
        return cls(table.values())

    def get(self, name: str | None) -> Alias | None:
        return self._aliases.get(str(name).strip().lower()) if name else None

    def list(self) -> list[Alias]:
        """Configured ones first, then the built-in ones in OpenAI's order."""
        order = {name: i for i, name in enumerate(OPENAI_VOICES)}
        return sorted(self._aliases.values(), key=lambda a: (not a.configured, order.get(a.name, -1), a.name))


def default_aliases(voices=None, presets=None) -> list[Alias]:
    """The built-in table: OpenAI's names in order take the preset voices (by name), the rest their
    DEFAULT_STYLES entry (a style preset missing from `presets` is left out)."""
    preset_voices = sorted((v for v in voices.list() if v.preset), key=lambda v: v.name.lower()) \
        if voices is not None else []
    out = []
    for i, name in enumerate(OPENAI_VOICES):
        if i < len(preset_voices):
            voice = preset_voices[i]
            out.append(Alias(name, voice.id, None, voice.name, configured=False))
            continue
        style = DEFAULT_STYLES[name]
        if style.startswith("<|") or (presets is not None and presets.get(style) is not None):
            out.append(Alias(name, None, style, style, configured=False))
    return out


def _configured(name: str, target: str, voices, presets) -> Alias:
    where = f"--voice-alias {name}={target}"
    if target.startswith("<|"):
        try:
            return Alias(name, None, check_style_prefix(target), target, configured=True)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if voices is not None:
        try:
            voice = voices.get(target)
            return Alias(name, voice.id, None, voice.name, configured=True)
        except VoiceNotFound:
            pass
    preset = presets.get(target) if presets is not None else None
    if preset is not None:
        return Alias(name, None, preset.name, preset.name, configured=True)
    known = [v.name for v in voices.list()] if voices is not None else []
    styles = [p.name for p in presets.list()] if presets is not None else []
    raise ValueError(f"{where}: no saved voice or style preset is called {target!r} (voices: "
                     f"{_some(known)}; styles: {_some(styles)}). Save the voice first, or name one of these.")


def _some(names: list[str], limit: int = 8) -> str:
    if not names:
        return "none"
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
