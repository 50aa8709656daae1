"""`POST /v1/audio/speech`: a speech request in, a take out, streamed as it is decoded.

**Streaming is the default** (OpenAI's `stream_format="audio"`): `pcm` and `wav` go out as frames are decoded
(`wav` with a streaming header whose sizes are 0xFFFFFFFF); mp3/opus/aac go through one ffmpeg per response
(`StreamEncoder`) and out as it encodes; flac is encoded once the take is complete (a piped FLAC has no length,
and soundfile cannot read it). A request never takes the server down: every failure becomes a JSON error, an
in-band SSE error, or the end of an audio body whose headers are gone. A long input or a script goes through
the long form (studio/takes/longform.py) and streams the same way.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import struct
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from engine.audio import load_audio
from engine.config import SAMPLE_RATE
from engine.delay import codes_sha256
from engine.types import Metrics, SamplingParams
from studio.api.model import (
    MAX_JSON_BYTES,
    MODEL_IDS,
    ApiError,
    Routes,
    SpeechRequest,
    api_error,
    decode_ref_audio,
    header_value,
    validation_message,
)
from studio.api.run import CLIENT_CLOSED, TakeResponse, TakeRun
from studio.audio.captions import take_captions
from studio.audio.formats import (
    MIME,
    STREAM_FORMATS,
    FormatError,
    StreamEncoder,
    available_formats,
    encode_audio,
    to_pcm16,
)
from studio.audio.loudness import LoudnessMeter, check_ceiling, measure, normalize, resolve_target
from studio.takes.admission import OWNER
from studio.takes.limits import MAX_INPUT_CHARS
from studio.takes.order import Order
from studio.takes.prepare import lookup_voice
from studio.takes.take import TakeHandle
from studio.text.pronounce import Dictionary

log = logging.getLogger("higgs.api")

STREAMED_FORMATS = ("pcm", "wav", *STREAM_FORMATS)  # sent as the take is decoded; flac waits for the whole take


def streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length: RIFF and data sizes are 0xFFFFFFFF, the
    convention libsndfile, ffmpeg and browsers read as 'until the end of the stream'."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + \
        b"data" + struct.pack("<I", unknown)


def metric_headers(metrics: Metrics | None, seed: int, *, final: bool, codes=None) -> dict[str, str]:
    headers = {"x-sample-rate": str(SAMPLE_RATE), "X-Seed": str(seed)}
    if metrics is not None and metrics.ttfa_ms is not None:
        headers["X-TTFA-ms"] = f"{float(metrics.ttfa_ms):.1f}"
    if final and metrics is not None:
        headers["X-RTF"] = f"{metrics.rtf:.4f}"
        headers["X-Frames"] = str(int(metrics.frames))
        if metrics.stop_reason:
            headers["X-Stop-Reason"] = metrics.stop_reason
        headers["X-Batch-Size"] = str(int(metrics.batch))  # the most takes decoded together while it ran (1 = alone)
        if codes is not None:  # lets a client check that two servers produced the same codes
            headers["X-Codes-SHA256"] = codes_sha256(codes)
    return headers


class SpeechRoutes(Routes):
    """The speech route: the request checked and resolved, the take queued, the answer streamed."""

    def __init__(self, service, access, limiter, *, request_timeout: float,
                 max_input_chars: int = MAX_INPUT_CHARS, transcriber=None, listener=None):
        super().__init__(service, access, limiter)
        self.listener = listener  # listen and retry for long inputs that ask `listen` (studio/audio/listen.py; maybe off)
        self.request_timeout = request_timeout
        self.max_input_chars = max_input_chars  # a long input (or a script); one prompt takes MAX_TEXT_CHARS
        self.transcriber = transcriber  # word times for `timestamps` (studio/audio/asr.py); None: estimated

    async def speech(self, request: Request) -> Response:
        self.check_auth(request)
        self.check_site(request)
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise ApiError(415, "Send the speech request as JSON with the header `Content-Type: application/json`.")
        body = await self.read_body(request, MAX_JSON_BYTES)
        example = f'Send a JSON object like {{"model": "{MODEL_IDS[0]}", "input": "Hello", "voice": "default"}}.'
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"Request body is not valid JSON: {exc.msg.lower()} at line {exc.lineno}, column "
                                f"{exc.colno}. {example}") from None
        except UnicodeDecodeError:
            raise ApiError(400, f"Request body is not valid JSON: it is not UTF-8 text. {example}") from None
        except RecursionError:
            raise ApiError(400, "Request body is nested too deeply to be a speech request. Send a flat JSON object "
                                "of the documented fields.") from None
        if not isinstance(payload, dict):
            raise ApiError(400, "Request body must be a JSON object.")
        try:
            req = SpeechRequest.model_validate(payload)
        except ValidationError as exc:
            raise ApiError(422, validation_message(exc)) from None

        try:
            target, ceiling = resolve_target(req.loudness), check_ceiling(req.true_peak)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="loudness") from None
        level = None if target is None else (target, ceiling)
        order = await self.build_order(req)
        started = time.perf_counter()
        try:
            handle = await self.in_thread(lambda: self.service.start(order, listener=self.listener))
        except Exception as exc:
            raise api_error(exc, "starting a take") from None
        alias = handle.plan.alias
        run = TakeRun(self, handle, request, timeout=self.request_timeout)
        first = await run.first()
        headers = metric_headers(first.metrics, handle.seed, final=first.final)
        if handle.warnings:
            headers["X-Warnings"] = "; ".join(handle.warnings)
        if alias is not None:  # what an OpenAI voice name spoke with, for a client wondering
            headers["X-Voice-Alias"] = f"{alias.name}={alias.shown}"
        headers = {name: header_value(value) for name, value in headers.items()}
        fmt = req.response_format
        streamable = fmt in STREAMED_FORMATS and req.stream is not False and level is None
        if req.stream_format == "sse":
            return TakeResponse(run, self._sse(run, first, fmt, len(req.input), started, level, req.timestamps),
                                media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        if streamable and req.timestamps is None:
            return TakeResponse(run, self._audio_stream(run, first, fmt), media_type=MIME[fmt], headers=headers)
        audio, last = await run.collect(first)
        audio, loudness = await self.in_thread(_leveled, audio, level)
        data, mime = await self.in_thread(encode_audio, audio, SAMPLE_RATE, fmt)
        final = metric_headers(last.metrics, handle.seed, final=True, codes=last.codes)
        final.update(_loudness_headers(loudness))
        headers.update({name: header_value(value) for name, value in final.items()})
        if req.timestamps is not None:  # Kokoro-FastAPI's captioned speech: the audio and its times in one JSON
            body = {"audio": base64.b64encode(data).decode(), "audio_format": mime,
                    **await self._timestamps(handle, req.timestamps, audio)}
            return JSONResponse(body, headers=headers)
        return Response(data, media_type=mime, headers=headers)

    async def _timestamps(self, handle: TakeHandle, level: str, audio: np.ndarray | None) -> dict[str, Any]:
        """The finished take's captions as the API answers them: `timestamps` (one per sentence or word),
        whether any is `estimated`, and the `timestamps_note` saying why (docs/API.md)."""
        if handle.take is None:
            return {"timestamps": [], "estimated": False, "timestamps_note": "the take was stopped"}
        transcriber = self.service.transcriber_for(self.transcriber, handle.order.caller)  # in the caller's turn
        found = await self.in_thread(lambda: take_captions(handle.take, level=level, transcriber=transcriber,
                                                           audio=audio))
        items = found.as_list()
        if level == "word":
            for item in items:
                item["word"] = item["text"]  # Kokoro-FastAPI's name for it
        return {"timestamps": items, "estimated": found.estimated, "timestamps_note": found.note}

    async def build_order(self, req: SpeechRequest) -> Order:
        """The speech request as the studio's order: the API's own fields translated (`input`, `instructions`,
        `ref_audio`, a recipe's `dictionary`); everything else is checked by `prepare`, as at every door."""
        if not req.input.strip():
            raise ApiError(400, "`input` is empty: send the text to speak.", param="input")
        _check_length(req.input, self.max_input_chars)  # before anything is parsed or decoded
        if req.response_format not in available_formats():
            raise ApiError(400, f"response_format {req.response_format!r} needs ffmpeg, which this server does not "
                                f"have; ask for one of {', '.join(available_formats())}.", param="response_format")
        style = self.instructions_style(req.instructions)
        clip = None
        if req.ref_audio:
            data = decode_ref_audio(req.ref_audio)
            try:
                clip = await self.in_thread(load_audio, data)
            except ValueError as exc:
                raise ApiError(400, f"`ref_audio` could not be read as audio: {exc}", param="ref_audio") from None
        voice = req.voice
        if isinstance(voice, dict):
            voice = voice.get("id")
            if not isinstance(voice, str) or not voice:
                raise ApiError(422, "`voice` as an object must be {\"id\": \"<voice id>\"}.", param="voice")
        temperature = req.temperature
        if temperature is None:  # a style preset's suggestion (None: none), as the studio page applies it
            temperature = self._preset_temperature(style, voice)
        options = {"temperature": temperature, "top_p": req.top_p, "top_k": req.top_k}
        try:
            params = SamplingParams.of(seed=req.seed, repeat_guard=req.repeat_guard,
                                       max_frames=req.max_frames if req.max_frames is not None else req.max_new_tokens,
                                       **{name: value for name, value in options.items() if value is not None})
            rules = None if req.dictionary is None else await self.in_thread(Dictionary.from_json, req.dictionary)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return Order(text=req.input, voice=voice, style=style, speed=req.speed if req.speed != 1.0 else None,
                     params=params, clip=clip, clip_text=req.ref_text, voices=req.voices or None, clean=req.clean,
                     clean_actions=req.clean_actions, ssml=req.ssml, dictionary=rules, listen=bool(req.listen),
                     door="api")

    def _preset_temperature(self, style: str | None, voice) -> float | None:
        """The temperature the style preset suggests: the request's style, else its voice's (or alias's)."""
        presets = self.service.presets
        if presets is None:
            return None
        if style is None and isinstance(voice, str) and voice.strip():
            try:
                record, alias, _ = lookup_voice(self.service, voice, OWNER)
            except ValueError:
                return None  # prepare says why
            style = alias.style if alias is not None and alias.style else (record.style if record else None)
        preset = presets.get(style) if style else None
        return preset.temperature if preset is not None else None

    async def _encoded(self, run: TakeRun, first, fmt: str) -> AsyncIterator[tuple[bytes, Any]]:
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

    async def _audio_stream(self, run: TakeRun, first, fmt: str) -> AsyncIterator[bytes]:
        try:
            async with aclosing(self._encoded(run, first, fmt)) as stream:
                async for data, _ in stream:
                    if data:
                        yield data
        except FormatError:  # the status line is gone: end the body, keep the server up
            log.exception("encoding the %s stream failed", fmt)
        except ApiError as exc:  # the client left (nothing to tell), or the take ran out of time: the body ends
            if exc.status != CLIENT_CLOSED:
                log.warning("the %s stream ended early: %s", fmt, exc.message)

    async def _sse(self, run: TakeRun, first, fmt: str, input_chars: int, started: float,
                   level: tuple[float, float] | None, timestamps: str | None = None) -> AsyncIterator[bytes]:
        def event(obj) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        def delta(data: bytes) -> bytes:
            return event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

        last, loudness, meter = None, None, LoudnessMeter(SAMPLE_RATE)
        try:
            if fmt in STREAMED_FORMATS and level is None:
                async with aclosing(self._encoded(run, first, fmt)) as stream:
                    async for data, chunk in stream:
                        if chunk is not None:
                            last = chunk
                            meter.feed(chunk.audio)  # a long take keeps no audio: it is measured as it goes
                        if data:
                            yield delta(data)
            else:
                audio, last = await run.collect(first)
                audio, loudness = await self.in_thread(_leveled, audio, level)
                data, _ = await self.in_thread(encode_audio, audio, SAMPLE_RATE, fmt)
                yield delta(data)
        except Exception as exc:  # the headers are gone: report in-band, keep the server up
            error = api_error(exc, "the speech SSE stream")
            yield event({"type": "error", "error": {"message": error.message, "code": error.code}})
            return
        if timestamps is not None:
            try:
                yield event({"type": "speech.audio.timestamps", **await self._timestamps(run.handle, timestamps, None)})
            except Exception as exc:  # the audio is sent; say in-band why its times are not
                error = api_error(exc, "captioning the take")
                yield event({"type": "error", "error": {"message": f"The timestamps failed: {error.message}",
                                                        "code": error.code}})
        numbers: dict[str, Any] = dataclasses.asdict(last.metrics) if last is not None else {}
        frames = int(numbers.get("frames", 0))
        prompt_tokens = int(numbers.get("prompt_tokens", 0) or input_chars)
        yield event({"type": "speech.audio.done",
                     "usage": {"input_tokens": prompt_tokens, "output_tokens": frames,
                               "total_tokens": prompt_tokens + frames},
                     "metrics": {"ttfa_ms": numbers.get("ttfa_ms"), "rtf": numbers.get("rtf"),
                                 "frames": frames, "seed": run.handle.seed,
                                 "stop_reason": numbers.get("stop_reason"), "batch": numbers.get("batch"),
                                 "loudness": loudness or meter.result().as_dict(),
                                 "codes_sha256": codes_sha256(last.codes) if last is not None and last.codes is not None
                                 else None,
                                 "wall_ms": round((time.perf_counter() - started) * 1000, 1)}})


def _check_length(sent: str, limit: int) -> None:
    if len(sent) > limit:
        raise ApiError(400, f"`input` is {len(sent)} characters; the limit is {limit}. Split the text into several "
                            f"requests.", param="input", code="string_above_max_length")


def _leveled(audio: np.ndarray, level: tuple[float, float] | None) -> tuple[np.ndarray, dict]:
    """The collected take at `level` (target LUFS, ceiling dBTP; None: as made) and its loudness as the API
    reports it (with the gain and the levels before when it was normalised)."""
    if level is None:
        return audio, measure(audio, SAMPLE_RATE).as_dict()
    done = normalize(audio, SAMPLE_RATE, *level)
    return done.audio, {**done.after.as_dict(), "normalized": done.as_dict()}


def _loudness_headers(loudness: dict) -> dict[str, str]:
    values = {"X-Loudness-LUFS": loudness.get("lufs"), "X-True-Peak-dBTP": loudness.get("true_peak_dbtp"),
              "X-Loudness-Gain-dB": (loudness.get("normalized") or {}).get("gain_db")}
    return {name: f"{value:.2f}" for name, value in values.items() if value is not None}
