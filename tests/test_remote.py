"""`engine.remote.RemoteEngine`: request mapping, server detection and stream reading against scripted
servers (`httpx.MockTransport`) and the fakes of tests/remote_fakes.py, then parity against a real studio in
a subprocess: a greedy take with a fixed seed fetched over HTTP has the in-process take's codes (compared by
fingerprint) and its samples up to the codec's float rounding (another process may block its convolutions
differently on another CPU). tests/test_remote_servers.py drives `app.py --remote` against the fakes."""

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
from engine.dialects import OPENAI, SGLANG_OMNI, STUDIO, VLLM_OMNI, detect_dialect, server_voice_name
from engine.delay import codes_sha256
from engine.peaks import PeakLimiter
from engine.remote import RemoteEngine
from engine.types import SamplingParams, SpeechEngine
from engine.wire import RemoteError, RemoteVoice, parse_voices
from studio.audio.formats import to_pcm16
from tests.remote_fakes import MODEL, SglangOmniFake, VllmOmniFake, pcm_of, serve, wav_clip
from tests.studio_server import KEY, running_studio


# What each kind answers at /health and /v1/models (tests/remote_fakes.py names the sources).
STUDIO_FACTS = {"/health": {"status": "ok", "engine_loaded": True, "formats": ["wav", "pcm"], "max_batch": 6,
                            "precision": "bf16"},
                "/v1/models": {"object": "list", "data": [{"id": "higgs-audio-v3-tts", "owned_by": "bosonai"}]}}
VLLM_FACTS = {"/health": None, "/v1/models": {"object": "list", "data": [{"id": MODEL, "owned_by": "vllm"}]}}
SGLANG_FACTS = {"/health": {"status": "healthy", "running": True},
                "/v1/models": {"object": "list", "data": [{"id": MODEL, "owned_by": "sglang-omni"}]}}


def scripted(speech, facts=STUDIO_FACTS, **kwargs) -> RemoteEngine:
    """A RemoteEngine whose server answers `facts` on its GET routes and `speech(request)` on the rest."""
    def handler(request: httpx.Request):
        if request.method == "GET" and request.url.path in facts:
            answer = facts[request.url.path]
            return httpx.Response(200, json=answer) if answer is not None else httpx.Response(200)
        return speech(request)

    return RemoteEngine("http://s", transport=httpx.MockTransport(handler), **kwargs)


# ------------------------------------------------------------------------------------------ facts

def test_reads_all_four_voice_list_shapes():
    ours = {"voices": [{"id": "default", "name": "Default (zero-shot)"}, {"id": "v_ab", "name": "Ann", "ref_text": "Hi."}]}
    assert [(v.id, v.name, v.kind, v.ref_text) for v in parse_voices(ours)] == [
        ("default", "Default (zero-shot)", "builtin", None), ("v_ab", "Ann", "saved", "Hi.")]
    openai_like = {"object": "list", "data": [{"id": "voice_1", "name": "Bo"}, {"voice": "voice_2",
                                                                                 "description": "Boson item"}]}
    assert [(v.id, v.name) for v in parse_voices(openai_like)] == [("voice_1", "Bo"), ("voice_2", "voice_2")]
    sglang = {"voices": ["Alice", "default"], "uploaded_voices": [{"name": "Alice", "consent": "yes",
                                                                   "ref_text": "Hello."}], "cache_stats": {}}
    assert [(v.id, v.kind, v.ref_text) for v in parse_voices(sglang)] == [("default", "builtin", None),
                                                                         ("Alice", "saved", "Hello.")]
    # vLLM-Omni lists the lowercased key beside the record's own spelling: one voice, the record's name.
    vllm = {"voices": ["alice"], "uploaded_voices": [{"name": "Alice", "consent": "yes", "created_at": 1}]}
    assert [(v.id, v.kind) for v in parse_voices(vllm)] == [("Alice", "saved")]
    chatterbox = {"status": "ok", "voices": ["narrator.wav", "Emily.mp3"]}
    assert [(v.id, v.name, v.kind) for v in parse_voices(chatterbox)] == [("narrator.wav", "narrator", "builtin"),
                                                                         ("Emily.mp3", "Emily", "builtin")]
    with pytest.raises(RemoteError, match="voice list"):
        parse_voices("nope")


def test_detects_each_server_kind():
    assert detect_dialect(STUDIO_FACTS["/health"], STUDIO_FACTS["/v1/models"], None) is STUDIO
    assert detect_dialect(None, VLLM_FACTS["/v1/models"], None) is VLLM_OMNI
    assert detect_dialect(SGLANG_FACTS["/health"], SGLANG_FACTS["/v1/models"], None) is SGLANG_OMNI
    # Without owners to go by, the voices listing tells the Omni servers apart; anything else is generic.
    assert detect_dialect(None, None, {"voices": ["default"], "uploaded_voices": []}) is SGLANG_OMNI
    assert detect_dialect(None, None, {"voices": [], "uploaded_voices": []}) is VLLM_OMNI
    assert detect_dialect(None, {"data": [{"id": "tts-1", "owned_by": "openai"}]}, {"data": []}) is OPENAI


def test_info_reports_kind_model_and_how_many_takes_go_at_once():
    ours = scripted(lambda r: httpx.Response(404), STUDIO_FACTS)
    assert ours.info.remote_kind == "Higgs Studio" and ours.info.max_batch == 6  # what the studio reports
    assert ours.model == "higgs-audio-v3-tts" and ours.info.sampling_note is None
    vllm = scripted(lambda r: httpx.Response(404), VLLM_FACTS)
    assert vllm.info.remote_kind == "vLLM-Omni" and vllm.info.max_batch == 16 and vllm.model == MODEL
    assert "ignores temperature, top-k and top-p" in vllm.info.sampling_note
    common = {"checkpoint", "device", "precision", "backend", "demo", "max_batch", "remote", "remote_kind",
              "server_device", "server_backend"}
    assert set(ours.info.as_dict()) == common and set(vllm.info.as_dict()) == common | {"sampling_note"}
    assert isinstance(ours, SpeechEngine) and ours.is_remote
    assert scripted(lambda r: httpx.Response(404), SGLANG_FACTS, concurrency=3).info.max_batch == 3
    assert scripted(lambda r: httpx.Response(404), VLLM_FACTS, model="mine").model == "mine"
    with pytest.raises(ValueError, match="concurrency"):
        RemoteEngine("http://s", concurrency=0)


# ------------------------------------------------------------------------------------------ request body

def test_speech_body_speaks_each_servers_dialect():
    clip = RemoteVoice(wav_bytes=b"RIFF1234", transcript="Hi there.")
    ref = "data:audio/wav;base64," + base64.b64encode(b"RIFF1234").decode()
    options = dict(temperature=0, top_k=20, top_p=0.9, seed=5, max_frames=40)

    ours = scripted(lambda r: httpx.Response(404), STUDIO_FACTS, model="higgs-tts-3")
    assert ours.speech_body("Hello.", style="<|emotion:awe|>", voice="alice", **options) == {
        "model": "higgs-tts-3", "input": "<|emotion:awe|>Hello.", "response_format": "pcm", "stream": True,
        "voice": "alice", "temperature": 0, "top_k": 20, "top_p": 0.9, "seed": 5, "max_frames": 40}
    assert ours.speech_body("Hello.", repeat_guard=None)["repeat_guard"] is None

    vllm = scripted(lambda r: httpx.Response(404), VLLM_FACTS)
    # No `voice` for zero-shot (a non-uploaded one is a 400), raw PCM asked for by name, sampling left to
    # the deploy config (not in its schema), the delay tail added to the frame budget.
    assert vllm.speech_body("Hello.", **options) == {
        "model": MODEL, "input": "Hello.", "response_format": "pcm", "stream": True, "stream_format": "audio",
        "seed": 5, "max_new_tokens": 47}
    body = vllm.speech_body("Hello.", voice=clip)
    assert body["ref_audio"] == ref and body["ref_text"] == "Hi there." and "voice" not in body

    sglang = scripted(lambda r: httpx.Response(404), SGLANG_FACTS)
    assert sglang.speech_body("Hello.", **options) == {
        "model": MODEL, "input": "Hello.", "response_format": "pcm", "stream": True, "stream_format": "audio",
        "voice": "default",
        "temperature": 0, "top_k": 20, "top_p": 0.9, "seed": 5, "max_new_tokens": 47}
    body = sglang.speech_body("Hello.", voice=clip, repeat_guard=None)
    assert body["voice"] == "default" and body["ref_audio"] == ref and "repeat_guard" not in body
    assert sglang.speech_body("Hello.", voice="Ann")["voice"] == "Ann"
    for engine in (ours, vllm, sglang):
        assert "instructions" not in engine.speech_body("Hello.", style="<|emotion:awe|>")  # ignored by Higgs paths
    with pytest.raises(ValueError, match="no text"):
        ours.speech_body("  ")
    with pytest.raises(ValueError, match="http"):
        RemoteEngine("server:8000")


def test_keywords_win_over_params_and_only_given_settings_travel():
    """As for the local engine (`SamplingParams.of`): a keyword replaces that field of `params`; without
    `params` only the keywords given are sent, and an invalid one is refused before anything is sent."""
    seen = []

    def handler(request):
        if request.url.path != "/v1/audio/speech":
            return httpx.Response(404)
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=b"\0\0" * 960, headers={"content-type": "audio/pcm"})

    remote = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    list(remote.generate_stream("Hi.", params=SamplingParams(temperature=0.3, seed=9), temperature=0.5, top_k=None))
    assert (seen[0]["temperature"], seen[0]["top_k"], seen[0]["seed"]) == (0.5, 30, 9)
    list(remote.generate_stream("Hi.", seed=4))
    assert seen[1]["seed"] == 4 and not {"temperature", "top_k", "top_p"} & set(seen[1])
    with pytest.raises(ValueError, match="temperature"):
        remote.generate_stream("Hi.", temperature=-1)
    assert len(seen) == 2


def test_voice_names_are_mapped_or_refused_before_upload():
    assert server_voice_name(SGLANG_OMNI, " Ann Lee ") == "Ann_Lee"
    for bad, why in (("Zoë", "letters, digits"), ("default", "reserves"), ("Default", "reserves"), ("...", "letters")):
        with pytest.raises(ValueError, match=why):
            server_voice_name(SGLANG_OMNI, bad)
    assert server_voice_name(VLLM_OMNI, "Ann Lee") == "Ann Lee" and server_voice_name(STUDIO, "Zoë") == "Zoë"
    with pytest.raises(ValueError, match="'/'"):
        server_voice_name(VLLM_OMNI, "a/b")

    posts = []
    engine = scripted(lambda r: posts.append(r) or httpx.Response(500), SGLANG_FACTS)
    with pytest.raises(ValueError, match="Rename the voice"):
        engine.add_voice(wav_clip(2), name="Zoë", consent="yes")
    assert posts == []  # refused here, not by the server


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

    def speech(request: httpx.Request):
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == "Bearer k"
        return pcm_response(**{"x-seed": "77"})

    engine = scripted(speech, api_key="k")
    chunks = list(engine.generate_stream("Hi.", seed=None))
    audio = np.concatenate([c.audio for c in chunks])
    assert np.array_equal(to_pcm16(audio), PCM)  # /32767 on the way in undoes to_pcm16's ×32767 exactly
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True] and len(chunks) > 2
    last = chunks[-1].metrics
    assert last.frames == 5 and last.seed == 77 and last.backend == "remote" and last.precision == "bf16"
    assert last.ttfa_ms is not None and last.ttfa_ms >= 0 and last.rtf > 0 and last.stop_reason == "end"
    assert seen[0]["stream"] is True and seen[0]["response_format"] == "pcm"


@pytest.mark.parametrize("fake", [VllmOmniFake(stream_mode="sse"), SglangOmniFake(stream_mode="older")],
                         ids=["vllm-omni-sse", "sglang-omni-older-sse"])
def test_sse_answer_to_a_raw_audio_request_is_decoded_not_played_as_noise(fake):
    with serve(fake):
        engine = RemoteEngine(fake.url)
        audio = engine.generate("Hi.", seed=9, max_frames=10)
        sent = pcm_of(fake.takes[-1])
        assert len(sent) == 10 * SAMPLES_PER_FRAME and np.array_equal(to_pcm16(audio), sent)
        assert fake.takes[-1].body["stream_format"] == "audio"  # raw was asked for; SSE came back


def test_sse_of_wav_chunks_is_read_as_their_pcm():
    """SGLang-Omni's answer to `stream: true` without `stream_format`: each SSE chunk a base64 WAV file."""
    pieces = []
    for part in (PCM[:1000], PCM[1000:]):
        buf = io.BytesIO()
        sf.write(buf, part, SAMPLE_RATE, format="WAV", subtype="PCM_16")
        chunk = {"object": "audio.speech.chunk", "audio": {"data": base64.b64encode(buf.getvalue()).decode(),
                                                           "format": "wav", "sample_rate": SAMPLE_RATE}}
        pieces.append(f"data: {json.dumps(chunk)}\n\n")
    done = 'data: {"object": "audio.speech.chunk", "audio": null, "finish_reason": "stop"}\n\ndata: [DONE]\n\n'
    chunks = list(scripted(lambda r: sse(*pieces, done), SGLANG_FACTS).generate_stream("Hi."))
    assert np.array_equal(to_pcm16(np.concatenate([c.audio for c in chunks])), PCM)
    assert chunks[-1].metrics.stop_reason == "stop"


def sse(*events: str) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content="".join(events).encode())


def test_sse_errors_and_unreadable_events_fail_with_a_sentence():
    delta = ('event: speech.audio.delta\n'
             'data: {"type": "speech.audio.delta", "response_format": "pcm", "audio": "%s"}\n\n')
    error = 'event: speech.audio.error\ndata: {"type": "speech.audio.error", "error": {"message": "engine died"}}\n\n'
    piece = base64.b64encode(PCM[:SAMPLES_PER_FRAME].tobytes()).decode()
    engine = scripted(lambda r: sse(delta % piece, error), VLLM_FACTS)
    with pytest.raises(RemoteError, match="vLLM-Omni server at http://s stopped the take: engine died") as err:
        engine.generate("Hi.")
    assert err.value.client_status == 502
    mp3 = 'data: {"type": "speech.audio.delta", "response_format": "mp3", "audio": "%s"}\n\n' % piece
    with pytest.raises(RemoteError, match="cannot read as 16-bit PCM"):
        scripted(lambda r: sse(mp3), VLLM_FACTS).generate("Hi.")
    with pytest.raises(RemoteError, match="cannot read as 16-bit PCM"):
        scripted(lambda r: sse('data: {"type": "speech.audio.delta", "audio": "not base64!"}\n\n'),
                 VLLM_FACTS).generate("Hi.")


@pytest.mark.parametrize("header", [{"x-channels": "2"}, {"x-bit-depth": "8"}, {"x-sample-rate": "16000"},
                                    {"content-type": "audio/wav"}])
def test_audio_this_studio_would_play_as_noise_is_refused(header):
    engine = scripted(lambda r: pcm_response(**header), SGLANG_FACTS)
    with pytest.raises(RemoteError, match="SGLang-Omni server at http://s answered .*24 kHz mono 16-bit"):
        engine.generate("Hi.")


def test_errors_name_the_server_and_say_what_it_answered():
    def speech(request: httpx.Request):
        return httpx.Response(400, json={"error": {"message": "voice is required", "type": "invalid_request_error"}})

    engine = scripted(speech, SGLANG_FACTS)
    with pytest.raises(RemoteError, match=r"SGLang-Omni server at http://s refused the take \(400\): voice is "
                                          r"required") as err:
        engine.generate("Hi.", voice="x")
    assert err.value.status == 400 and err.value.client_status == 400
    assert RemoteError("m", 401).client_status == 502 and RemoteError("m", 503).client_status == 503
    assert RemoteError("m", None).client_status == 502

    def down(request):
        raise httpx.ConnectError("connection refused")

    unreachable = RemoteEngine("http://user:pw@gpu-box:8000/v1", transport=httpx.MockTransport(down))
    with pytest.raises(RemoteError, match=r"^Could not reach the speech server at http://gpu-box:8000: ") as err:
        unreachable.generate("Hi.")
    assert err.value.status is None and "pw" not in str(err.value)
    assert unreachable.info.backend == "remote" and unreachable.info.remote_kind == "unreachable"


def test_a_server_that_is_down_is_not_asked_again_on_every_look(monkeypatch):
    import engine.remote

    asked = []

    def down(request):
        asked.append(request.url.path)
        raise httpx.ConnectError("connection refused")

    engine_ = RemoteEngine("http://s", transport=httpx.MockTransport(down))
    for _ in range(3):
        assert engine_.info.remote_kind == "unreachable"
    assert asked == ["/health", "/v1/models"]
    monkeypatch.setattr(engine.remote, "RECONTACT_S", 0.0)
    engine_.info
    assert asked[2:4] == ["/health", "/v1/models"]  # asked again once the interval has passed


def test_cancel_stops_the_stream():
    cancel = threading.Event()
    engine = scripted(lambda r: pcm_response())
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

    engine = scripted(handler)
    out = engine.add_voice((16000, np.zeros(16000, np.int16)), name="Ann", consent="true", ref_text="Hello.")
    assert out == {"id": "v_1", "name": "Ann"}
    body = captured["body"]
    assert captured["ctype"].startswith("multipart/form-data")
    for field in (b'name="audio_sample"', b'name="name"', b'name="consent"', b'name="ref_text"', b"Hello."):
        assert field in body


@pytest.mark.parametrize("make", [VllmOmniFake, SglangOmniFake], ids=["vllm-omni", "sglang-omni"])
def test_voice_routes_of_the_omni_servers_are_keyed_by_name(make):
    with serve(make()) as fake:
        engine = RemoteEngine(fake.url)
        added = engine.add_voice(wav_clip(2), name="Ann", consent="The speaker agreed.", ref_text="A hum.")
        assert added["id"] == "Ann" and added["ref_text"] == "A hum."
        listed = {v.id: v for v in engine.list_voices()}
        assert listed["Ann"].kind == "saved" and listed["Ann"].ref_text == "A hum."
        assert ("default" in listed) == (make is SglangOmniFake)
        take = engine.generate("Saved voice.", voice="ann", max_frames=4)  # names are case-insensitive there
        assert len(take) == 4 * SAMPLES_PER_FRAME
        assert engine.delete_voice("Ann")["success"] is True
        assert "Ann" not in {v.id for v in engine.list_voices()}
        with pytest.raises(RemoteError, match="404.*not found") as err:
            engine.delete_voice("Ann")
        assert err.value.client_status == 400


# ------------------------------------------------------------------------------------------ against a studio

@pytest.fixture(scope="module")
def server(keyed_studio):
    return keyed_studio.url


@pytest.fixture(scope="module")
def local(shared_engine):
    return shared_engine(device="auto")  # where the studio runs its own


def pcm(audio: np.ndarray) -> np.ndarray:
    return to_pcm16(audio)


def served(audio: np.ndarray) -> np.ndarray:
    """An in-process take as a studio serves it: held under the −1 dBTP true-peak ceiling (engine/peaks.py)."""
    return PeakLimiter().whole(audio).astype(np.float32)


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
    want = served(local.generate(style + text, **options))
    assert_same_audio(got, want)
    local_codes = local.predict(style + text, **options)
    assert remote_codes_sha256(server, {"input": text, "instructions": style, **options}) == codes_sha256(local_codes)
    assert chunks[-1].final and chunks[-1].metrics.seed == 1234 and chunks[-1].metrics.ttfa_ms > 0
    assert remote.info.precision == local.info.precision

    # Sampled (not greedy) takes are reproducible across the wire too: the seed fixes the draws.
    sampled = dict(temperature=0.9, top_k=40, top_p=0.9, seed=99, max_frames=25)
    assert_same_audio(remote.generate(text, **sampled), served(local.generate(text, **sampled)))
    assert remote_codes_sha256(server, {"input": text, **sampled}) == codes_sha256(local.predict(text, **sampled))


@pytest.mark.slow
def test_one_off_clone_over_http_equals_the_in_process_clone(server, local):
    rate = 16000
    t = np.arange(int(2.5 * rate)) / rate
    clip = (0.4 * np.sin(2 * np.pi * 160 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    remote = RemoteEngine(server, api_key=KEY)
    options = dict(temperature=0, seed=5, max_frames=20)
    got = remote.generate("Cloned hello.", voice=remote.encode_voice(clip, rate, transcript="a hum"), **options)
    want = served(local.generate("Cloned hello.", voice=local.encode_voice(clip, rate, transcript="a hum"), **options))
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
        want = served(local.generate("Through two studios.", **greedy))
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
        want = served(local.generate("Cloned through two studios.", **greedy,
                                     voice=local.encode_voice(stored.wav(), SAMPLE_RATE, transcript="A low hum.")))
        assert_same_pcm(r.content, want)


def test_engine_remote_builds_the_remote_client():
    from engine import Engine

    remote = Engine.remote("http://127.0.0.1:9/v1", api_key="k")
    assert isinstance(remote, RemoteEngine) and remote.is_remote and remote.info.remote is not None
    # no model given: the server is asked (nothing answers at port 9, so the default name stands in)
    assert remote.model == "bosonai/higgs-audio-v3-tts-4b"
    assert Engine.remote("http://127.0.0.1:9", model="higgs-tts-3").model == "higgs-tts-3"
    with pytest.raises(ValueError):
        Engine.remote("ftp://example")
