"""One way in (studio/takes/): the same order through each of the seven doors gives an equal plan, and the same
seed the same audio; an unknown voice is named at every door.

The doors, driven in process with their real code over one service on the demo engine: the page's Gradio event
(its handler), the page's live stream (`POST /studio/live`), `POST /v1/audio/speech`, the speech WebSocket,
MCP's `synthesize` tool, Wyoming (the `wyoming` package's client over TCP) and a project's plan. Every plan
made goes through `prepare`, which this module records.

The WebSocket's text arrives as it is written, so its take is an open plan whose segments are its sentences:
its voice, style and settings equal the others' and it voices every sentence of the text. A project plans its
chapters with the same planner and dictionary: its segments' texts equal the plan's.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json

import numpy as np
import pytest
import soundfile as sf
from fastapi import FastAPI
from fastapi.testclient import TestClient
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeVoice

from engine.types import SamplingParams
from studio import api
from studio.api import mcp
from studio.api.wyoming import WyomingServer
from studio.audio.formats import to_pcm16
from studio.projects.importing import from_text
from studio.projects.library import Projects
from studio.projects.store import Store
from studio.takes import prepare as prepare_module
from studio.takes.order import Order
from studio.takes.service import StudioService
from studio.views.live import ROUTE, TOKEN_HEADER
from studio.views.page import Page
from studio.voices import VoiceLibrary
from tests.fakes import add_voices
from tests.studio_server import free_port

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

SEED, FRAMES = 11, 6  # short segments: the demo's random weights run to the cap
SENTENCES = ["The tide came in over the flats, slow and grey.", "Birds lifted off the sand in one long sweep.",
             "Nobody on the pier said a word about the weather.", "A boat waited at the end of the jetty.",
             "Its lamp swung once, then again, and went still."]
LONG = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(64))[:3000].rsplit(" ", 1)[0] + "."
SHORT = "Hello there, and welcome back."
WAIT = 300.0
LIVE_IDS = itertools.count()


@pytest.fixture(scope="module")
def studio(tmp_path_factory, shared_engine):
    """One service with a saved voice, the page built on it, the HTTP routes and the page's live route on one app,
    a Wyoming server, a projects library, and the record of every plan prepared."""
    tmp = tmp_path_factory.mktemp("doors")
    library = VoiceLibrary(tmp / "voices")
    service = StudioService(shared_engine(), library)
    add_voices(library, service, (("Narrator", 140.0),))
    library.update("Narrator", shared=True)  # a Wyoming client may use it
    page = Page(service)
    blocks = page.build()
    mcp.register(blocks, service)
    app = FastAPI()
    api.register(app, service)
    page.player.mount(app)
    port = free_port()
    wyoming = WyomingServer(service, f"tcp://127.0.0.1:{port}", params=SamplingParams.of(seed=SEED, max_frames=FRAMES))
    wyoming.start()
    store = Store(tmp / "projects")
    plans: list = []

    def recording(real):
        def prepare(service_, order):
            plan = real(service_, order)
            plans.append(plan)
            return plan
        return prepare

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("studio.takes.service.prepare", recording(prepare_module.prepare))
        mp.setattr("studio.takes.service.prepare_open", recording(prepare_module.prepare_open))
        with TestClient(app) as client:
            yield {"service": service, "page": page, "blocks": blocks, "client": client, "port": port, "wyoming": wyoming,
                   "projects": Projects(store, service), "plans": plans}
    wyoming.stop()
    store.close()
    service.close()


# ------------------------------------------------------------------------------------------------ the doors

def page_event(s, text, voice, frames=None):
    """The page's Generate (its Gradio handler, without the live player): the take it records."""
    args = {"text": text, "style": "", "voice": voice or "", "clip": None, "clip_text": "", "temperature": 0.8,
            "top_p": 0.8, "top_k": 30, "seed": SEED, "max_frames": frames or 0, "repeat_guard": 32, "takes_n": 1,
            "takes": [], "request": None}
    for _ in s["page"].takes.generate(**args):
        pass
    return to_pcm16(s["service"].history[-1].audio)


def live(s, text, voice, frames=None):
    fields = {"text": text, "style": "", "voice": voice or "", "clip_text": "", "temperature": 0.8, "top_p": 0.8,
              "top_k": 30, "seed": SEED, "max_frames": frames or 0, "repeat_guard": 32,
              "live_id": f"door-{next(LIVE_IDS)}-abcdef"}
    token = {TOKEN_HEADER: s["page"].player.issue_token()}
    with s["client"].stream("POST", ROUTE, data={"request": json.dumps(fields)}, headers=token) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    errors = [m["message"] for m in lines if m["type"] == "error"]
    if errors:
        raise ValueError(errors[0])
    s["page"].player.wait(fields["live_id"])
    return np.frombuffer(b"".join(base64.b64decode(m["pcm"]) for m in lines if m["type"] == "audio"), "<i2")


def speech(s, text, voice, frames=None):
    body = {"model": "higgs-audio-v3", "input": text, "voice": voice or "default", "response_format": "pcm",
            "seed": SEED, "max_frames": frames}
    r = s["client"].post("/v1/audio/speech", json=body)
    if r.status_code != 200:
        raise ValueError(r.json()["error"]["message"])
    return np.frombuffer(r.content, "<i2")


def websocket(s, text, voice, frames=FRAMES):
    """The text as an LLM writes it, in pieces; the sentences spoken (each its own segment) and the audio."""
    with s["client"].websocket_connect("/v1/audio/speech/stream") as ws:
        ws.send_json({"seed": SEED, "max_frames": frames, **({"voice": voice} if voice else {})})
        ready = ws.receive_json()
        if ready["type"] == "error":
            raise ValueError(ready["message"])
        for at in range(0, len(text), 40):
            ws.send_json({"text": text[at:at + 40]})
        ws.send_json({"end": True})
        audio, sentences = bytearray(), []
        while True:
            message = ws.receive()
            if message.get("bytes") is not None:
                audio += message["bytes"]
                continue
            event = json.loads(message["text"])
            if event["type"] == "sentence":
                sentences.append(event["text"])
            if event["type"] == "error":
                raise ValueError(event["message"])
            if event["type"] == "done":
                return np.frombuffer(bytes(audio), "<i2"), sentences


def mcp_tool(s, text, voice, frames=None):
    """MCP's `synthesize` tool as Gradio's MCP bridge calls it: the WAV it hands back. The tool has no length
    setting: its takes run to their automatic length (`frames` is not sent)."""
    synthesize = next(f.fn for f in s["blocks"].fns.values() if f.api_name == "synthesize")
    import gradio as gr
    try:
        data = synthesize(text, voice or "", "", SEED)
    except gr.Error as exc:
        raise ValueError(exc.message) from None
    audio, rate = sf.read(io.BytesIO(open(data.path, "rb").read()), dtype="int16")
    return audio


def wyoming(s, text, voice, frames=None):
    s["wyoming"].params = SamplingParams.of(seed=SEED, max_frames=frames)  # the server's settings, from its flags

    async def run():
        c = AsyncTcpClient("127.0.0.1", s["port"])
        await c.connect()
        try:
            await c.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice or "default")).event())
            chunks = []
            while True:
                event = await asyncio.wait_for(c.read_event(), WAIT)
                assert event is not None, "the Wyoming server closed the connection"
                if Error.is_type(event.type):
                    raise ValueError(Error.from_event(event).text)
                if AudioChunk.is_type(event.type):
                    chunks.append(AudioChunk.from_event(event).audio)
                if AudioStop.is_type(event.type):
                    return np.frombuffer(b"".join(chunks), "<i2")
        finally:
            await c.disconnect()
    return asyncio.run(run())


def project(s, text, voice, frames=None):
    """A project made of the text: its planned segments' spoken texts."""
    projects = s["projects"]
    created = projects.create("owner", from_text(text), {"voice": voice, "seed": SEED, "max_frames": frames})
    return [p.text for p in projects.planned(created.id)]


DOORS = {"page": page_event, "live": live, "speech": speech, "mcp": mcp_tool, "wyoming": wyoming}


@pytest.mark.parametrize("text, frames", [(SHORT, None), (LONG, FRAMES)], ids=["one prompt", "3,000 characters"])
def test_the_same_order_gives_the_same_plan_and_the_same_audio_at_every_door(studio, text, frames):
    """One prompt at its automatic length through every door; the 3,000-character text with a short cap on each
    segment (MCP's tool has no length setting: its plan is compared but for the cap, and it voices every
    segment at full length)."""
    plans, audio, shapes = studio["plans"], {}, {}
    for name, door in DOORS.items():
        plans.clear()
        audio[name] = door(studio, text, "Narrator", frames)
        assert len(plans) == 1, (name, len(plans))  # prepared once, by the one way in
        shapes[name] = plans[0].shape()
    first = shapes["page"]
    assert first["long"] == (text == LONG) and first["voice"] is not None
    assert first["params"]["seed"] == SEED and first["params"]["max_frames"] == frames
    uncapped = lambda shape: {**shape, "params": {**shape["params"], "max_frames": None}}  # noqa: E731
    for name, shape in shapes.items():
        assert (uncapped(shape) == uncapped(first)) if name == "mcp" and frames else (shape == first), name
    want = audio["page"]
    assert want.size > 0
    for name, got in audio.items():
        if name == "mcp" and frames:
            assert got.size > want.size  # the same segments, each at its full length
        else:
            assert np.array_equal(got, want), name
    if text == LONG:  # every sentence is voiced: the segments hold the whole text
        assert len(first["segments"]) > 10
        assert " ".join(t.split("|>")[-1] for t, _, _ in first["segments"]).split() == text.split()

    plans.clear()
    streamed, sentences = websocket(studio, text, "Narrator", frames or FRAMES)
    (open_plan,) = plans
    assert open_plan.open and streamed.size > 0
    assert {k: v for k, v in open_plan.shape().items() if k in ("voice", "style", "prefix")} == \
        {k: first[k] for k in ("voice", "style", "prefix")}
    assert open_plan.params.seed == SEED
    assert " ".join(sentences).split() == text.split()  # every word of the text, in order

    segments = project(studio, text, "Narrator", frames)
    if first["long"]:
        assert segments == [t for t, _, _ in first["segments"]]
    else:
        assert " ".join(segments) == first["prompt"]


@pytest.mark.parametrize("door", [*DOORS, "websocket", "project"])
def test_an_unknown_voice_is_named_at_every_door(studio, door):
    run = {**DOORS, "websocket": websocket, "project": project}[door]
    with pytest.raises(ValueError, match="'Nobody'"):
        run(studio, SHORT, "Nobody")
    assert studio["service"].queue_depth == 0


def test_every_door_writes_an_order(studio):
    """The doors turn their input into an `Order` and nothing else prepares a take (the plans recorded above)."""
    plans = studio["plans"]
    plans.clear()
    studio["service"].synthesize(Order(text=SHORT, params=SamplingParams(seed=SEED, max_frames=FRAMES)))
    assert len(plans) == 1 and plans[0].order.door == "api"


def test_a_project_reads_its_voices_as_every_door_does(studio):
    """A project's voice and its script's voices are looked up as an order's: an OpenAI voice name nothing
    stands for is the model's own voice (as at the speech API), an unknown one is named."""
    projects = studio["projects"]
    script = from_text("A: Hello there.\nB: And welcome back.")
    created = projects.create("owner", script, {"voice": "alloy", "voices": {"A": "Narrator", "B": "nova"}, "seed": SEED})
    settings = projects.project(created.id).settings
    narrator = studio["service"].resolve_voice("Narrator").id
    assert settings["voice"] is None and settings["voices"] == {"A": narrator, "B": None}
    with pytest.raises(ValueError, match="'Nobody'"):
        projects.create("owner", script, {"voices": {"A": "Nobody", "B": None}})
