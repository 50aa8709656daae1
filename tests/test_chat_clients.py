"""What chat clients send, through the official `openai` SDK against the real service and API in process (the demo
checkpoint): OpenAI's voice names speak with their aliases, and `clean` keeps markdown from being read aloud.

A take's codes depend only on its prompt, voice and settings (docs/ARCHITECTURE.md, batch invariance), so two
requests that must speak the same way are compared by `X-Codes-SHA256` at the same seed."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from studio.voices.aliases import DEFAULT_STYLES, OPENAI_VOICES, VoiceAliases
from studio.text.presets import PresetStore
from studio.takes.service import StudioService
from studio.voices import VoiceLibrary
from studio.voices.catalog import VoiceCatalog
from tests.fakes import add_voices

openai = pytest.importorskip("openai")

TAKE = {"seed": 21, "max_frames": 12, "stream": False}  # one buffered body: the codes' hash in its headers


@pytest.fixture(scope="module")
def studio(tmp_path_factory, shared_engine):
    """The owner's API with saved voices "Narrator" and "Ann", started as app.py does with
    `--voice-alias alloy=Narrator --voice-alias nova=Sad` (the rest: the built-in table)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    root = tmp_path_factory.mktemp("chat")
    catalog = VoiceCatalog(VoiceLibrary(root / "voices"))
    presets = PresetStore(root / "presets.json")
    service = StudioService(shared_engine(), catalog, presets)
    add_voices(catalog, service, (("Narrator", 130.0), ("Ann", 220.0)))
    service.aliases = VoiceAliases.build(["alloy=Narrator", "nova=Sad"], voices=catalog, presets=presets)
    app = FastAPI()
    api.register(app, service)
    with TestClient(app) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="any", http_client=http, max_retries=0), http
    service.close()


def speak(client, text: str, **fields):
    """(codes hash, samples, headers) of one take through the SDK; `fields` beyond voice/instructions travel in
    the body as the SDK's `extra_body`."""
    known = {k: fields.pop(k) for k in ("voice", "instructions") if k in fields}
    raw = client.audio.speech.with_raw_response.create(model="tts-1", input=text, response_format="wav",
                                                       voice=known.pop("voice", "default"),
                                                       extra_body={**TAKE, **fields}, **known)
    samples, _ = sf.read(io.BytesIO(raw.content), dtype="int16")
    return raw.headers["x-codes-sha256"], samples, raw.headers


def test_openai_voice_names_speak_with_their_aliases(studio):
    client, _ = studio
    text = "Hello from a chat client."
    alloy, alloy_audio, headers = speak(client, text, voice="alloy")
    narrator, narrator_audio, _ = speak(client, text, voice="Narrator")
    assert alloy == narrator and np.array_equal(alloy_audio, narrator_audio)  # the saved voice, not zero-shot
    assert headers["x-voice-alias"] == "alloy=Narrator"
    assert speak(client, text, voice="NOVA")[0] == speak(client, text, instructions="Sad")[0]
    shimmer = speak(client, text, voice="shimmer")[0]  # not configured: the built-in table
    assert shimmer == speak(client, text, instructions=DEFAULT_STYLES["shimmer"])[0]
    # `instructions` still wins over the alias's style.
    assert speak(client, text, voice="nova", instructions=DEFAULT_STYLES["shimmer"])[0] == shimmer
    others = {name: speak(client, text, voice=name)[0] for name in ("ash", "echo", "marin")}
    zero_shot = speak(client, text)[0]
    ann = speak(client, text, voice="Ann")[0]
    assert len({alloy, shimmer, zero_shot, ann, speak(client, text, voice="nova")[0], *others.values()}) == 8


def test_the_voice_list_shows_every_alias_and_what_it_speaks_with(studio):
    _, http = studio
    listed = http.get("/v1/audio/voices").json()["voices"]
    aliases = {v["id"]: v for v in listed if "alias" in v}
    assert set(aliases) == set(OPENAI_VOICES)
    assert aliases["alloy"]["name"] == "alloy (Narrator)" and aliases["alloy"]["alias"]["configured"] is True
    assert aliases["nova"]["alias"]["style"] == "Sad"
    assert aliases["echo"]["alias"] == {"name": "echo", "voice_id": None, "style": "Calm narrator",
                                        "target": "Calm narrator", "configured": False}
    assert listed[0]["id"] == "default"
    assert not any("alias" in v for v in http.get("/v1/audio/voices?format=openai").json()["data"])


MARKDOWN = ("## Today's plan\n\n*smiles* Here is **what** we do:\n\n- read [the guide](https://example.com/guide)\n"
            "- run `pip install higgs` 🎉\n\n```bash\necho 'never spoken'\n```\n")


def test_clean_speaks_the_words_of_markdown_not_its_marks(studio):
    client, _ = studio
    cleaned = speak(client, MARKDOWN, clean=True)[0]
    assert cleaned == speak(client, "Today's plan.\n\nsmiles Here is what we do:\n\nread the guide.\n\nrun.")[0]
    assert cleaned != speak(client, MARKDOWN)[0]  # without `clean` the marks and the code are in the prompt
    skipped = speak(client, MARKDOWN, clean=True, clean_actions="skip")[0]
    assert skipped == speak(client, "Today's plan.\n\nHere is what we do:\n\nread the guide.\n\nrun.")[0]
    tagged = "<|emotion:awe|>**Wow**, <|prosody:pause|> look: https://example.com"
    assert speak(client, tagged, clean=True)[0] == speak(client, "<|emotion:awe|>Wow, <|prosody:pause|> look:")[0]


def test_text_with_nothing_left_to_say_after_cleaning_is_a_400(studio):
    client, _ = studio
    with pytest.raises(openai.BadRequestError, match="nothing left to say") as refused:
        speak(client, "```\nprint('hi')\n```\n\n🎉 https://example.com <|emotion:awe|>", clean=True)
    assert refused.value.code == "empty_after_clean"
    with pytest.raises(openai.UnprocessableEntityError, match="clean_actions"):
        speak(client, "Hi.", clean=True, clean_actions="mumble")
