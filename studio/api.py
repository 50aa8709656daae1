"""OpenAI-compatible HTTP routes on the studio's own FastAPI app: same process, same engine, same queue.

    studio.api.register(app, service, api_key=None)

adds `POST /v1/audio/speech`, the voice routes `GET|POST /v1/audio/voices`, `GET|PATCH|DELETE
/v1/audio/voices/{id}`, `GET /v1/audio/styles`, `GET /v1/models` and `GET /health` (docs/API.md has the
fields and examples).
Routes only: they validate, translate the request into a `SynthesisRequest`, and format what
`StudioService` yields. Generation, queueing and voice storage happen in the service and the library.

Three decisions shape this module:
* **No instruction slot** (SPEC D1): `instructions` may be a style preset name or a prefix of known inline
  tags; plain-language instructions are refused with a 400, because the model would read them aloud.
* **Auth before bodies**: with an API key set, every `/v1/*` route checks `Authorization: Bearer` from the
  headers alone and answers 401 before a byte of the body is read (so routes parse bodies themselves
  instead of through FastAPI's body parameters, which are read before any dependency runs).
* **Streaming is the default** (OpenAI's `stream_format="audio"`): `pcm` and `wav` go out as frames are
  decoded (`wav` with a streaming header whose sizes are 0xFFFFFFFF); mp3/opus/aac go through one ffmpeg per
  response (`StreamEncoder`) and out as it encodes; flac is encoded once the take is complete (a piped FLAC
  has no length, and soundfile cannot read it). A request never takes the server down: every failure
  becomes a JSON error, an in-band SSE error, or the end of an audio body whose headers are gone.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
import logging
import re
import struct
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import anyio
import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.routing import Mount

from engine.audio import ReferenceAudioError, load_audio
from engine.config import SAMPLE_RATE
from engine.generate import codes_sha256
from engine.remote import RemoteError
from engine.types import DEFAULT_REPEAT_GUARD
from studio.access import Access
from studio.formats import MIME, STREAM_FORMATS, FormatError, StreamEncoder, available_formats, encode_audio, to_pcm16
from studio.presets import check_style_prefix
from studio.longform import MAX_LONG_INPUT_CHARS, stream_long, wants_long_form
from studio.service import MAX_TEXT_CHARS, ServiceBusy, ServiceClosed, SynthesisRequest
from studio.voices import DEFAULT_CONSENT_STATEMENT, Consent, VoiceError, VoiceNotFound

log = logging.getLogger("higgs.api")

MODEL_IDS = ("higgs-audio-v3-tts", "higgs-tts-3")
# OpenAI's built-in voice names. Clients (Open WebUI, the SDK's examples) send them by default; they are
# not Higgs voices, so unless a saved voice has that name they mean "the default voice": zero-shot.
OPENAI_VOICES = frozenset("alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar".split())
DEFAULT_VOICE = "default"
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # reference clips: Boson's and SGLang-Omni's limit
# A JSON speech body may carry a base64 clip (4/3 of 10 MB) beside the text; anything larger is refused
# before it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the small text fields around the clip
MB = 2 ** 20  # sizes are stated in MB of 2**20 bytes, as the docs state the limits
CONSENT_YES = ("true", "yes", "1", "on")
CONSENT_STATEMENT_WORDS = 3  # a statement is a sentence ("The speaker agreed."), not a word ("n", "ok")
_NEGATIONS = frozenset("no not nope never none false deny denied refuse refused without don't dont isn't".split())
SPEED_RANGE = (0.25, 4.0)
REQUEST_TIMEOUT_S = 600.0
STREAMED_FORMATS = ("pcm", "wav", *STREAM_FORMATS)  # sent as the take is decoded; flac waits for the whole take

# `speed` has no direct control in Higgs: it becomes one of the four prosody speed tags.
_SPEED_TAGS = ("<|prosody:speed_very_slow|>", "<|prosody:speed_slow|>", "<|prosody:speed_fast|>",
               "<|prosody:speed_very_fast|>")
_TAGS_ONLY_RE = re.compile(r"^(\s*<\|[^<>|]{0,64}\|>)+\s*$")


class ApiError(Exception):
    """An error the client can act on, answered as OpenAI's `{"error": {...}}` body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 503: "server_busy",
                 504: "timeout"}
        kind = kinds.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# ---------------------------------------------------------------------------------------------- request model

class SpeechRequest(BaseModel):
    """The body of `POST /v1/audio/speech`: OpenAI's fields plus the Higgs extensions."""

    model_config = ConfigDict(extra="ignore")

    model: str = MODEL_IDS[0]
    input: str
    voice: str | dict | None = None
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool | None = None  # SGLang-Omni / vLLM-Omni / Boson spelling; False asks for one buffered body
    # Higgs extensions (SGLang-Omni names).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_frames: int | None = None
    max_new_tokens: int | None = None  # SGLang-Omni / vLLM-Omni name for max_frames
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD  # stop a take whose last N frames repeat; null disables it
    voices: dict[str, str | None] | None = None  # long form: a script's speakers → saved voices (docs/API.md)
    ref_audio: str | None = None
    ref_text: str | None = None

    @field_validator("response_format", "stream_format", mode="before")
    @classmethod
    def _lower(cls, v):
        return v.lower() if isinstance(v, str) else v


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"`{where}`: {err.get('msg', 'invalid')}")
    return "Invalid request: " + "; ".join(parts)


def speed_tag(speed: float) -> str:
    """`speed` → the prosody tag that approximates it ('' for normal speed). Out of range → ValueError."""
    lo, hi = SPEED_RANGE
    if not lo <= speed <= hi:
        raise ValueError(f"speed must be between {lo} and {hi} (got {speed:g}).")
    if speed <= 0.6:
        return _SPEED_TAGS[0]
    if speed < 0.9:
        return _SPEED_TAGS[1]
    if speed >= 1.6:
        return _SPEED_TAGS[3]
    if speed > 1.15:
        return _SPEED_TAGS[2]
    return ""


def check_instructions(instructions: str) -> str:
    """Accept `instructions` made only of known sentence-level tags (a style prefix); refuse anything the
    model would read aloud."""
    text = instructions.strip()
    if not _TAGS_ONLY_RE.match(text):
        raise ApiError(400, "Higgs Audio v3 has no instruction slot: plain-language `instructions` would be read "
                            "aloud as part of the speech. Send a style preset name (GET /v1/audio/styles lists "
                            "them) or inline tags such as <|emotion:contemplation|><|prosody:speed_slow|>.",
                       param="instructions", code="unsupported_instructions")
    try:
        return check_style_prefix(text)
    except ValueError as exc:
        raise ApiError(400, f"`instructions`: {exc}", param="instructions", code="invalid_style") from None


def decode_ref_audio(value: str) -> bytes:
    """`ref_audio` as base64 or a `data:audio/...;base64,` URL → the encoded clip's bytes."""
    value = value.strip()
    if value.startswith(("http://", "https://", "file:")):
        raise ApiError(400, "`ref_audio` must be base64 or a data URL; this server does not fetch URLs or files.",
                       param="ref_audio")
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if ";base64" not in head:
            raise ApiError(400, "`ref_audio` data URL must be base64-encoded (data:audio/wav;base64,...).",
                           param="ref_audio")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "`ref_audio` is not valid base64.", param="ref_audio") from None
    if len(data) > MAX_UPLOAD_BYTES:
        raise ApiError(413, f"`ref_audio` is {len(data) / MB:.1f} MB; the limit is {MAX_UPLOAD_BYTES // MB} MB.",
                       param="ref_audio")
    return data


# ---------------------------------------------------------------------------------------------- voices

def voice_json(voice) -> dict[str, Any]:
    """One saved or preset voice (`studio.voices.Voice`) as the API shows it (the same fields in both list shapes)."""
    try:
        created = int(datetime.fromisoformat(voice.created).timestamp())
    except (TypeError, ValueError):
        created = None
    return {"id": voice.id, "object": "audio.voice", "name": voice.name, "ref_text": voice.transcript or None,
            "description": voice.description or None, "style": voice.style or None, "seed": voice.seed,
            "seconds": round(voice.seconds, 2), "created_at": created,
            "preset": voice.preset,  # one of the owner's preset voices: read-only
            "shared": voice.preset or voice.shared}  # visitors of a public page may see and use it


_DEFAULT_VOICE_JSON = {"id": DEFAULT_VOICE, "object": "audio.voice", "name": "Default (zero-shot)", "ref_text": None,
                       "description": "The model's own voice, no reference clip.", "style": None, "seed": None,
                       "seconds": None, "created_at": None, "preset": False, "shared": True}


@dataclass
class _Resolved:
    voice: Any  # the saved `Voice`, or None for zero-shot
    note: str | None = None


def resolve_voice(service, voice) -> _Resolved:
    """`voice` as sent (a string, `{"id": ...}` or nothing) → a saved voice, or zero-shot with a note."""
    if isinstance(voice, dict):
        key = voice.get("id")
        if not isinstance(key, str) or not key:
            raise ApiError(422, "`voice` as an object must be {\"id\": \"<voice id>\"}.", param="voice")
        voice = key
    if voice is None or not str(voice).strip() or str(voice).strip().lower() == DEFAULT_VOICE:
        return _Resolved(None)
    key = str(voice).strip()
    if service.voices is not None:
        try:
            return _Resolved(service.voices.get(key))
        except VoiceNotFound:
            pass
    if key.lower() in OPENAI_VOICES:
        return _Resolved(None, f"'{key}' is an OpenAI voice name and no saved voice has it: used the default "
                               f"(zero-shot) voice")
    raise ApiError(404, f"No voice {key!r}. GET /v1/audio/voices lists the saved voices; omit `voice` (or send "
                        f"\"default\") for the zero-shot voice.", param="voice", code="voice_not_found")


# ---------------------------------------------------------------------------------------------- audio helpers

def streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length: RIFF and data sizes are 0xFFFFFFFF, the
    convention libsndfile, ffmpeg and browsers read as 'until the end of the stream'."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + \
        b"data" + struct.pack("<I", unknown)


def _metric(metrics, name, default=None):
    value = getattr(metrics, name, None) if metrics is not None else None
    return default if value is None else value


def metric_headers(metrics, seed, *, final: bool, codes=None) -> dict[str, str]:
    headers = {"x-sample-rate": str(SAMPLE_RATE), "X-Seed": str(seed)}
    ttfa = _metric(metrics, "ttfa_ms")
    if ttfa is not None:
        headers["X-TTFA-ms"] = f"{float(ttfa):.1f}"
    if final:
        # X-Batch-Size: the most takes the engine decoded together while this one ran (1 = alone).
        for header, name, fmt in (("X-RTF", "rtf", "{:.4f}"), ("X-Frames", "frames", "{:d}"),
                                  ("X-Stop-Reason", "stop_reason", "{}"), ("X-Batch-Size", "batch", "{:d}")):
            value = _metric(metrics, name)
            if value not in (None, ""):
                headers[header] = fmt.format(int(value) if fmt == "{:d}" else value)
        if codes is not None:  # lets a client check that two servers produced the same codes
            headers["X-Codes-SHA256"] = codes_sha256(codes)
    return headers


MAX_HEADER_CHARS = 1000
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]+")


def header_value(value: object) -> str:
    """Any value as a safe HTTP header value: ASCII, no control characters (a `\\r` or NUL from a tag would
    make the server drop the response), at most MAX_HEADER_CHARS characters."""
    text = str(value).encode("ascii", "replace").decode()
    return _CONTROL_RE.sub(" ", text).strip()[:MAX_HEADER_CHARS]


# The fields PATCH /v1/audio/voices/{id} changes, as the API names them → the library's names.
VOICE_FIELDS = {"shared": "shared", "name": "name", "description": "description", "ref_text": "transcript",
                "style": "style"}


def _form_bool(value: str, name: str) -> bool:
    """A multipart field that means true or false (empty: false)."""
    if value.lower() in ("", "false", "no", "0", "off"):
        return False
    if value.lower() in CONSENT_YES:
        return True
    raise ApiError(400, f"Field `{name}` must be true or false (got {value!r}).", param=name)


def check_consent(value: str) -> str:
    """The consent field → the statement stored with the voice; an ApiError unless it is an explicit yes."""
    value = value.strip()
    words = value.lower().replace(",", " ").replace(".", " ").split()
    if value.lower() in CONSENT_YES:
        return DEFAULT_CONSENT_STATEMENT
    if len(words) >= CONSENT_STATEMENT_WORDS and not _NEGATIONS.intersection(words):
        return value
    raise ApiError(400, "Field `consent` must confirm that the speaker agreed to have their voice cloned: send "
                        f"\"true\" (also \"yes\", \"1\", \"on\") or a statement of at least "
                        f"{CONSENT_STATEMENT_WORDS} words, such as \"Ann agreed by email on 2026-11-30\". It is "
                        "stored with the voice.", param="consent")


# ---------------------------------------------------------------------------------------------- the routes

class SpeechAPI:
    """The routes' state: the service, the key, the limits, and a thread limiter of its own (requests
    waiting for their turn on the GPU sit in threads; they must not starve Gradio's own thread pool)."""

    def __init__(self, service, *, access: Access, request_timeout: float,
                 max_input_chars: int = MAX_LONG_INPUT_CHARS, transcriber=None):
        self.service = service
        self.transcriber = transcriber  # studio/asr.py: fills a voice's missing ref_text, as the page does
        self.access = access
        self.api_key = access.api_key
        self.request_timeout = request_timeout
        self.max_input_chars = max_input_chars  # a long input (or a script); one prompt takes MAX_TEXT_CHARS
        self.limiter = anyio.CapacityLimiter(max(8, int(getattr(service, "max_queue", 64)) + 4))

    # ------------------------------------------------------------ plumbing

    def check_auth(self, request: Request) -> None:
        if not self.access.bearer_ok(request.headers.get("authorization")):
            raise ApiError(401, "Missing or wrong API key: send `Authorization: Bearer <key>`.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_site(self, request: Request) -> None:
        """The cross-site rule for requests that write or generate (docs/SECURITY.md)."""
        refusal = self.access.cross_site_refusal(request.headers.get("origin"), request.headers.get("host"))
        if refusal is not None:
            raise ApiError(403, refusal, code="cross_site_request")

    async def read_body(self, request: Request, limit: int) -> bytes:
        """The body, refused with 413 as soon as it passes `limit` (never buffered beyond it)."""
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"Request body is {int(declared) / MB:.1f} MB; the limit is {limit // MB} MB.")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"Request body is over the {limit // MB} MB limit.")
            chunks.append(chunk)
        body = b"".join(chunks)
        request._body = body  # so request.form() parses what was already read
        return body

    async def in_thread(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    # ------------------------------------------------------------ speech

    async def speech(self, request: Request) -> Response:
        self.check_auth(request)
        self.check_site(request)
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise ApiError(415, "Send the speech request as JSON with the header `Content-Type: application/json`.")
        body = await self.read_body(request, MAX_JSON_BYTES)
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"Request body is not valid JSON ({exc}). Send a JSON object like "
                                f'{{"model": "{MODEL_IDS[0]}", "input": "Hello", "voice": "default"}}.') from None
        except RecursionError:
            raise ApiError(400, "Request body is nested too deeply to be a speech request. Send a flat JSON object "
                                "of the documented fields.") from None
        if not isinstance(payload, dict):
            raise ApiError(400, "Request body must be a JSON object.")
        try:
            req = SpeechRequest.model_validate(payload)
        except ValidationError as exc:
            raise ApiError(422, _validation_message(exc)) from None

        synth, notes = await self.build_request(req)
        started = time.perf_counter()
        run = _Run(self, synth, long=wants_long_form(req.input, req.voices), voices=req.voices)
        first = await run.first(request)
        headers = metric_headers(first.metrics if first else None, synth.seed, final=bool(first and first.final))
        warnings = [*notes, *synth.warnings]
        if warnings:
            headers["X-Warnings"] = "; ".join(warnings)
        headers = {name: header_value(value) for name, value in headers.items()}
        fmt = req.response_format
        streamable = fmt in STREAMED_FORMATS and req.stream is not False
        if req.stream_format == "sse":
            return _TakeResponse(run, self._sse(run, first, fmt, len(req.input), started),
                                 media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        if streamable:
            return _TakeResponse(run, self._audio_stream(run, first, fmt), media_type=MIME[fmt], headers=headers)
        audio, last = await run.collect(first)
        data, mime = await self.in_thread(encode_audio, audio, SAMPLE_RATE, fmt)
        final = metric_headers(last.metrics, synth.seed, final=True, codes=getattr(last, "codes", None))
        headers.update({name: header_value(value) for name, value in final.items()})
        return Response(data, media_type=mime, headers=headers)

    async def build_request(self, req: SpeechRequest) -> tuple[SynthesisRequest, list[str]]:
        if not req.input.strip():
            raise ApiError(400, "`input` is empty: send the text to speak.", param="input")
        long = wants_long_form(req.input, req.voices)
        limit = self.max_input_chars if long else MAX_TEXT_CHARS
        if len(req.input) > limit:
            raise ApiError(400, f"`input` is {len(req.input)} characters; the limit is {limit}. Split the text into "
                                f"several requests.", param="input", code="string_above_max_length")
        if req.response_format not in available_formats():
            raise ApiError(400, f"response_format {req.response_format!r} needs ffmpeg, which this server does not "
                                f"have; ask for one of {', '.join(available_formats())}.", param="response_format")
        notes: list[str] = []
        resolved = resolve_voice(self.service, req.voice)
        if resolved.note:
            notes.append(resolved.note)
        if resolved.voice is not None and req.ref_audio:
            raise ApiError(400, "Send either `voice` (a saved voice) or `ref_audio` (a one-off clone), not both.",
                           param="ref_audio")
        style = self.instructions_style(req.instructions)
        if style is None and resolved.voice is not None:  # the saved voice's default style, as in the studio
            style = resolved.voice.style or None
        preset = self.service.presets.get(style) if style and self.service.presets is not None else None
        try:
            tag = speed_tag(float(req.speed))
        except ValueError as exc:
            raise ApiError(400, str(exc), param="speed") from None
        if tag:
            try:
                prefix = self.service.resolve_style(style)
            except ValueError as exc:
                raise ApiError(400, str(exc), param="instructions") from None
            replaced = [t for t in _SPEED_TAGS if t in prefix]
            for t in replaced:  # an explicit `speed` wins over the style's own speed tag
                prefix = prefix.replace(t, "")
            style = prefix + tag
            notes.append(f"speed {req.speed:g} -> {tag}" + (f" (instead of {replaced[0]})" if replaced else ""))
        ref_audio = None
        if req.ref_audio:
            data = decode_ref_audio(req.ref_audio)
            try:
                ref_audio = await self.in_thread(load_audio, data)
            except ValueError as exc:
                raise ApiError(400, f"`ref_audio` could not be read as audio: {exc}", param="ref_audio") from None
        max_frames = req.max_frames if req.max_frames is not None else req.max_new_tokens
        synth = SynthesisRequest(text=req.input, voice_id=resolved.voice.id if resolved.voice else None, style=style,
                                 seed=req.seed, max_frames=max_frames, repeat_guard=req.repeat_guard, ref_audio=ref_audio,
                                 ref_text=req.ref_text, source="api")
        if req.temperature is None and getattr(preset, "temperature", None) is not None:
            synth.temperature = preset.temperature  # the preset's suggestion, as the studio page applies it
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(req, name)
            if value is not None:
                setattr(synth, name, value)
        try:
            # A long input is checked segment by segment when it is planned; here only its settings are.
            (dataclasses.replace(synth, text="x") if long else synth).validate()
            if style is not None:
                self.service.resolve_style(style)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return synth, notes

    def instructions_style(self, instructions: str | None) -> str | None:
        """`instructions` → a style for the service: a preset name as is, or a validated tag prefix."""
        text = (instructions or "").strip()
        if not text:
            return None
        presets = self.service.presets
        if presets is not None and presets.get(text) is not None:
            return text
        return check_instructions(text)

    async def _encoded(self, run: "_Run", first, fmt: str) -> AsyncIterator[tuple[bytes, Any]]:
        """`(bytes of fmt, the chunk they came from)` as the take is decoded (one of STREAMED_FORMATS); the
        encoder's tail comes last with chunk None. Raises FormatError if ffmpeg fails; the take and its ffmpeg
        are stopped however this ends (the client left, the take failed, the encoder failed)."""
        encoder = None
        try:
            if fmt == "wav":
                yield streaming_wav_header(), None
            if fmt in STREAM_FORMATS:
                encoder = await self.in_thread(StreamEncoder, fmt, SAMPLE_RATE)
            async with aclosing(run.chunks(first)) as chunks:
                async for chunk in chunks:
                    data = to_pcm16(chunk.audio).tobytes() if len(chunk.audio) else b""
                    if encoder is not None and data:
                        data = await self.in_thread(encoder.feed, data)
                    yield data, chunk
            if encoder is not None:
                yield await self.in_thread(encoder.close), None
        finally:
            with anyio.CancelScope(shield=True):
                await run.close()  # a no-op when `chunks` ran: it closes the take itself
                if encoder is not None:
                    await self.in_thread(encoder.kill)

    async def _audio_stream(self, run: "_Run", first, fmt: str) -> AsyncIterator[bytes]:
        try:
            async with aclosing(self._encoded(run, first, fmt)) as stream:
                async for data, _ in stream:
                    if data:
                        yield data
        except FormatError:  # the status line is gone: end the body, keep the server up
            log.exception("encoding the %s stream failed", fmt)

    async def _sse(self, run: "_Run", first, fmt: str, input_chars: int, started: float) -> AsyncIterator[bytes]:
        def event(obj) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def delta(data: bytes) -> bytes:
            return event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

        last = None
        try:
            if fmt in STREAMED_FORMATS:
                async with aclosing(self._encoded(run, first, fmt)) as stream:
                    async for data, chunk in stream:
                        if chunk is not None:
                            last = chunk
                        if data:
                            yield delta(data)
            else:
                audio, last = await run.collect(first)
                data, _ = await self.in_thread(encode_audio, audio, SAMPLE_RATE, fmt)
                yield delta(data)
        except ApiError as exc:
            yield event({"type": "error", "error": {"message": exc.message, "code": exc.code}})
            return
        except Exception as exc:  # the headers are gone: report in-band, keep the server up
            log.exception("speech SSE stream failed")
            yield event({"type": "error", "error": {"message": f"{type(exc).__name__}: {exc}"}})
            return
        metrics = last.metrics if last is not None else None
        frames = int(_metric(metrics, "frames", 0))
        prompt_tokens = int(_metric(metrics, "prompt_tokens", 0) or input_chars)
        yield event({"type": "speech.audio.done",
                     "usage": {"input_tokens": prompt_tokens, "output_tokens": frames,
                               "total_tokens": prompt_tokens + frames},
                     "metrics": {"ttfa_ms": _metric(metrics, "ttfa_ms"), "rtf": _metric(metrics, "rtf"),
                                 "frames": frames, "seed": run.synth.seed,
                                 "stop_reason": _metric(metrics, "stop_reason"), "batch": _metric(metrics, "batch"),
                                 "codes_sha256": codes_sha256(last.codes) if getattr(last, "codes", None) is not None
                                 else None,
                                 "wall_ms": round((time.perf_counter() - started) * 1000, 1)}})

    # ------------------------------------------------------------ voices

    def _library(self):
        if self.service.voices is None:
            raise ApiError(404, "This server has no voice library configured.")
        return self.service.voices

    def _get(self, key: str):
        try:
            return self._library().get(key)
        except VoiceNotFound:
            raise ApiError(404, f"No voice {key!r}; GET /v1/audio/voices lists them.", param="voice_id",
                           code="voice_not_found") from None

    async def list_voices(self, request: Request) -> JSONResponse:
        """Saved voices. Default shape `{"voices": [...]}` (what Open WebUI reads, with the zero-shot
        "default" first); `?format=openai` gives OpenAI's `{"object": "list", "data": [...]}`."""
        self.check_auth(request)
        voices = [voice_json(v) for v in await self.in_thread(self._library().list)]
        if request.query_params.get("format", "").lower() == "openai":
            return JSONResponse({"object": "list", "data": voices})
        return JSONResponse({"voices": [_DEFAULT_VOICE_JSON, *voices]})

    async def get_voice(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        return JSONResponse(voice_json(voice))

    async def create_voice(self, request: Request) -> JSONResponse:
        """Multipart `audio_sample` (≤ 10 MB), `name`, `consent` (required), `ref_text` (the clip's transcript;
        recommended: without it the studio's transcriber fills it, `ref_text_source: "asr"` in the answer, or
        the answer carries a `warning`), optional `description`, `style`, `asserted_by`."""
        self.check_auth(request)
        self.check_site(request)
        self._library()
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            raise ApiError(400, "Send the voice as multipart/form-data with fields audio_sample (the clip), name, "
                                "ref_text (its transcript) and consent.")
        await self.read_body(request, MAX_UPLOAD_BYTES + FORM_OVERHEAD)
        try:
            form = await request.form(max_files=2, max_fields=16)
        except Exception as exc:  # malformed multipart
            raise ApiError(400, f"Could not parse the multipart form: {exc}") from None
        upload = form.get("audio_sample")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "Field `audio_sample` (the reference clip, as a file) is required.",
                           param="audio_sample")
        data = await upload.read()
        if len(data) > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"`audio_sample` is {len(data) / MB:.1f} MB; the limit is "
                                f"{MAX_UPLOAD_BYTES // MB} MB.", param="audio_sample")
        fields = {k: str(form.get(k) or "").strip() for k in
                  ("name", "consent", "ref_text", "transcript", "description", "style", "asserted_by", "shared")}
        if not fields["name"]:
            raise ApiError(400, "Field `name` is required.", param="name")
        statement = check_consent(fields["consent"])
        shared = _form_bool(fields["shared"], "shared")
        consent = Consent(asserted_by=fields["asserted_by"] or "API client", statement=statement)
        try:
            samples, rate = await self.in_thread(load_audio, data)
        except ValueError as exc:
            raise ApiError(400, f"`audio_sample` could not be read as audio: {exc}", param="audio_sample") from None
        style = self.instructions_style(fields["style"]) if fields["style"] else None
        transcript, note = fields["ref_text"] or fields["transcript"] or None, None
        if transcript is None and self.transcriber is not None:  # as the page does; never an error
            try:
                text, note = await self.in_thread(self.transcriber.transcribe, samples, rate)
            except Exception as exc:  # the clip is still a voice; the client can send ref_text next time
                log.warning("transcribing a voice clip failed: %s", exc)
                text, note = "", f"Automatic transcription failed ({type(exc).__name__}); send ref_text."
            transcript = text or None
        try:
            voice = await self.in_thread(lambda: self.service.save_voice(
                samples, rate, name=fields["name"], transcript=transcript, description=fields["description"],
                style=style, consent=consent))
            if shared:
                voice = await self.in_thread(lambda: self._library().update(voice.id, shared=True))
        except (ServiceBusy, ServiceClosed) as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
        except ValueError as exc:  # ReferenceAudioError, VoiceError: the message says what to fix
            raise ApiError(400, str(exc), param="audio_sample" if isinstance(exc, ReferenceAudioError) else None) \
                from None
        body = voice_json(voice)
        if transcript is not None and not (fields["ref_text"] or fields["transcript"]):
            body["ref_text_source"] = "asr"  # the client may want to check what was heard
        elif transcript is None:
            body["warning"] = ("No ref_text: the voice clones less faithfully without the clip's transcript. "
                               + (note or "Send ref_text."))
        return JSONResponse(body, status_code=201)

    async def update_voice(self, request: Request) -> JSONResponse:
        """JSON with any of `shared` (true: visitors of a public page may see and use the voice), `name`,
        `description`, `ref_text`, `style`; answers the voice as it is now."""
        self.check_auth(request)
        self.check_site(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        try:
            changes = json.loads(await self.read_body(request, FORM_OVERHEAD) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            changes = None
        if not isinstance(changes, dict) or not changes:
            raise ApiError(400, f"Send a JSON object with any of {', '.join(VOICE_FIELDS)}, e.g. {{\"shared\": true}}.")
        unknown = sorted(set(changes) - set(VOICE_FIELDS))
        if unknown:
            raise ApiError(400, f"Unknown field(s) {', '.join(unknown)}; a voice's editable fields are "
                                f"{', '.join(VOICE_FIELDS)}.", param=unknown[0])
        if "shared" in changes and not isinstance(changes["shared"], bool):
            raise ApiError(400, "`shared` must be true or false.", param="shared")
        if voice.preset:
            raise ApiError(403, f"{voice.name!r} is one of the studio's preset voices, which are read-only and "
                                "shown to everyone.", param="voice_id")
        updates = {VOICE_FIELDS[k]: v for k, v in changes.items()}
        if "style" in updates and updates["style"]:
            updates["style"] = self.service.resolve_style(self.instructions_style(updates["style"]))
        try:
            updated = await self.in_thread(lambda: self._library().update(voice.id, **updates))
        except VoiceNotFound:
            raise ApiError(404, f"No voice {voice.id!r}; it was deleted meanwhile.", param="voice_id") from None
        except ValueError as exc:  # VoiceError: a name taken, a field too long
            raise ApiError(400, str(exc)) from None
        return JSONResponse(voice_json(updated))

    async def delete_voice(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        self.check_site(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        try:
            await self.in_thread(self._library().delete, voice.id)
        except VoiceNotFound:  # deleted by someone else in between: the outcome the client asked for
            pass
        except VoiceError as exc:  # one of the owner's preset voices: read-only, also over the API
            raise ApiError(403, str(exc), param="voice_id") from None
        return JSONResponse({"id": voice.id, "object": "audio.voice.deleted", "deleted": True})

    async def styles(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        presets = self.service.presets
        items = [] if presets is None else [
            {"name": p.name, "description": p.description, "prefix": p.prefix, "temperature": p.temperature,
             "builtin": p.builtin} for p in presets.list()]
        return JSONResponse({"styles": items})

    async def models(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "bosonai"}
                                                        for m in MODEL_IDS]})

    async def health(self, request: Request) -> JSONResponse:
        status = dict(self.service.status())
        engine = getattr(self.service, "engine", None)
        return JSONResponse({"status": "ok", "engine_loaded": engine is not None, "model": MODEL_IDS[0],
                             "device": status.get("device"), "precision": status.get("precision"),
                             "precision_reason": status.get("precision_reason"),
                             "backend": status.get("backend"), "queue_depth": status.get("queue_depth"),
                             "batch_size": status.get("batch_size"), "max_batch": status.get("max_batch"),
                             "memory_plan": status.get("memory_plan"),
                             "demo": status.get("demo"), "formats": list(available_formats()),
                             "auth": self.api_key is not None,
                             **{k: status[k] for k in ("remote_kind", "sampling_note") if status.get(k)}})


class _TakeResponse(StreamingResponse):
    """A streamed take that is cancelled however sending ends. The body's own `finally` stops the take
    once the body has started; this also covers a failure before it starts (the server refusing a header,
    the client gone before the first byte), which would otherwise leave the take running on the GPU."""

    def __init__(self, run: "_Run", content, **kwargs):
        super().__init__(content, **kwargs)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.run.close()


class _Run:
    """One generation driven from async code: pulls `service.stream()` in a worker thread, enforces the
    request timeout, and cancels the take (and frees the GPU) however the client goes away."""

    _END = object()

    def __init__(self, api: SpeechAPI, synth: SynthesisRequest, *, long: bool = False, voices: dict | None = None):
        """`long`: a long input or a script (`voices`: its speakers' voices), generated segment by segment
        (studio/longform.py)."""
        self.api, self.synth, self.long, self.voices = api, synth, long, voices
        self.timed_out = False
        self._gen: Iterator | None = None
        self._timer = threading.Timer(api.request_timeout, self._timeout)
        self._timer.daemon = True

    def _timeout(self) -> None:
        self.timed_out = True
        self.synth.cancel.set()

    def _next(self):
        if self._gen is None:
            self._gen = stream_long(self.api.service, self.synth, voices=self.voices or None,
                                    max_chars=self.api.max_input_chars) if self.long else \
                self.api.service.stream(self.synth)
        return next(self._gen, self._END)

    async def _pull(self):
        try:
            item = await self.api.in_thread(self._next)
        except ApiError:
            raise
        except (ServiceBusy, ServiceClosed) as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
        except ValueError as exc:  # VoiceNotFound, ReferenceAudioError, engine limits: sentences for the user
            raise ApiError(400, str(exc)) from None
        except RemoteError as exc:  # the --remote server refused or failed: its answer, as a 400 or a 502/503
            status = exc.client_status
            raise ApiError(status, str(exc), headers={"Retry-After": "5"} if status == 503 else None) from None
        if self.timed_out:
            raise ApiError(504, f"The request took longer than {self.api.request_timeout:g} s (queue wait and "
                                f"generation) and was stopped.")
        return None if item is self._END else item

    async def first(self, request: Request):
        """The first chunk, while watching for the client leaving (a queued request then leaves the queue)."""
        self._timer.start()
        task = asyncio.ensure_future(self._pull())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    break
                if await request.is_disconnected():
                    self.synth.cancel.set()
            chunk = task.result()
        except BaseException:
            await self.close()
            raise
        if chunk is None:
            await self.close()
            raise ApiError(500, "The generation ended without producing audio.")
        return chunk

    async def chunks(self, first) -> AsyncIterator[Any]:
        """`first` and every chunk after it; always closes the generation."""
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                if chunk.final:
                    break
                chunk = await self._pull()
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def collect(self, first) -> tuple[np.ndarray, Any]:
        pieces, last = [], None
        async for chunk in self.chunks(first):
            last = chunk
            if len(chunk.audio):
                pieces.append(np.asarray(chunk.audio, dtype=np.float32))
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), last

    async def close(self) -> None:
        self._timer.cancel()
        gen, self._gen = self._gen, None
        if gen is not None:
            self.synth.cancel.set()
            await self.api.in_thread(gen.close)


# ---------------------------------------------------------------------------------------------- registration

def register(app: FastAPI, service, *, api_key: str | None = None, access: Access | None = None,
             request_timeout: float = REQUEST_TIMEOUT_S, max_input_chars: int = MAX_LONG_INPUT_CHARS,
             transcriber=None) -> SpeechAPI:
    """Add the HTTP API to `app` (the FastAPI app that serves the Gradio studio). With `api_key` (or an
    `access` that holds it), every `/v1/*` route needs `Authorization: Bearer <api_key>`; `/health` stays
    open for load balancers. Without a key, writes from other sites are refused (`Access.cross_site_refusal`)."""
    api = SpeechAPI(service, access=access or Access(api_key), request_timeout=request_timeout,
                    max_input_chars=max_input_chars, transcriber=transcriber)

    def guarded(handler):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except ApiError as exc:
                return exc.response()
            except Exception as exc:  # one bad request never takes the server down
                log.exception("%s %s failed", request.method, request.url.path)
                return ApiError(500, f"Internal error: {type(exc).__name__}: {exc}").response()
        endpoint.__name__ = handler.__name__
        endpoint.__doc__ = handler.__doc__
        return endpoint

    routes = [
        ("/v1/audio/speech", api.speech, ["POST"]),
        ("/v1/audio/voices", api.list_voices, ["GET"]),
        ("/v1/audio/voices", api.create_voice, ["POST"]),
        ("/v1/audio/voices/{voice_id}", api.get_voice, ["GET"]),
        ("/v1/audio/voices/{voice_id}", api.update_voice, ["PATCH"]),
        ("/v1/audio/voices/{voice_id}", api.delete_voice, ["DELETE"]),
        ("/v1/audio/styles", api.styles, ["GET"]),
        ("/v1/models", api.models, ["GET"]),
        ("/health", api.health, ["GET"]),
    ]
    for path, handler, methods in routes:
        app.add_api_route(path, guarded(handler), methods=methods, include_in_schema=True)
    # Gradio's app may already hold routes; ours are specific paths, so order only matters against a
    # catch-all mount at "/" (mount_gradio_app): move ours in front of anything mounted.
    _routes_first(app, len(routes))
    return api


def _routes_first(app: FastAPI, n: int) -> None:
    routes = app.router.routes
    ours, rest = routes[-n:], routes[:-n]
    mounts = [r for r in rest if isinstance(r, Mount)]
    if mounts:
        app.router.routes[:] = [r for r in rest if not isinstance(r, Mount)] + ours + mounts
