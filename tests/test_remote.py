"""`engine.remote.RemoteEngine`: request mapping and stream reading against scripted servers
(`httpx.MockTransport`), then parity against a real studio in a subprocess: a greedy take with a fixed
seed fetched over HTTP has the in-process take's codes (compared by fingerprint) and its samples up to the
codec's float rounding (another process may block its convolutions differently on another CPU)."""

from __future__ import annotations

import base64
import io
import json
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.generate import codes_sha256
from engine.remote import RemoteEngine, RemoteError, RemoteVoice, parse_voices
from studio.formats import to_pcm16
from tests.studio_server import running_studio

KEY = "remote-key"


# ------------------------------------------------------------------------------------------ voice lists

def test_reads_all_four_voice_list_shapes():
    ours = {"voices": [{"id": "default", "name": "Default (zero-shot)"}, {"id": "v_ab", "name": "Ann", "ref_text": "Hi."}]}
    assert [(v.id, v.name, v.kind, v.ref_text) for v in parse_voices(ours)] == [
        ("default", "Default (zero-shot)", "builtin", None), ("v_ab", "Ann", "saved", "Hi.")]
    openai_like = {"object": "list", "data": [{"id": "voice_1", "name": "Bo"}, {"voice": "voice_2",
                                                                                 "description": "Boson item"}]}
    assert [(v.id, v.name) for v in parse_voices(openai_like)] == [("voice_1", "Bo"), ("voice_2", "voice_2")]
    omni = {"voices": ["default", "alice"], "uploaded_voices": [{"name": "alice", "consent": "yes",
                                                                 "ref_text": "Hello."}], "cache_stats": {}}
    assert [(v.id, v.kind, v.ref_text) for v in parse_voices(omni)] == [("default", "builtin", None),
                                                                       ("alice", "saved", "Hello.")]
    chatterbox = {"status": "ok", "voices": ["narrator.wav", "Emily.mp3"]}
    assert [(v.id, v.name) for v in parse_voices(chatterbox)] == [("narrator.wav", "narrator"), ("Emily.mp3", "Emily")]
    with pytest.raises(RemoteError, match="voice list"):
        parse_voices("nope")


# ------------------------------------------------------------------------------------------ request body

def test_speech_body_maps_style_voice_and_clone_fields():
    engine = RemoteEngine("http://server:8000/v1/", model="higgs-tts-3")
    assert engine.base_url == "http://server:8000"
    body = engine.speech_body("Hello.", style="<|emotion:awe|>", voice="alice", temperature=0, seed=5, max_frames=40)
    assert body == {"model": "higgs-tts-3", "input": "<|emotion:awe|>Hello.", "response_format": "pcm",
                    "stream": True, "voice": "alice", "temperature": 0, "seed": 5, "max_new_tokens": 40}
    clip = RemoteVoice(wav_bytes=b"RIFF1234", transcript="Hi there.")
    body = engine.speech_body("Hello.", voice=clip, repeat_guard=None)
    assert body["ref_audio"] == "data:audio/wav;base64," + base64.b64encode(b"RIFF1234").decode()
    assert body["ref_text"] == "Hi there." and "voice" not in body and body["repeat_guard"] is None
    assert "instructions" not in body  # Higgs servers ignore it: style travels inside `input`
    with pytest.raises(ValueError, match="no text"):
        engine.speech_body("  ")
    with pytest.raises(ValueError, match="http"):
        RemoteEngine("server:8000")


def test_encode_voice_keeps_the_samples_exactly():
    clip = (np.sin(np.arange(30000) / 9) * 0.3).astype(np.float32)
    voice = RemoteEngine("http://x").encode_voice(clip, 22050, transcript="words")
    data, rate = sf.read(io.BytesIO(voice.wav_bytes), dtype="float32")
    assert rate == 22050 and np.array_equal(data, clip) and voice.transcript == "words"


# ------------------------------------------------------------------------------------------ scripted servers

PCM = (np.sin(np.arange(5 * SAMPLES_PER_FRAME) / 5) * 20000).astype("<i2")


class OddChunks(httpx.SyncByteStream):
    """A body delivered in odd-sized pieces, so samples straddle reads."""

    def __init__(self, data: bytes, sizes=(1, 777, 3001, 5)):
        self.data, self.sizes = data, sizes

    def __iter__(self):
        i = k = 0
        while i < len(self.data):
            n = self.sizes[k % len(self.sizes)]
            yield self.data[i:i + n]
            i, k = i + n, k + 1


def pcm_response(**headers):
    return httpx.Response(200, headers={"content-type": "audio/pcm", "x-sample-rate": "24000", **headers},
                          stream=OddChunks(PCM.tobytes()))


def test_stream_reads_pcm_across_odd_reads_and_measures_metrics():
    seen = []

    def handler(request: httpx.Request):
        if request.url.path == "/health":
            return httpx.Response(200, json={"precision": "bf16"})
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == "Bearer k"
        return pcm_response(**{"x-seed": "77"})

    engine = RemoteEngine("http://s", api_key="k", transport=httpx.MockTransport(handler))
    chunks = list(engine.generate_stream("Hi.", seed=None))
    audio = np.concatenate([c.audio for c in chunks])
    assert np.array_equal(to_pcm16(audio), PCM)  # /32767 on the way in undoes to_pcm16's ×32767 exactly
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True] and len(chunks) > 2
    last = chunks[-1].metrics
    assert last.frames == 5 and last.seed == 77 and last.backend == "remote" and last.precision == "bf16"
    assert last.ttfa_ms is not None and last.ttfa_ms >= 0 and last.rtf > 0 and last.stop_reason == "end"
    assert seen[0]["stream"] is True and seen[0]["response_format"] == "pcm"


def test_server_that_refuses_stream_is_asked_again_without_it():
    bodies = []

    def handler(request: httpx.Request):
        body = json.loads(request.content)
        bodies.append(body)
        if body.get("stream"):
            return httpx.Response(400, json={"detail": "stream is not supported for this model"})
        return pcm_response()

    engine = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    assert len(engine.generate("Hi.")) == len(PCM)
    assert len(engine.generate("Again.")) == len(PCM)
    assert [("stream" in b) for b in bodies] == [True, False, False]


def test_errors_say_what_the_server_answered():
    def handler(request: httpx.Request):
        return httpx.Response(404, json={"error": {"message": "No voice 'x'.", "type": "not_found_error"}})

    engine = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    with pytest.raises(RemoteError, match="404.*No voice 'x'") as err:
        engine.generate("Hi.", voice="x")
    assert err.value.status == 404

    def down(request):
        raise httpx.ConnectError("connection refused")

    with pytest.raises(RemoteError, match="Could not reach") as err:
        RemoteEngine("http://s", transport=httpx.MockTransport(down)).list_voices()
    assert err.value.status is None
    assert RemoteEngine("http://s", transport=httpx.MockTransport(down)).info["backend"] == "remote"


def test_cancel_stops_the_stream():
    cancel = threading.Event()

    def handler(request):
        return pcm_response()

    engine = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    stream = engine.generate_stream("Hi.", cancel=cancel)
    first = next(stream)
    cancel.set()
    rest = list(stream)
    assert not first.final and rest[-1].final and rest[-1].metrics.stop_reason == "cancelled"
    assert sum(len(c.audio) for c in [first, *rest]) < len(PCM)


def test_add_voice_sends_the_fields_servers_read():
    captured = {}

    def handler(request: httpx.Request):
        captured["ctype"] = request.headers["content-type"]
        captured["body"] = request.read()
        return httpx.Response(201, json={"id": "v_1", "name": "Ann"})

    engine = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    out = engine.add_voice((16000, np.zeros(16000, np.int16)), name="Ann", consent="true", ref_text="Hello.")
    assert out == {"id": "v_1", "name": "Ann"}
    body = captured["body"]
    assert captured["ctype"].startswith("multipart/form-data")
    for field in (b'name="audio_sample"', b'name="name"', b'name="consent"', b'name="ref_text"', b"Hello."):
        assert field in body


# ------------------------------------------------------------------------------------------ against a studio

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_studio(tmp_path_factory.mktemp("remote-server"), "--api-key", KEY) as url:
        yield url


@pytest.fixture(scope="module")
def local():
    from engine.generate import Engine
    from engine.demo import demo_checkpoint

    return Engine.load(demo_checkpoint())


def pcm(audio: np.ndarray) -> np.ndarray:
    return to_pcm16(audio)


def assert_same_audio(got: np.ndarray, want: np.ndarray) -> None:
    """Same length and the same samples up to float rounding: the codec's convolutions may block their
    sums differently in another process (thread count), which moves a sample by ~1e-5 and can flip one
    int16 rounding. Different codes would differ by far more; the codes themselves are compared by hash."""
    assert len(got) == len(want) and len(got) % SAMPLES_PER_FRAME == 0 and len(got) > 0
    assert_same_pcm(pcm(got).tobytes(), want)


def assert_same_pcm(body: bytes, want: np.ndarray) -> None:
    """`assert_same_audio` for a PCM16 body: the int16 samples within 2 LSB of the in-process take's."""
    got = np.frombuffer(body, dtype="<i2").astype(np.int32)
    assert len(got) == len(want) and len(got) > 0
    assert np.abs(got - pcm(want).astype(np.int32)).max() <= 2


def remote_codes_sha256(url: str, body: dict) -> str:
    """A buffered (non-streamed) request carries the take's codes fingerprint in X-Codes-SHA256."""
    response = httpx.post(f"{url}/v1/audio/speech", json={"model": "higgs", "response_format": "pcm", "stream": False,
                                                          **body}, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=120)
    assert response.status_code == 200, response.text
    return response.headers["X-Codes-SHA256"]


@pytest.mark.slow
def test_greedy_take_over_http_equals_the_in_process_take(server, local):
    remote = RemoteEngine(f"{server}/v1", api_key=KEY)
    text, style = "Remote and local must agree.", "<|emotion:contemplation|>"
    options = dict(temperature=0, seed=1234, max_frames=40)
    chunks = list(remote.generate_stream(text, style=style, **options))
    got = np.concatenate([c.audio for c in chunks])
    want = local.generate(style + text, **options)
    assert_same_audio(got, want)
    local_codes = local.predict(style + text, **options)
    assert remote_codes_sha256(server, {"input": text, "instructions": style, **options}) == codes_sha256(local_codes)
    assert chunks[-1].final and chunks[-1].metrics.seed == 1234 and chunks[-1].metrics.ttfa_ms > 0
    assert remote.last_headers["x-sample-rate"] == str(SAMPLE_RATE)
    assert remote.info["precision"] == local.info["precision"]

    # Sampled (not greedy) takes are reproducible across the wire too: the seed fixes the draws.
    sampled = dict(temperature=0.9, top_k=40, top_p=0.9, seed=99, max_frames=25)
    assert_same_audio(remote.generate(text, **sampled), local.generate(text, **sampled))
    assert remote_codes_sha256(server, {"input": text, **sampled}) == codes_sha256(local.predict(text, **sampled))


@pytest.mark.slow
def test_one_off_clone_over_http_equals_the_in_process_clone(server, local):
    rate = 16000
    t = np.arange(int(2.5 * rate)) / rate
    clip = (0.4 * np.sin(2 * np.pi * 160 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    remote = RemoteEngine(server, api_key=KEY)
    options = dict(temperature=0, seed=5, max_frames=20)
    got = remote.generate("Cloned hello.", voice=remote.encode_voice(clip, rate, transcript="a hum"), **options)
    want = local.generate("Cloned hello.", voice=local.encode_voice(clip, rate, transcript="a hum"), **options)
    assert_same_audio(got, want)
    assert not np.array_equal(pcm(got), pcm(local.generate("Cloned hello.", **options)))  # the clip was used


@pytest.mark.slow
def test_voice_routes_through_the_client(server):
    remote = RemoteEngine(server, api_key=KEY)
    rate = 16000
    clip = (0.3 * np.sin(2 * np.pi * 190 * np.arange(2 * rate) / rate)).astype(np.float32)
    added = remote.add_voice((rate, clip), name="Via Remote", consent="The speaker agreed.", ref_text="A hum.")
    listed = remote.list_voices()
    assert listed[0].id == "default" and listed[0].kind == "builtin"
    mine = next(v for v in listed if v.id == added["id"])
    assert mine.name == "Via Remote" and mine.ref_text == "A hum." and mine.kind == "saved"
    by_name = remote.generate("Saved voice.", voice="Via Remote", temperature=0, seed=3, max_frames=10)
    assert len(by_name) % SAMPLES_PER_FRAME == 0 and len(by_name) > 0
    assert remote.delete_voice(added["id"])["deleted"] is True
    assert added["id"] not in [v.id for v in remote.list_voices()]
    with pytest.raises(RemoteError) as err:
        RemoteEngine(server, api_key="wrong").list_voices()
    assert err.value.status == 401


@pytest.mark.slow
def test_a_studio_driving_another_studio_gives_the_in_process_take(server, local, tmp_path, monkeypatch):
    """`app.py --remote B`: studio A has no model, its API and its saved voices run on B."""
    from studio.voices import VoiceLibrary

    monkeypatch.setenv("HIGGS_REMOTE_API_KEY", KEY)
    with running_studio(tmp_path, "--remote", server) as front:
        health = httpx.get(f"{front}/health").json()
        assert health["backend"] == "remote" and health["device"] == server
        greedy = {"temperature": 0, "seed": 21, "max_frames": 30}
        r = httpx.post(f"{front}/v1/audio/speech", timeout=120,
                       json={"input": "Through two studios.", "response_format": "pcm", **greedy})
        assert r.status_code == 200, r.text
        # The same codes (B's fingerprint of this take against the in-process one), hence the same samples up
        # to the codec's float rounding, which depends on the CPU's convolution kernels and thread count.
        want = local.generate("Through two studios.", **greedy)
        assert_same_pcm(r.content, want)
        assert remote_codes_sha256(server, {"input": "Through two studios.", **greedy}) == codes_sha256(
            local.predict("Through two studios.", **greedy))

        # A voice saved on A travels to B as its prepared clip + transcript on every request.
        rate = 16000
        clip = (0.4 * np.sin(2 * np.pi * 140 * np.arange(2 * rate) / rate)).astype(np.float32)
        buf = io.BytesIO()
        sf.write(buf, clip, rate, format="WAV", subtype="FLOAT")
        saved = httpx.post(f"{front}/v1/audio/voices", timeout=120, files={"audio_sample": ("c.wav", buf.getvalue())},
                           data={"name": "Front Voice", "ref_text": "A low hum.", "consent": "true"})
        assert saved.status_code == 201, saved.text
        r = httpx.post(f"{front}/v1/audio/speech", timeout=120,
                       json={"input": "Cloned through two studios.", "voice": "Front Voice",
                             "response_format": "pcm", **greedy})
        assert r.status_code == 200, r.text
        stored = VoiceLibrary(tmp_path / "voices").get(saved.json()["id"])
        want = local.generate("Cloned through two studios.", **greedy,
                              voice=local.encode_voice(stored.wav(), SAMPLE_RATE, transcript="A low hum."))
        assert_same_pcm(r.content, want)


def test_engine_remote_builds_the_remote_client():
    from engine import Engine

    remote = Engine.remote("http://127.0.0.1:9/v1", api_key="k")
    assert isinstance(remote, RemoteEngine) and remote.is_remote
    with pytest.raises(ValueError):
        Engine.remote("ftp://example")
