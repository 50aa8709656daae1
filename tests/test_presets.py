"""Style presets: shipped data is valid per SPEC D2, prefixes are linted, user presets persist atomically."""

from __future__ import annotations

import json
import os
import threading

import pytest

from engine.tokenizer import CONTROL_TAGS, lint_tags
from studio.text.presets import (BUILTIN_PATH, PresetStore, StylePreset, apply_preset, check_style_prefix,
                            load_builtin_presets)

REQUIRED = {"neutral", "calm narrator", "excited", "whisper", "slow and clear", "sad", "angry"}


def test_builtin_presets_cover_the_basics_and_lint_clean():
    presets = load_builtin_presets()
    names = [p.name.casefold() for p in presets]
    assert REQUIRED <= set(names) and len(presets) >= len(REQUIRED) + 3
    assert len(names) == len(set(names))
    assert next(p for p in presets if p.name == "Neutral").prefix == ""
    for preset in presets:
        assert preset.builtin and preset.description
        assert 0 < preset.temperature <= 2
        tags = preset.prefix.replace("|><|", "|>\n<|").split("\n") if preset.prefix else []
        assert all(tag in CONTROL_TAGS for tag in tags), preset.name
        assert lint_tags(preset.prefix + "Hello there. How are you?") == [], preset.name
    assert sum(1 for p in presets if p.prefix) >= len(presets) - 1


def test_data_file_is_the_source():
    raw = json.loads(BUILTIN_PATH.read_text())
    assert [p["name"] for p in raw["presets"]] == [p.name for p in load_builtin_presets()]


@pytest.mark.parametrize("prefix, match", [
    ("<|emotion:joy|>", "not a known control tag"),        # unknown value: would be read aloud
    ("<|emotion:Sadness|>", "not a known control tag"),    # tags are case-sensitive
    ("Speak slowly. <|prosody:speed_slow|>", "only control tags"),
    ("<|sfx:laughter|>", "marks a position"),
    ("<|prosody:pause|>", "marks a position"),
    ("<|emotion:anger|><|emotion:sadness|>", "contradict"),
    ("<|prosody:speed_slow|><|prosody:speed_fast|>", "contradict"),
    ("<|audio|>", "not a known control tag"),
    ("<|emotion:anger|>" * 7, "at most"),
])
def test_bad_prefixes_are_rejected(prefix, match):
    with pytest.raises(ValueError, match=match):
        check_style_prefix(prefix)


def test_prefix_is_normalised():
    assert check_style_prefix("  <|emotion:awe|>  <|prosody:speed_slow|> ") == "<|emotion:awe|><|prosody:speed_slow|>"
    assert check_style_prefix("") == ""
    # speed, pitch and expressiveness are different groups: they combine.
    check_style_prefix("<|prosody:speed_slow|><|prosody:pitch_low|><|prosody:expressive_low|>")


def test_apply_preset_prepends_once():
    calm = StylePreset("Calm", "", "<|emotion:contentment|><|prosody:speed_slow|>")
    once = apply_preset("Hello there.", calm)
    assert once == "<|emotion:contentment|><|prosody:speed_slow|>Hello there."
    assert apply_preset(once, calm) == once
    assert apply_preset("  Hello there.", calm) == once  # no space token between the tags and the first word
    assert apply_preset("Hello there.", StylePreset("Neutral", "", "")) == "Hello there."
    # Switching presets replaces tags of the same kind and keeps the others.
    angry = apply_preset("<|emotion:anger|><|style:whispering|>Go away.", calm)
    assert angry == "<|emotion:contentment|><|prosody:speed_slow|><|style:whispering|>Go away."
    assert lint_tags(angry) == []
    # A positional tag at the start is text, not part of the style: it stays after the prefix.
    assert apply_preset("<|sfx:laughter|>Haha, sure.", calm).endswith("<|sfx:laughter|>Haha, sure.")
    assert apply_preset("Hi.", "<|style:whispering|>") == "<|style:whispering|>Hi."


def test_store_add_list_delete_persist(tmp_path):
    path = tmp_path / "nested" / "presets.json"
    store = PresetStore(path)
    builtin_count = len(store.list())
    saved = store.add("  My   Story\x07voice ", " <|emotion:contemplation|> <|prosody:pitch_low|>",
                      description="for the podcast", temperature=0.75)
    assert saved.name == "My Story voice" and saved.prefix == "<|emotion:contemplation|><|prosody:pitch_low|>"
    assert json.loads(path.read_text())["presets"][0]["name"] == "My Story voice"
    reopened = PresetStore(path)
    assert len(reopened.list()) == builtin_count + 1
    assert reopened.get("my story VOICE") == saved
    assert reopened.get("calm narrator").builtin
    assert reopened.get("nothing") is None

    with pytest.raises(ValueError, match="already exists"):
        reopened.add("my story voice", "")
    replaced = reopened.add("my story voice", "<|style:whispering|>", replace=True)
    assert PresetStore(path).get("My Story voice") == replaced
    with pytest.raises(ValueError, match="built-in"):
        reopened.add("Whisper", "<|style:whispering|>")
    with pytest.raises(ValueError, match="built-in"):
        reopened.delete("whisper")
    with pytest.raises(ValueError, match="not a known"):
        reopened.add("bad", "<|emotion:happy|>")
    with pytest.raises(ValueError, match="temperature"):
        reopened.add("hot", "", temperature=7)

    reopened.delete("MY STORY VOICE")
    assert len(PresetStore(path).list()) == builtin_count
    with pytest.raises(KeyError):
        reopened.delete("my story voice")
    assert [p.name for p in tmp_path.joinpath("nested").iterdir() if p.name.endswith(".tmp")] == []


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "presets.json"
    store = PresetStore(path)
    store.add("first", "<|emotion:awe|>")
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.add("second", "<|emotion:relief|>")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_concurrent_adds_all_land(tmp_path):
    path = tmp_path / "presets.json"
    stores = [PresetStore(path) for _ in range(4)]  # separate objects: only the file lock orders them
    errors = []

    def worker(i):
        try:
            for j in range(5):
                stores[i].add(f"p{i}-{j}", "<|emotion:relief|>")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(1 for p in PresetStore(path).list() if not p.builtin) == 20


def test_corrupt_store_file_is_a_clear_error(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        PresetStore(path).list()
