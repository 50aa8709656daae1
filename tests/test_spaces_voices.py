"""Voices on a public studio (docs/SPACES.md): the owner's preset voices, encoded once and read-only, and
visitors' private voices, which live in the visitor's browser and reach the server only as codes in memory."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from engine.config import FULL_SIZE, SAMPLES_PER_FRAME
from studio.voices import VoiceError, VoiceLibrary, VoiceNotFound
from studio.voices.catalog import VoiceCatalog
from studio.voices.model import stage_audio
from studio.voices.presets import PresetVoices
from studio.voices.private import PrivateVoices, add_entries, export_bundle, from_browser
from tests.helpers import CONSENT, espeak_clip


class CountingEncoder:
    """Deterministic codes from the audio, counting calls (what an encode costs on the GPU)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, wav24k):
        self.calls += 1
        frames = len(wav24k) // SAMPLES_PER_FRAME
        seed = int(np.abs(wav24k).sum() * 1000) % 2 ** 31
        return torch.from_numpy(np.random.default_rng(seed).integers(0, FULL_SIZE.codebook_size,
                                                                     (frames, FULL_SIZE.codebooks)))


@pytest.fixture()
def preset_folder(tmp_path):
    folder = tmp_path / "presets"
    folder.mkdir()
    espeak_clip(folder / "ann.wav", "Good morning, this is Ann reading the news.")
    espeak_clip(folder / "bob.wav", "Hello, my name is Bob and I tell stories.")
    (folder / "config.json").write_text(json.dumps({
        "Ann": {"transcript": "Good morning, this is Ann reading the news.", "audio_file": "ann.wav"},
        "Bob": {"transcript": "Hello, my name is Bob and I tell stories.", "audio_file": "bob.wav"}}))
    folder.chmod(0o555)  # the folder is never written to: the codes are cached elsewhere
    yield folder
    folder.chmod(0o755)


def test_presets_are_encoded_once_and_cached_across_starts(preset_folder, tmp_path):
    encode = CountingEncoder()
    first = PresetVoices(preset_folder, encode=encode, cache_root=tmp_path / "cache")
    assert encode.calls == 2
    assert [(v.name, v.preset, v.has_codes) for v in first.list()] == [("Ann", True, True), ("Bob", True, True)]
    again = CountingEncoder()
    second = PresetVoices(preset_folder, encode=again, cache_root=tmp_path / "cache")  # the next start
    assert again.calls == 0
    assert [v.id for v in second.list()] == [v.id for v in first.list()]
    np.testing.assert_array_equal(second.get("Ann").codes(), first.get("Ann").codes())
    # An edited folder is a different set of presets: a fresh cache, encoded again.
    preset_folder.chmod(0o755)
    espeak_clip(preset_folder / "bob.wav", "Bob has a new clip now.")
    edited = CountingEncoder()
    PresetVoices(preset_folder, encode=edited, cache_root=tmp_path / "cache")
    assert edited.calls == 2


def test_presets_are_read_only_and_listed_after_the_library(preset_folder, tmp_path):
    library = VoiceLibrary(tmp_path / "library")
    mine = library.add((24000, np.sin(np.arange(48000) / 9.0).astype(np.float32) * 0.3), name="Mine",
                       transcript="", consent=CONSENT)
    catalog = VoiceCatalog(library, presets=PresetVoices(preset_folder, encode=CountingEncoder(),
                                                         cache_root=tmp_path / "cache"))
    assert [(v.name, v.preset) for v in catalog.list()] == [("Mine", False), ("Ann", True), ("Bob", True)]
    ann = catalog.get("ann")
    assert ann.preset
    for change in (lambda: catalog.delete("Ann"), lambda: catalog.rename("Ann", "Anna"),
                   lambda: catalog.update(ann.id, transcript="x"), lambda: catalog.export_zip([ann.id])):
        with pytest.raises(VoiceError, match="preset voices, which are read-only"):
            change()
    assert catalog.get("Ann").name == "Ann"
    catalog.rename(mine.id, "Still mine")  # the library stays writable
    ref = catalog.voice_ref("Bob", encode=CountingEncoder())
    assert ref.codes.shape == (catalog.get("Bob").frames, FULL_SIZE.codebooks)


def test_a_preset_voice_generates_and_the_api_lists_it(preset_folder, tmp_path, shared_engine):
    from fastapi.testclient import TestClient
    from fastapi import FastAPI

    from studio import api
    from engine.types import SamplingParams
    from studio.takes.service import StudioService, Order

    engine = shared_engine()
    encode = CountingEncoder()
    catalog = VoiceCatalog(VoiceLibrary(tmp_path / "library"),
                           presets=PresetVoices(preset_folder, encode=encode, cache_root=tmp_path / "cache"))
    service = StudioService(engine, catalog)
    try:
        take = service.synthesize(Order(text="Hi.", voice="Ann", params=SamplingParams(seed=1, max_frames=6)))
        assert take.voice_name == "Ann" and take.audio.size > 0
        assert encode.calls == 2  # generation used the cached codes
        app = FastAPI()
        api.register(app, service)
        with TestClient(app) as client:
            listed = client.get("/v1/audio/voices").json()["voices"]
            assert [(v["name"], v["preset"]) for v in listed if "alias" not in v] == [
                ("Default (zero-shot)", False), ("Ann", True), ("Bob", True)]
            # OpenAI's first names speak with the preset voices (studio/voices/aliases.py).
            assert [v["name"] for v in listed if "alias" in v][:2] == ["alloy (Ann)", "ash (Bob)"]
            gone = client.delete(f"/v1/audio/voices/{catalog.get('Ann').id}")
            assert gone.status_code == 403 and "read-only" in gone.text
    finally:
        service.close()


def staged(name, pitch, transcript="a short line"):
    t = np.arange(24000 * 2) / 24000
    audio = (0.3 * np.sin(2 * np.pi * pitch * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    s = stage_audio((24000, audio), name=name, transcript=transcript, consent=CONSENT)
    s.codes = CountingEncoder()(s.pcm.astype(np.float32) / 32768.0).numpy()
    return s


def test_private_voices_round_trip_through_the_browser_and_a_bundle(tmp_path):
    entries, added = add_entries([], [staged("Mine", 180)])
    assert added == ["Mine"]
    stored = json.loads(json.dumps(entries))  # what localStorage gives back
    voice_id, back = from_browser(stored[0])
    assert back.record["name"] == "Mine" and back.codes.shape[1] == FULL_SIZE.codebooks
    with pytest.raises(VoiceError, match="already have a voice called 'Mine'"):
        add_entries(stored, [staged("mine", 240)])
    assert add_entries(stored, [staged("Other name", 180)])[1] == []  # same content: kept once
    # A tampered entry is refused like a damaged bundle: the content hash no longer matches.
    tampered = json.loads(json.dumps(stored[0]))
    tampered["voice"]["transcript"] = "something else"
    with pytest.raises(VoiceError, match="content hash"):
        from_browser(tampered)

    # The export is an ordinary bundle: the owner's library imports it with its codes, ...
    bundle = export_bundle(stored)
    assert sorted(zipfile.ZipFile(io.BytesIO(bundle)).namelist()) == [
        f"{voice_id}/audio.wav", f"{voice_id}/codes.npy", f"{voice_id}/voice.json"]
    (imported,) = VoiceLibrary(tmp_path / "lib").import_zip(bundle)
    assert imported.id == voice_id and imported.name == "Mine"
    np.testing.assert_array_equal(imported.codes(), back.codes.astype(np.int64))


def test_private_voices_are_found_only_by_their_pages_handles(tmp_path):
    registry = PrivateVoices()
    entries, _ = add_entries([], [staged("Mine", 180)])
    kept, (voice,) = registry.register("session-a", entries + [{"voice": {}, "audio": "x", "codes": "y"}])
    assert kept == entries  # the damaged entry is dropped, the page still loads
    assert voice.id.startswith("pv_")
    catalog = VoiceCatalog(VoiceLibrary(tmp_path / "lib"), private=registry)
    assert catalog.list() == []  # private voices are never listed, to anyone
    assert catalog.get(voice.id).name == "Mine"
    ref = catalog.voice_ref(voice.id, encode=None)
    assert ref.codes.shape == voice.codes().shape
    _, (again,) = registry.register("session-a", entries)
    assert again.id == voice.id  # the page's choice stays valid after a save or an import
    _, (other,) = registry.register("session-b", entries)
    assert other.id != voice.id  # another page never learns this page's handles
    registry.drop("session-a")
    with pytest.raises(VoiceNotFound, match="reload the page"):
        catalog.get(voice.id)
    assert catalog.get(other.id).name == "Mine"
