"""Stand-ins for the speech servers `--remote` drives, behaving as their code does, served for real on
127.0.0.1 (uvicorn in a thread) so a studio subprocess can drive them.

    with serve(VllmOmniFake()) as fake:          # or SglangOmniFake(); fake.url, fake.takes, fake.peak
        ...

Every behaviour is written from the servers' own files, named beside it (the commit where the search index
recorded one); nothing is copied. What they share and what the fakes keep:
* a take's audio is a tone whose pitch follows the seed (a clone's follows the clip's length), so a test can
  tell takes apart; `takes` keeps each request body and the exact PCM bytes sent, and `peak` the most
  speech requests in flight at once; with `gate=N` each speech request waits until N are in flight;
* both servers count `max_new_tokens` in model steps, the frames plus the 7-step delay tail, and stop
  there (FACTS-2026-12 "serving engines"; vLLM-Omni `tts_adapters/higgs_audio_v3.py` @cf737475
  `apply_sampling_overrides` → `apply_max_new_tokens`), so a take of N frames needs N + 7;
* voices are keyed by lowercased name, uploads are multipart `audio_sample` + `name` + `consent` (+
  `ref_text`), clips of 1-30 s.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import soundfile as sf
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

SAMPLE_RATE = 24_000
FRAME = 960
DELAY_TAIL = 7
DEFAULT_FRAMES = 12  # a take's length when the request sets no max_new_tokens
MODEL = "bosonai/higgs-audio-v3-tts-4b"  # vLLM-Omni deploy/higgs_multimodal_qwen3*.yaml serve this name


@dataclass
class Take:
    body: dict
    pcm: bytes = b""


@dataclass
class _State:
    takes: list[Take] = field(default_factory=list)
    voices: dict[str, dict] = field(default_factory=dict)  # lowercased name → record (with the clip's samples)
    in_flight: int = 0
    peak: int = 0


class _Fake:
    """The shared machinery: the tone, the gate, the clip decoding, the in-flight count."""

    name = "fake"

    def __init__(self, *, gate: int | None = None):
        self.gate = gate
        self.state = _State()
        self._cond: asyncio.Condition | None = None
        self.url = ""

    @property
    def takes(self) -> list[Take]:
        return self.state.takes

    @property
    def peak(self) -> int:
        return self.state.peak

    def app(self) -> Starlette:
        """Both servers' routes for speech and voices (each fake answers them its own way)."""
        return Starlette(routes=[
            Route("/health", self.health),
            Route("/v1/models", self.models),
            Route("/v1/audio/speech", self.speech, methods=["POST"]),
            Route("/v1/audio/voices", self.list_voices),
            Route("/v1/audio/voices", self.upload, methods=["POST"]),
            Route("/v1/audio/voices/{name}", self.delete, methods=["DELETE"]),
        ])

    # ------------------------------------------------------------ the audio
    @staticmethod
    def tone(frames: int, seed: int | None, clip_seconds: float | None) -> bytes:
        pitch = 110 + (seed or 0) % 200 + (0 if clip_seconds is None else 400 + 50 * clip_seconds)
        t = np.arange(frames * FRAME) / SAMPLE_RATE
        return (12000 * np.sin(2 * np.pi * pitch * t)).astype("<i2").tobytes()

    @staticmethod
    def frames(body: dict) -> int:
        steps = body.get("max_new_tokens")
        return DEFAULT_FRAMES if steps is None else max(0, int(steps) - DELAY_TAIL)

    @staticmethod
    def decode_clip(value: str) -> tuple[np.ndarray, int]:
        """A `data:audio/...;base64,` URL → samples (ValueError when it is not one)."""
        if not isinstance(value, str) or not value.startswith("data:") or "," not in value:
            raise ValueError("ref_audio must be a data URL")
        data = base64.b64decode(value.split(",", 1)[1], validate=True)
        samples, rate = sf.read(io.BytesIO(data), dtype="float32")
        return samples, rate

    # ------------------------------------------------------------ in flight
    async def enter(self) -> None:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            self.state.in_flight += 1
            self.state.peak = max(self.state.peak, self.state.in_flight)
            self._cond.notify_all()
            if self.gate:
                # Bounded so a client that never sends `gate` requests at once fails its test, not the run.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait_for(lambda: self.state.in_flight >= self.gate), 60)

    async def leave(self) -> None:
        async with self._cond:
            self.state.in_flight -= 1
            self._cond.notify_all()

    async def pcm_body(self, take: Take, pcm: bytes, piece: int = 1931):
        """Raw PCM in odd-sized pieces (samples straddle reads), recorded as sent."""
        try:
            for i in range(0, len(pcm), piece):
                take.pcm += pcm[i:i + piece]
                yield pcm[i:i + piece]
                await asyncio.sleep(0)
        finally:
            await self.leave()


def _openai_error(status: int, message: str, *, param: str | None = None,
                  kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


async def _json_body(request: Request) -> dict | None:
    try:
        payload = json.loads(await request.body())
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


class VllmOmniFake(_Fake):
    """vLLM-Omni serving Higgs Audio v3.

    * `GET /health`: 200 with an empty body (vLLM's health route); `GET /v1/models`: the served name with
      `owned_by: "vllm"` (vLLM's ModelCard default);
    * `POST /v1/audio/speech` (`protocol/audio.py` @0131cb55 `OpenAICreateSpeechRequest`): unknown fields
      such as temperature / top_k / top_p are dropped without a word (kept here in `dropped`); `model` must
      be the served name (404 "The model ... does not exist."); `is_raw_audio_stream` is
      `stream_format == "audio"`, `is_sse_stream` is (`stream` or `stream_format == "sse"`) and not raw, and
      both need response_format pcm or wav; SSE events are `event: speech.audio.delta` with
      `{"type", "response_format", "audio": base64}` then `event: speech.audio.done` (the stored
      `tests/entrypoints/openai_api/test_serving_speech.py` `_assert_sse_audio_response`);
    * a `voice` that is no upload is a 400: Higgs v3 has no built-in speakers (`serving_speech.py`
      `_apply_uploaded_speaker`, stored version with the Higgs v3 entries); an uploaded one lends its clip;
    * voices (`api_server.py` `list_voices` / `upload_voice` / `delete_voice`, stored version): the listing
      is `{"voices": sorted lowercased names, "uploaded_voices": [records]}`; an upload answers
      `{"success": true, "voice": {name, consent, created_at, mime_type, file_size, ref_text?}}`; a name with
      '/', '\\' or NUL is a 400 (`_validate_speaker_name`); delete answers `{"success": true, "message"}`
      or 404 with an error body.

    `stream_mode="sse"`: a server that answers SSE even to `stream_format: "audio"` (a client must read it
    as SSE or refuse it, never play it as PCM).
    """

    name = "vLLM-Omni"

    def __init__(self, *, gate: int | None = None, stream_mode: str = "current"):
        super().__init__(gate=gate)
        self.stream_mode = stream_mode
        self.dropped: list[set[str]] = []

    async def health(self, request: Request) -> Response:
        return Response(b"", 200)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm",
                                                         "root": MODEL}]})

    SCHEMA = {"input", "model", "voice", "instructions", "response_format", "sample_rate", "speed", "stream_format",
              "stream", "task_type", "language", "ref_audio", "ref_text", "max_new_tokens", "seed"}

    async def speech(self, request: Request) -> Response:
        body = await _json_body(request)
        if body is None or not isinstance(body.get("input"), str):
            return _openai_error(400, "Field required: input", param="input")
        self.dropped.append(set(body) - self.SCHEMA)
        body = {k: v for k, v in body.items() if k in self.SCHEMA}
        if body.get("model") not in (None, MODEL):
            return _openai_error(404, f"The model `{body['model']}` does not exist.", kind="NotFoundError")
        raw = body.get("stream_format") == "audio"
        sse = (body.get("stream") or body.get("stream_format") == "sse") and not raw
        if (raw or sse) and body.get("response_format", "wav") not in ("pcm", "wav"):
            return _openai_error(400, "Streaming requires response_format='pcm' or 'wav'.")
        if body.get("max_new_tokens") is not None and int(body["max_new_tokens"]) < 1:
            return _openai_error(400, "max_new_tokens must be at least 1")
        clip = body.get("ref_audio")
        if body.get("voice") is not None and clip is None:
            voice = self.state.voices.get(body["voice"].lower())
            if voice is None:
                return _openai_error(400, f"Unknown voice '{body['voice']}'. Higgs-Audio V3 has no built-in "
                                          "speakers. Upload a voice first via POST /v1/audio/voices, or use "
                                          "ref_audio + ref_text.")
            clip_seconds = voice["seconds"]
        elif clip is not None:
            try:
                samples, rate = self.decode_clip(clip)
            except (ValueError, RuntimeError):
                return _openai_error(400, "Could not load ref_audio.", param="ref_audio")
            clip_seconds = round(len(samples) / rate, 1)
        else:
            clip_seconds = None
        take = Take(body)
        self.state.takes.append(take)
        pcm = self.tone(self.frames(body), body.get("seed"), clip_seconds)
        await self.enter()
        if sse or (raw and self.stream_mode == "sse"):
            return StreamingResponse(self.sse_body(take, pcm), media_type="text/event-stream")
        if raw:
            return StreamingResponse(self.pcm_body(take, pcm), media_type="audio/pcm")
        await self.leave()
        take.pcm = pcm
        buf = io.BytesIO()
        sf.write(buf, np.frombuffer(pcm, "<i2"), SAMPLE_RATE, format="WAV", subtype="PCM_16")
        return Response(buf.getvalue(), media_type="audio/wav")

    async def sse_body(self, take: Take, pcm: bytes, piece: int = 4800):
        try:
            for i in range(0, len(pcm), piece):
                take.pcm += pcm[i:i + piece]
                event = {"type": "speech.audio.delta", "response_format": "pcm",
                         "audio": base64.b64encode(pcm[i:i + piece]).decode()}
                yield f"event: speech.audio.delta\ndata: {json.dumps(event)}\n\n"
                await asyncio.sleep(0)
            yield f"event: speech.audio.done\ndata: {json.dumps({'type': 'speech.audio.done'})}\n\n"
        finally:
            await self.leave()

    async def list_voices(self, request: Request) -> JSONResponse:
        uploaded = [{k: v for k, v in rec.items() if k != "seconds"} for rec in self.state.voices.values()]
        return JSONResponse({"voices": sorted(self.state.voices), "uploaded_voices": uploaded})

    async def upload(self, request: Request) -> JSONResponse:
        form = await request.form()
        name, consent, clip = form.get("name"), form.get("consent"), form.get("audio_sample")
        if name is None or consent is None:
            return JSONResponse({"detail": [{"loc": ["body", "name" if name is None else "consent"],
                                             "msg": "Field required"}]}, 422)
        name = name.strip()
        if not name or name in (".", "..") or any(c in name for c in "/\\\x00"):
            return _openai_error(400, f"Invalid voice name {name!r}: must be non-empty, no path separators or NUL")
        if clip is None:
            return _openai_error(400, "Either 'audio_sample' or 'speaker_embedding' must be provided")
        data = await clip.read()
        try:
            samples, rate = sf.read(io.BytesIO(data))
        except RuntimeError as exc:
            return _openai_error(400, f"Could not decode audio file: {exc}")
        seconds = len(samples) / rate
        if not 1.0 <= seconds <= 30.0:
            return _openai_error(400, f"Reference audio must be 1-30 s (got {seconds:.1f}s).")
        record = {"name": name, "consent": consent, "created_at": int(time.time()), "mime_type": "audio/wav",
                  "file_size": len(data)}
        if form.get("ref_text"):
            record["ref_text"] = form["ref_text"].strip()
        self.state.voices[name.lower()] = {**record, "seconds": round(seconds, 1)}
        return JSONResponse({"success": True, "voice": record})

    async def delete(self, request: Request) -> JSONResponse:
        name = request.path_params["name"]
        if self.state.voices.pop(name.lower(), None) is None:
            return _openai_error(404, f"Voice '{name}' not found", kind="NotFoundError")
        return JSONResponse({"success": True, "message": f"Voice '{name}' deleted successfully"})


class SglangOmniFake(_Fake):
    """SGLang-Omni serving Higgs Audio v3.

    * `GET /health`: `{"status": "healthy", "running": true, ...}`; `GET /v1/models`: `owned_by:
      "sglang-omni"` (`serve/openai_api.py` `_register_health` / `_register_models`, `serve/protocol.py`
      `ModelCard` @2489a10e);
    * `POST /v1/audio/speech`: `model` and `voice` are required ("voice is required"), `"default"` is
      zero-shot, any other voice must be an upload ("Unknown voice ... Upload a voice first ..."); a clip
      in `ref_audio` wins over the voice; `stream: true` needs response_format pcm; integer fields must be
      integers and sampling fields numbers; temperature / top_k / top_p / seed are honoured
      (`serve/speech_service.py` @e1fefa76 `_validate_raw_payload`, `_resolve_uploaded_voice_reference`,
      `_build_sampling_params`; FACTS-2026-12 `_validate_required_generation_fields`);
    * `stream: true` answers SSE: `data: {"object": "audio.speech.chunk", "audio": {"data": base64 WAV,
      "format": "wav", ...}, "finish_reason": null}`, a last chunk with `"audio": null, "finish_reason":
      "stop"`, then `data: [DONE]`; `stream_format: "audio"` (pcm only) answers raw 16-bit PCM whose
      `X-Sample-Rate`, `X-Channels` and `X-Bit-Depth` headers say what it is (`docs/cookbook/higgs_tts.md`
      @f29c051b "Streaming"; FACTS-2026-12);
    * voices (`serve/speech_voices.py` @01782f8f): names match `^(?=.*[A-Za-z0-9])[A-Za-z0-9_.-]+$` and key
      lowercased, `default` is reserved; the listing is `list_response` (`voices`: "default" and every name,
      sorted case-insensitively; `uploaded_voices`: records; `cache_stats`); an upload answers the flat
      record `{name, consent, created_at, file_size, mime_type, ref_text?}`; delete answers `{success,
      message}` or 404 `{success: false, error}`.

    `stream_mode="older"`: the streaming before `stream_format` (`serve/openai_api.py` @2489a10e
    `_speech_stream`): SSE for every `stream: true`, PCM pieces in `audio.data`.
    """

    name = "SGLang-Omni"
    NAME = re.compile(r"^(?=.*[A-Za-z0-9])[A-Za-z0-9_.-]+$")

    def __init__(self, *, gate: int | None = None, stream_mode: str = "current"):
        super().__init__(gate=gate)
        self.stream_mode = stream_mode

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy", "running": True, "stages": ["ready"]})

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                         "owned_by": "sglang-omni", "root": MODEL}]})

    async def speech(self, request: Request) -> Response:
        body = await _json_body(request)
        if body is None:
            return _openai_error(400, "speech request body must be a JSON object")
        for required in ("model", "voice"):
            if not body.get(required):
                return _openai_error(400, f"{required} is required", param=required)
        for name in ("max_new_tokens", "seed", "top_k"):
            if body.get(name) is not None and (isinstance(body[name], bool) or not isinstance(body[name], int)):
                return _openai_error(400, f"{name} must be an integer", param=name)
        for name in ("temperature", "top_p"):
            if body.get(name) is not None and not isinstance(body[name], (int, float)):
                return _openai_error(400, f"{name} must be a number", param=name)
        raw = body.get("stream_format") == "audio" and self.stream_mode == "current"
        if raw and body.get("response_format") != "pcm":
            return _openai_error(400, "stream_format='audio' requires response_format='pcm'", param="response_format")
        clip_seconds = None
        if body.get("ref_audio") is not None:
            try:
                samples, rate = self.decode_clip(body["ref_audio"])
            except (ValueError, RuntimeError) as exc:
                return _openai_error(400, str(exc), param="ref_audio")
            clip_seconds = round(len(samples) / rate, 1)
        elif body["voice"].lower() != "default":
            voice = self.state.voices.get(body["voice"].lower())
            if voice is None:
                return _openai_error(400, f"Unknown voice '{body['voice']}'. Upload a voice first via "
                                          "POST /v1/audio/voices, or use ref_audio + ref_text.", param="voice")
            clip_seconds = voice["seconds"]
        take = Take(body)
        self.state.takes.append(take)
        pcm = self.tone(self.frames(body), body.get("seed"), clip_seconds)
        if not body.get("stream"):
            take.pcm = pcm
            return Response(pcm, media_type="audio/pcm")
        await self.enter()
        if raw:
            return StreamingResponse(self.pcm_body(take, pcm), media_type="audio/pcm",
                                     headers={"X-Sample-Rate": str(SAMPLE_RATE), "X-Channels": "1",
                                              "X-Bit-Depth": "16"})
        return StreamingResponse(self.chunk_events(take, pcm, "pcm" if self.stream_mode == "older" else "wav"),
                                 media_type="text/event-stream")

    async def chunk_events(self, take: Take, pcm: bytes, fmt: str, piece: int = 3840):
        try:
            for index, i in enumerate(range(0, len(pcm), piece)):
                take.pcm += pcm[i:i + piece]
                data = pcm[i:i + piece]
                if fmt == "wav":  # each chunk its own little WAV file
                    buf = io.BytesIO()
                    sf.write(buf, np.frombuffer(data, "<i2"), SAMPLE_RATE, format="WAV", subtype="PCM_16")
                    data = buf.getvalue()
                event = {"id": "speech-1", "object": "audio.speech.chunk", "index": index, "finish_reason": None,
                         "audio": {"data": base64.b64encode(data).decode(), "format": fmt,
                                   "mime_type": f"audio/{fmt}", "sample_rate": SAMPLE_RATE}}
                yield f"data: {json.dumps(event)}\n\n"
                await asyncio.sleep(0)
            yield f"data: {json.dumps({'object': 'audio.speech.chunk', 'audio': None, 'finish_reason': 'stop'})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            await self.leave()

    async def list_voices(self, request: Request) -> JSONResponse:
        uploaded = sorted(self.state.voices.values(), key=lambda r: r["name"].lower())
        return JSONResponse({"voices": sorted({"default"} | {r["name"] for r in uploaded}, key=str.lower),
                             "uploaded_voices": [{k: v for k, v in r.items() if k != "seconds"} for r in uploaded],
                             "cache_stats": {}})

    async def upload(self, request: Request) -> JSONResponse:
        form = await request.form()
        name = (form.get("name") or "").strip()
        if not name or not self.NAME.fullmatch(name):
            return _openai_error(400, "name must contain only letters, numbers, '.', '_', and '-'", param="name")
        if name.lower() == "default":
            return _openai_error(400, "name is reserved for a preset voice", param="name")
        if not (form.get("consent") or "").strip():
            return _openai_error(400, "consent must be non-empty", param="consent")
        clip = form.get("audio_sample")
        data = await clip.read() if clip is not None else b""
        try:
            samples, rate = sf.read(io.BytesIO(data))
        except RuntimeError:
            return _openai_error(400, "audio_sample could not be decoded as a supported audio format",
                                 param="audio_sample")
        seconds = len(samples) / rate
        if not 1.0 <= seconds <= 30.0:
            return _openai_error(400, "audio_sample must be 1.0-30.0 s", param="audio_sample")
        record = {"name": name, "consent": form["consent"].strip(), "created_at": int(time.time()),
                  "file_size": len(data), "mime_type": "audio/wav"}
        if (form.get("ref_text") or "").strip():
            record["ref_text"] = form["ref_text"].strip()
        self.state.voices[name.lower()] = {**record, "seconds": round(seconds, 1)}
        return JSONResponse(record)

    async def delete(self, request: Request) -> JSONResponse:
        name = request.path_params["name"]
        if self.state.voices.pop(name.lower(), None) is None:
            return JSONResponse({"success": False, "error": f"Voice '{name}' not found"}, 404)
        return JSONResponse({"success": True, "message": f"Voice '{name}' deleted"})


@contextlib.contextmanager
def serve(fake: _Fake):
    """Run `fake` on a free 127.0.0.1 port for the `with` block; `fake.url` is its base URL."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(fake.app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"the {fake.name} fake did not start")
        time.sleep(0.05)
    fake.url = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def wav_clip(seconds: float, rate: int = 16000) -> bytes:
    """A float WAV of a 170 Hz tone, as a client that sends float samples uploads a voice."""
    from tests.helpers import tone, wav_bytes

    return wav_bytes(tone(seconds, rate=rate, pitch=170, amplitude=0.3), rate, "FLOAT")


def pcm_of(take: Take) -> np.ndarray:
    return np.frombuffer(take.pcm, "<i2")

