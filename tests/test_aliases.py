"""studio/voices/aliases.py: the voice names chat clients send (`alloy`, …) → voices and styles, checked at start-up,
held to a visitor's rights in the service. (tests/test_chat_clients.py drives them through the `openai` SDK.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

import app
from engine.types import SamplingParams
from studio.takes.admission import Caller
from studio.voices.aliases import DEFAULT_STYLES, OPENAI_VOICES, VoiceAliases, default_aliases, parse_specs
from studio.text.presets import PresetStore, check_style_prefix
from studio.takes.service import StudioService, Order
from studio.voices import VoiceLibrary, VoiceNotFound
from studio.voices.catalog import VoiceCatalog
from tests.fakes import FakeEngine
from tests.helpers import CONSENT, fake_encode, speech_clip


@pytest.fixture()
def library(tmp_path):
    """A catalog with a private voice "Secret", a shared one "Open", and the built-in style presets."""
    catalog = VoiceCatalog(VoiceLibrary(tmp_path / "voices"))
    catalog.add(speech_clip(pitch=120), name="Secret", consent=CONSENT, encode=fake_encode())
    shared = catalog.add(speech_clip(pitch=200, seed=1), name="Open", consent=CONSENT, encode=fake_encode())
    catalog.update(shared.id, shared=True)
    return catalog, PresetStore(tmp_path / "presets.json")


def test_specs_parse_from_flags_and_the_env_form():
    assert parse_specs(["Alloy=Narrator", "nova = Calm narrator, echo=Ann", ""]) == {
        "alloy": "Narrator", "nova": "Calm narrator", "echo": "Ann"}
    for bad, why in (("alloy", "NAME=VOICE_OR_STYLE"), ("=Ann", "NAME=VOICE_OR_STYLE"), ("alloy=", "NAME="),
                     ("default=Ann", "zero-shot"), ("alloy=A,alloy=B", "twice")):
        with pytest.raises(ValueError, match=why):
            parse_specs([bad])


def test_the_builtin_table_gives_every_openai_name_its_own_style(library):
    catalog, presets = library
    table = {a.name: a for a in default_aliases(catalog, presets)}
    assert list(table) == list(OPENAI_VOICES)
    assert all(a.voice_id is None and not a.configured for a in table.values())
    assert len({a.style for a in table.values()}) == len(OPENAI_VOICES)  # distinct
    assert {a.name: a.style for a in table.values()} == DEFAULT_STYLES
    for a in table.values():  # each one a real preset or a valid prefix
        assert presets.get(a.style) is not None or check_style_prefix(a.style) == a.style


def test_preset_voices_come_first_in_the_builtin_table(library):
    class WithPresets:  # the catalog's read interface with two preset voices
        def __init__(self, voices):
            self.voices = voices

        def list(self):
            return self.voices

    catalog, presets = library
    voices = [replace(v, preset=True) for v in catalog.list()]  # "Open", "Secret" by name
    table = {a.name: a for a in default_aliases(WithPresets(voices), presets)}
    assert (table["alloy"].shown, table["ash"].shown) == ("Open", "Secret")
    assert table["alloy"].voice_id is not None and table["ballad"].style == "Warm"


def test_configured_aliases_are_checked_and_say_what_exists(library):
    catalog, presets = library
    aliases = VoiceAliases.build(["alloy=secret", "nova=Sad", "echo=<|emotion:awe|>"], voices=catalog, presets=presets)
    assert (aliases.get("ALLOY").voice_id, aliases.get("alloy").shown) == (catalog.get("Secret").id, "Secret")
    assert (aliases.get("nova").style, aliases.get("echo").style) == ("Sad", "<|emotion:awe|>")
    assert [a.name for a in aliases.list()][:3] == ["alloy", "echo", "nova"]  # configured first
    assert aliases.get("ash").style == DEFAULT_STYLES["ash"] and not aliases.get("ash").configured
    with pytest.raises(ValueError, match="--voice-alias alloy=Nobody: no saved voice or style preset is called "
                                         "'Nobody'") as refused:
        VoiceAliases.build(["alloy=Nobody"], voices=catalog, presets=presets)
    assert "Secret" in str(refused.value) and "Calm narrator" in str(refused.value)  # what exists
    with pytest.raises(ValueError, match="not a known control tag"):
        VoiceAliases.build(["alloy=<|emotion:bogus|>"], voices=catalog, presets=presets)


def test_a_bad_alias_stops_the_start_with_one_line(library, monkeypatch, capsys):
    catalog, presets = library
    monkeypatch.delenv("HIGGS_VOICE_ALIASES", raising=False)
    assert app.parse_args([]).voice_alias == []
    monkeypatch.setenv("HIGGS_VOICE_ALIASES", "alloy=Secret,nova=Sad")
    assert app.parse_args([]).voice_alias == ["alloy=Secret,nova=Sad"]
    args = app.parse_args(["--voice-alias", "alloy=Open", "--voice-alias", "nova=Whisper"])  # the flag wins
    assert args.voice_alias == ["alloy=Open", "nova=Whisper"]
    assert app.load_aliases(args, catalog, presets).get("alloy").shown == "Open"
    assert "Voice aliases: alloy=Open, nova=Whisper" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        app.load_aliases(app.parse_args(["--voice-alias", "alloy=Narrator"]), catalog, presets)
    message = str(stop.value)
    assert message.startswith("Cannot start the studio: --voice-alias alloy=Narrator: no saved voice")
    assert "\n" not in message


def test_an_alias_resolves_within_the_callers_rights(library):
    catalog, presets = library
    aliases = VoiceAliases.build(["alloy=Secret", "ash=Open"], voices=catalog, presets=presets)
    service = StudioService(FakeEngine(), catalog, presets, aliases=aliases)
    visitor = Caller.visitor("203.0.113.9")
    try:
        def take(voice, caller=None, style=None):
            request = Order(text="Hello.", voice=voice, style=style, params=SamplingParams(seed=1),
                                       **({"caller": caller} if caller else {}))
            return service.synthesize(request)

        owner = take("alloy")
        assert (owner.voice_name, owner.style) == ("Secret", None)
        with pytest.raises(VoiceNotFound, match="not shared with visitors"):
            take("alloy", visitor)
        assert take("ash", visitor).voice_name == "Open"  # a shared voice: visitors may use it
        nova = take("nova", visitor)  # the built-in table: a style, nobody's voice
        assert (nova.voice_id, nova.style, nova.prompt_text) == (None, "Excited", presets.get("Excited").prefix
                                                                 + "Hello.")
        assert take("nova", style="Sad").style == "Sad"  # an explicit style wins over the alias's
        catalog.delete(catalog.get("Secret").id)
        with pytest.raises(VoiceNotFound, match="was deleted"):
            take("alloy")
    finally:
        service.close()


def test_a_saved_voice_beats_the_builtin_table_but_not_the_owners_alias(library):
    catalog, presets = library
    voice = catalog.add(speech_clip(pitch=90, seed=3), name="Coral", consent=CONSENT, encode=fake_encode())
    service = StudioService(FakeEngine(), catalog, presets,
                            aliases=VoiceAliases.build(["nova=Open"], voices=catalog, presets=presets))
    try:
        assert service.resolve_alias("coral") is None  # the saved "Coral" is what the owner meant
        assert service.resolve_voice("coral").id == voice.id
        assert service.resolve_alias("nova").shown == "Open"
        assert service.resolve_alias("alloy").style == "Neutral"
        # A visitor cannot see the private "Coral": for them the name keeps its built-in meaning.
        assert service.resolve_alias("coral", Caller.visitor("x")).style == DEFAULT_STYLES["coral"]
    finally:
        service.close()
