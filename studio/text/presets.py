"""Style presets: named prefixes of inline control tags (SPEC D1, D2).

The model has no instruction slot, so a "style" is nothing but tags placed before the text, e.g.
`<|emotion:contemplation|><|prosody:speed_slow|>Hello.` Built-in presets are data (`presets/styles.json`);
users save their own into a JSON file through `PresetStore`. Every prefix is checked against the 43
known tags: an unknown tag would be read aloud.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.tokenizer import CONTROL_TAGS, ControlTag
from studio.files.durable import file_lock, replace_file
from studio.text import clean_line

BUILTIN_PATH = Path(__file__).resolve().parents[2] / "presets" / "styles.json"
STORE_FORMAT = "higgs-studio-presets/1"
MAX_NAME = 48
MAX_DESCRIPTION = 300
MAX_TAGS = 6
TEMPERATURE_RANGE = (0.05, 2.0)

_TAG = re.compile(r"<\|[^<>|]{0,64}\|>")
_TAGS_ONLY = re.compile(r"(?:\s*<\|[^<>|]{0,64}\|>)*\s*")


@dataclass(frozen=True, slots=True)
class StylePreset:
    """A named tag prefix. `temperature` is a suggestion for the sampler (None: keep the default)."""

    name: str
    description: str
    prefix: str
    temperature: float | None = None
    builtin: bool = False

    def to_json(self) -> dict:
        data = asdict(self)
        del data["builtin"]
        return data


def _group(tag: ControlTag) -> str:
    """Tags of one group contradict each other: one emotion, one style, one speed, one pitch, one expressiveness."""
    return tag.value.split("_")[0] if tag.category == "prosody" else tag.category


def check_style_prefix(prefix: str) -> str:
    """Validate a style prefix and return it normalised (tags joined with no space between them).

    A prefix holds only sentence-level control tags (emotion, style, speed, pitch, expressive), at most
    one of each group. `sfx` and pauses are positional (they belong inside the text, SPEC D2)."""
    if not isinstance(prefix, str):
        raise ValueError("A style prefix must be text made of tags such as <|emotion:contemplation|>.")
    if not _TAGS_ONLY.fullmatch(prefix):
        raise ValueError("A style prefix may contain only control tags such as <|emotion:contemplation|>; plain "
                         "words would be read aloud (the model has no instruction slot).")
    tags = _TAG.findall(prefix)
    if len(tags) > MAX_TAGS:
        raise ValueError(f"A style prefix has at most {MAX_TAGS} tags (got {len(tags)}).")
    seen: dict[str, str] = {}
    for raw in tags:
        tag = CONTROL_TAGS.get(raw)
        if tag is None:
            raise ValueError(f"{raw} is not a known control tag (it would be read aloud); see the tag list.")
        if not tag.sentence_level:
            raise ValueError(f"{raw} marks a position in the text, so it cannot be part of a style prefix; "
                             "put it where the effect should happen.")
        group = _group(tag)
        if group in seen:
            raise ValueError(f"{seen[group]} and {raw} contradict each other; keep one.")
        seen[group] = raw
    return "".join(tags)


def make_preset(name: str, prefix: str, *, description: str = "", temperature: float | None = None,
                builtin: bool = False) -> StylePreset:
    """A validated `StylePreset` (raises `ValueError` with a sentence for the user)."""
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise ValueError("The preset temperature must be a number.")
        low, high = TEMPERATURE_RANGE
        if not low <= float(temperature) <= high:
            raise ValueError(f"The preset temperature must be between {low} and {high} (got {temperature}).")
        temperature = float(temperature)
    return StylePreset(name=clean_line(name, "preset name", MAX_NAME, required=True),
                       description=clean_line(description, "preset description", MAX_DESCRIPTION),
                       prefix=check_style_prefix(prefix), temperature=temperature, builtin=builtin)


def _from_json(item, *, builtin: bool) -> StylePreset:
    if not isinstance(item, dict):
        raise ValueError("each preset must be a JSON object")
    return make_preset(item.get("name"), item.get("prefix", ""), description=item.get("description", ""),
                       temperature=item.get("temperature"), builtin=builtin)


def load_builtin_presets(path: str | Path = BUILTIN_PATH) -> list[StylePreset]:
    """The shipped style presets, validated (a bad entry in the data file is a bug: it raises)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [_from_json(item, builtin=True) for item in data["presets"]]


def apply_preset(text: str, preset: StylePreset | str) -> str:
    """`text` with the preset's tags in front, once.

    Leading tags already in the text that belong to a group the preset sets (emotion, style, speed,
    pitch, expressive) are replaced, so applying a preset twice, or switching presets, never stacks
    contradicting tags. Whitespace between the prefix and the text is dropped (it would be spoken as a
    separate space token before the first word)."""
    prefix = check_style_prefix(preset.prefix if isinstance(preset, StylePreset) else preset)
    if not prefix:
        return text
    ours = {_group(CONTROL_TAGS[t]) for t in _TAG.findall(prefix)}
    body = text.lstrip()
    kept: list[str] = []
    while (match := _TAG.match(body)) is not None:
        tag = CONTROL_TAGS.get(match.group())
        if tag is None or not tag.sentence_level:
            break
        if _group(tag) not in ours:
            kept.append(match.group())
        body = body[match.end():].lstrip()
    return prefix + "".join(kept) + body


class PresetStore:
    """Built-in presets plus the user's own, saved in one JSON file at `path`.

    Names are unique (case-insensitive) across both; built-ins cannot be replaced or deleted. Every
    save rewrites the file atomically (temp file, fsync, `os.replace`) under a thread lock and an
    `fcntl` lock, so concurrent writers from several processes never lose each other's presets."""

    def __init__(self, path: str | Path, *, builtins: list[StylePreset] | None = None):
        self.path = Path(path)
        self._builtins = load_builtin_presets() if builtins is None else list(builtins)
        self._lock = threading.Lock()

    def list(self) -> list[StylePreset]:
        return [*self._builtins, *self._read_user()]

    def get(self, name: str) -> StylePreset | None:
        """The preset called `name` (case-insensitive), or None."""
        key = " ".join(str(name).split()).casefold()
        return next((p for p in self.list() if p.name.casefold() == key), None)

    def add(self, name: str, prefix: str, *, description: str = "", temperature: float | None = None,
            replace: bool = False) -> StylePreset:
        """Save a user preset; `replace=True` overwrites the user's own preset of that name."""
        preset = make_preset(name, prefix, description=description, temperature=temperature)
        key = preset.name.casefold()
        if any(p.name.casefold() == key for p in self._builtins):
            raise ValueError(f"{preset.name!r} is a built-in preset; choose another name.")
        with self._locked():
            user = self._read_user()
            if any(p.name.casefold() == key for p in user) and not replace:
                raise ValueError(f"A preset called {preset.name!r} already exists; choose another name.")
            self._write_user([p for p in user if p.name.casefold() != key] + [preset])
        return preset

    def delete(self, name: str) -> None:
        key = " ".join(str(name).split()).casefold()
        if any(p.name.casefold() == key for p in self._builtins):
            raise ValueError(f"{name!r} is a built-in preset and cannot be deleted.")
        with self._locked():
            user = self._read_user()
            kept = [p for p in user if p.name.casefold() != key]
            if len(kept) == len(user):
                raise KeyError(f"No saved preset called {name!r}.")
            self._write_user(kept)

    # ------------------------------------------------------------------------------------------------

    def _read_user(self) -> list[StylePreset]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"The saved presets file {self.path} is unreadable ({exc}); fix or remove it.") from None
        if not isinstance(data, dict) or not isinstance(data.get("presets"), list):
            raise ValueError(f"The saved presets file {self.path} is not a presets file; fix or remove it.")
        return [_from_json(item, builtin=False) for item in data["presets"]]

    def _write_user(self, presets: list[StylePreset]) -> None:
        payload = json.dumps({"format": STORE_FORMAT, "presets": [p.to_json() for p in presets]},
                             ensure_ascii=False, indent=1)
        replace_file(self.path.parent, self.path.name, payload.encode("utf-8"))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(self.path.with_name(self.path.name + ".lock")):
                yield
