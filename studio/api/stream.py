"""`WS /v1/audio/speech/stream`: text in as an LLM writes it, speech out as each sentence completes (docs/API.md,
"Streaming text in").

    → {"voice": "Narrator", "style": "...", "seed": 7, "response_format": "pcm", "timestamps": false}   config
    ← {"type": "ready", "sample_rate": 24000, "format": "pcm", "seed": 7}      (+ "warnings": [...] if any)
    → {"text": "Hello th"}  {"text": "ere. How"}  …  {"flush": true}  …  {"end": true}
    ← {"type": "sentence", "index": 0, "text": "Hello there.", "offset": 0}   before that sentence's audio
                                                      (+ "seed", "wer", "tries" with "listen": true)
    ← binary frames: PCM16 LE mono 24 kHz (or Ogg Opus pages)
    ← {"type": "sentence_end", "index": 0, "offset": 31200}                  with "timestamps": true / "sentence"
    ← {"type": "words", "index": 0, "words": [{"word", "start", "end", "estimated"}], ...}  with "word"
    ← {"type": "done", "samples": 96000, "seconds": 4.0, "sentences": 3, "seed": 7, "ttfa_ms": 81.5}
    ← {"type": "error", "message": "a sentence", "code": "..."}              bad message: the stream goes on

The stream is one open long take (engine/longtake.py `more=`, studio/takes/run.py, an open plan): sentences
are found by the long form's rules as the text arrives (studio/takes/sentences.py), each is planned and generated as
soon as it is complete, from the same anchor as a long take's segments (the first sentence's voice, or the
saved voice), with seed + i and the planned pause between them. So the audio is exactly the long take of those
sentences; when text comes faster than speech, each sentence is generated while the one before is played.

`"listen": true` has the studio's ASR check each sentence and make it again with the next seed when heard wrong
(studio/audio/listen.py): each sentence is then made whole before it streams, so audio starts a sentence later.
`"timestamps": "word"` times each sentence's words (seconds from the stream's first sample) by the studio's
ASR, in the stream's turn in the GPU line, once the sentence's audio is sent, or estimates them from character
share and says so (`estimated`, `note`); every `words` event comes before `done`.

Who may connect: the key rule of `/v1` (`Authorization: Bearer <key>` when the studio has one), or the page's
token (studio/views/live.py) in the config's `token`, as browsers cannot set headers on a WebSocket. A keyless
studio refuses other sites' pages (the cross-site rule, docs/SECURITY.md). Every stream takes its turns as the
caller `WEBSOCKET` (an owner's caller of its own, so the page's takes and the streams alternate), a public
page's visitor as that visitor; a stream waiting for text holds no slot. Closing the socket cancels the take
at the engine's next step.

What one address may hold (studio/takes/admission.py): MAX_OPEN_STREAMS_PER_VISITOR streams open, waiting for text or
speaking (the key holder's count only towards MAX_OPEN_STREAMS); one more is told why and closed with 1013 (try
again later). A stream starts its take, and the take's threads, with its first text, and one with nothing sent
either way for STREAM_IDLE_S is closed with 1001 and the reason. Each message is read off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocket, WebSocketDisconnect

from engine.config import SAMPLE_RATE
from engine.types import DEFAULT_REPEAT_GUARD, SamplingParams
from studio.api.access import Access, visitor
from studio.api.model import validation_message
from studio.api.ws_frames import (
    MAX_MESSAGE_CHARS,
    POLICY_VIOLATION,
    TRY_AGAIN_LATER,
    close_idle,
    receive_json,
    send_error,
    send_event,
)
from studio.audio.captions import captions
from studio.audio.formats import StreamEncoder, to_pcm16
from studio.takes.admission import STREAM_IDLE_S, Caller, OpenStreams, Refused
from studio.takes.gpu_queue import ServiceBusy, ServiceClosed
from studio.takes.limits import MAX_INPUT_CHARS
from studio.takes.order import Order
from studio.takes.sentences import SentenceFeed
from studio.takes.take import LoopTake

log = logging.getLogger("higgs.ws")

ROUTE = "/v1/audio/speech/stream"
WEBSOCKET = Caller("websocket", owner=True)  # the key holder's streams: one share beside the page's takes


class StreamConfig(BaseModel):
    """The first message: the voice, style and sampling of the whole stream."""

    model_config = ConfigDict(extra="forbid")

    voice: str | None = None  # a saved voice (id or name), an alias such as "alloy", or "default"
    style: str | None = None  # a style preset name or a tag prefix
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_frames: int | None = None  # per sentence
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD
    normalize: bool = True  # numbers, dates, units … as words (English; engine/normalize.py)
    language: str = "auto"  # "en", "fr", …: the sentence rules and whether to normalise ("auto": by the text)
    response_format: Literal["pcm", "opus"] = "pcm"
    # `sentence_end` events when a sentence's last sample has been sent (true or "sentence"); "word" adds a `words`
    # event per sentence (the studio's ASR, or estimated)
    timestamps: bool | Literal["sentence", "word"] = False
    listen: bool = False  # check each sentence with the studio's ASR, make it again when heard wrong
    token: str | None = None  # the page's token (studio/views/live.py) when no Authorization header can be sent


class SpeechStream:
    """The route's handler: who the socket is, its config, then the text in and the take out."""

    def __init__(self, service, access: Access, *, page_tokens: Callable[[str | None], bool] | None = None,
                 max_chars: int = MAX_INPUT_CHARS, transcriber=None, listener=None,
                 streams: OpenStreams | None = None, idle_s: float = STREAM_IDLE_S):
        self.service, self.access, self.page_tokens, self.max_chars = service, access, page_tokens, max_chars
        self.streams = streams or OpenStreams()  # the open streams, per address
        self.idle_s = idle_s
        self.transcriber = transcriber  # word times for `"timestamps": "word"` (studio/audio/asr.py); None: estimated
        self.listener = listener  # `"listen": true` (studio/audio/listen.py; register's is off, and says so, without ASR)

    async def __call__(self, ws: WebSocket) -> None:
        refusal = self.access.cross_site_refusal(ws.headers.get("origin"), ws.headers.get("host"))
        await ws.accept()
        if refusal is not None:
            await send_error(ws, refusal, "cross_site_request")
            await ws.close(POLICY_VIOLATION)
            return
        keyed = self.access.bearer_ok(ws.headers.get("authorization"))
        # The key holder's streams count only towards the total; every other one towards its address's share.
        counted = WEBSOCKET if keyed and self.access.api_key is not None else visitor(
            ws.headers, ws.client.host if ws.client else None, fallback="")
        try:
            self.streams.open(counted)
        except Refused as exc:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):  # gone already: nobody to tell
                await send_error(ws, str(exc), "too_many_streams")
                await ws.close(TRY_AGAIN_LATER, "Too many streams open from this address" if exc.visitor else
                               "The studio has as many streams open as it serves")
            return
        try:
            await self._serve(ws, keyed)
        finally:
            self.streams.close(counted)

    async def _serve(self, ws: WebSocket, keyed: bool) -> None:
        try:
            while True:  # until a config is accepted: a bad one is answered and another may follow
                try:
                    config = await asyncio.wait_for(self._config(ws), self.idle_s)
                except asyncio.TimeoutError:
                    await close_idle(ws, self.idle_s)
                    return
                if config is None:
                    continue
                page = self.page_tokens is not None and self.page_tokens(config.token)
                if not (keyed or page):
                    await send_error(ws, "Missing or wrong API key: send `Authorization: Bearer <key>` (or the page's "
                                         "token in the config's `token`).", "invalid_api_key")
                    await ws.close(POLICY_VIOLATION)
                    return
                try:
                    feed, handle, notes = await run_in_threadpool(self._start, config, keyed, ws)
                except ValueError as exc:
                    await send_error(ws, str(exc), "bad_request")
                    continue
                break
            words = self.service.transcriber_for(self.transcriber, handle.order.caller)  # None: estimated
            await _Session(ws, feed, handle, config, notes=notes, words=words, idle_s=self.idle_s).run()
        except WebSocketDisconnect:
            return
        except Exception as exc:  # one bad stream never takes the server down
            log.exception("speech stream failed")
            try:
                await send_error(ws, *_describe(exc))
                await ws.close(1011)
            except Exception:  # the socket is already gone: nobody left to tell
                pass

    async def _config(self, ws: WebSocket) -> StreamConfig | None:
        message = await receive_json(ws)
        if message is None:
            return None
        try:
            return StreamConfig.model_validate(message)
        except ValidationError as exc:
            await send_error(ws, validation_message(exc).replace("Invalid request", "Invalid config"), "bad_config")
            return None

    def _start(self, config: StreamConfig, keyed: bool, ws: WebSocket):
        """The stream's feed, its take's handle and the notes for `ready`, checked now (ValueError with a
        sentence)."""
        caller, limit = WEBSOCKET, self.max_chars
        fields = {k: v for k, v in config.model_dump().items() if k in
                  ("temperature", "top_p", "top_k", "seed", "max_frames", "repeat_guard") and v is not None}
        fields["repeat_guard"] = config.repeat_guard
        params = SamplingParams.of(**fields)
        if self.access.api_key is not None and self.access.public_page and not keyed:  # a public page's visitor
            caller = visitor(ws.headers, ws.client.host if ws.client else None, fallback=config.token or "")
            limit = self.service.limits.public_max_chars
        order = Order(text="", voice=config.voice, style=config.style, params=params, caller=caller,
                      listen=bool(config.listen), door="ws")
        feed = SentenceFeed(normalize=config.normalize, language=config.language, limit=limit)
        handle = self.service.start_open(order, feed, listener=self.listener)
        return feed, handle, list(handle.warnings)


class _Session:
    """One accepted stream: a reader of the client's messages, a sender of the take and an idle watch, side by
    side. The take (and its threads) starts with the first message that reaches the feed."""

    def __init__(self, ws: WebSocket, feed: SentenceFeed, handle, config: StreamConfig, *, notes=(), words=None,
                 idle_s: float = STREAM_IDLE_S):
        self.ws, self.feed, self.handle, self.config = ws, feed, handle, config
        self.notes, self.words = list(notes), words  # words: the transcriber for word times (None: estimated)
        self.word_times = config.timestamps == "word"
        self.sentences = 0
        self.timing: list[asyncio.Task] = []  # the sentences' word times being made, in order
        self.begun = asyncio.Event()  # the first text has come: the take runs
        self.idle_s, self.active = idle_s, time.monotonic()  # active: the latest message in or audio out
        self.finished = 0  # the take's segments whose audio is all sent

    async def run(self) -> None:
        await send_event(self.ws, {"type": "ready", "sample_rate": SAMPLE_RATE, "format": self.config.response_format,
                                   "seed": self.handle.seed, **({"warnings": self.notes} if self.notes else {})})
        reader, idle, speaker = tasks = [asyncio.create_task(c) for c in (self._read(), self._idle(), self._speak())]
        for task in tasks:
            task.add_done_callback(_retrieved)
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if speaker in done:
                await speaker  # what the take raised, if anything
                await self.ws.close()  # one stream, one take: after `done` (or its error) the socket closes
            elif idle in done:
                await close_idle(self.ws, self.idle_s)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client went away; the finally below stops the take
        finally:
            self.handle.cancel.set()  # a no-op once finished; else the engine stops at its next step
            for task in (*tasks, *self.timing):
                task.cancel()

    async def _speak(self) -> None:
        await self.begun.wait()  # until then the stream holds no thread: its take has not started
        await self._send_take(LoopTake(self.handle, asyncio.get_running_loop(), name="higgs-ws-take"))

    async def _idle(self) -> None:
        """Returns once nothing has come in or gone out for `idle_s` while nothing is owed: no sentence waits
        to be spoken and the text has not ended (a take in the line or being made is not idle)."""
        while True:
            await asyncio.sleep(max(0.0, self.active + self.idle_s - time.monotonic()))
            if time.monotonic() - self.active >= self.idle_s:
                if not (self.feed.ended or self.feed.planned > self.finished or self.timing):
                    return
                self.active = time.monotonic()

    async def _read(self) -> None:
        """The client's messages, read here and applied off the event loop by `_apply`; a close cancels the take
        (after `end` too: the reader goes on to see it). At most MAX_MESSAGE_CHARS of text wait to be applied:
        past that the reader waits, so a client sending faster than its text is applied is held back by TCP."""
        inbox: asyncio.Queue = asyncio.Queue()
        applier = asyncio.create_task(self._apply(inbox))
        applier.add_done_callback(_retrieved)
        self._waiting_chars, self._drained = 0, asyncio.Event()
        try:
            while True:
                message = await receive_json(self.ws)
                self.active = time.monotonic()
                if message is None:
                    continue
                size = len(message["text"]) if isinstance(message.get("text"), str) else 0
                while self._waiting_chars and self._waiting_chars + size > MAX_MESSAGE_CHARS:
                    self._drained.clear()
                    await self._drained.wait()
                self._waiting_chars += size
                inbox.put_nowait((message, size))
        except WebSocketDisconnect:
            self.handle.cancel.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a send failed: the client has gone
            log.debug("websocket reader ended: %s", exc)
            self.handle.cancel.set()
        finally:
            applier.cancel()

    async def _apply(self, inbox: asyncio.Queue) -> None:
        """Apply the messages in order, off the event loop: every message that has arrived by then in one trip
        to a worker thread (a flood of tiny pieces costs a few trips, not one each); a bad one is answered and
        the stream goes on."""
        while True:
            batch = [await inbox.get()]
            while not inbox.empty():
                batch.append(inbox.get_nowait())
            refused = await run_in_threadpool(self._take_messages, [message for message, _ in batch])
            self._waiting_chars -= sum(size for _, size in batch)
            self._drained.set()
            for reason in refused:
                await send_error(self.ws, reason, "bad_message")
            if len(refused) < len(batch):
                self.begun.set()

    def _take_messages(self, messages: list[dict]) -> list[str]:
        """Apply each message in order; the sentences of those refused (ValueError)."""
        refused = []
        for message in messages:
            try:
                self._take_message(message)
            except ValueError as exc:
                refused.append(str(exc))
        return refused

    def _take_message(self, message: dict) -> None:
        """Apply one message (ValueError with a sentence for a bad one)."""
        unknown = ", ".join(sorted(set(message) - {"text", "flush", "end"}))
        if not message or unknown:
            named = f" ({unknown[:200]})" if unknown else ""
            raise ValueError(f"Unknown message{named}: send {{\"text\": \"...\"}}, {{\"flush\": true}} or "
                             "{\"end\": true}.")
        if "text" in message:
            if not isinstance(message["text"], str):
                raise ValueError("`text` must be a string.")
            self.feed.add(message["text"])
        if message.get("flush") is True:
            self.feed.flush()
        if message.get("end") is True:
            self.feed.end()

    async def _send_take(self, source: LoopTake) -> None:
        encoder = None
        if self.config.response_format == "opus":
            encoder = await run_in_threadpool(StreamEncoder, "opus", SAMPLE_RATE)
        sent, current, ended, ending, take = 0, -1, -1, None, None
        heard: list[np.ndarray] = []  # the current sentence's audio, for its word times
        try:
            async for item in source.items():
                if isinstance(item, Exception):
                    await send_error(self.ws, *_describe(item))
                    return
                take, piece = item
                segment = take.segments[piece.segment]
                if piece.segment != current:  # the first samples of a new sentence
                    current, start, heard = piece.segment, sent, []
                    self.sentences += 1
                    await send_event(self.ws, {"type": "sentence", "index": current,
                                               "text": segment.source or segment.text, "offset": sent,
                                               **_listened(take, current)})
                pcm = to_pcm16(piece.audio)
                if self.word_times:
                    heard.append(np.asarray(piece.audio, dtype=np.float32))
                if self.config.timestamps and piece.done > piece.segment > ended:  # its last sample is here
                    ended = piece.segment
                    ending = (piece.segment, sent + len(pcm))  # an open take sends the pause with the next one
                    if self.word_times:
                        self._time_words(ended, segment.source or segment.text, start, np.concatenate(heard))
                data = pcm.tobytes()
                if encoder is not None and data:
                    data = await run_in_threadpool(encoder.feed, data)
                if data:
                    await self.ws.send_bytes(data)
                sent += len(pcm)
                self.active, self.finished = time.monotonic(), piece.done
                if ending is not None:
                    await send_event(self.ws, {"type": "sentence_end", "index": ending[0], "offset": ending[1]})
                    ending = None
                await self._send_words(wait=False)
            if encoder is not None:
                tail = await run_in_threadpool(encoder.close)
                encoder = None
                if tail:
                    await self.ws.send_bytes(tail)
            await self._send_words(wait=True)
            ttfa = take.ttfa_ms if take is not None else None
            await send_event(self.ws, {"type": "done", "samples": sent, "seconds": round(sent / SAMPLE_RATE, 3),
                                       "sentences": self.sentences, "seed": self.handle.seed,
                                       "ttfa_ms": None if ttfa is None else round(ttfa, 1)})
        finally:
            if encoder is not None:
                await run_in_threadpool(encoder.kill)


    def _time_words(self, index: int, text: str, start: int, audio: np.ndarray) -> None:
        """Time sentence `index`'s words (its audio began at sample `start`) in a worker thread: through the
        line's `run_exclusive` when the ASR is on, which waits for a free slot."""
        def timed() -> dict:
            found = captions([text], [(0, len(audio))], len(audio), level="word", audio=audio,
                             transcriber=self.words)
            shift = start / SAMPLE_RATE
            return {"type": "words", "index": index, "estimated": found.estimated, "note": found.note,
                    "words": [{"word": c.text, "start": round(c.start + shift, 3), "end": round(c.end + shift, 3),
                               "estimated": c.estimated} for c in found.cues]}
        self.timing.append(asyncio.ensure_future(run_in_threadpool(timed)))

    async def _send_words(self, *, wait: bool) -> None:
        """Send the sentences' word times that are ready, in order (all of them with `wait`)."""
        while self.timing and (wait or self.timing[0].done()):
            task = self.timing.pop(0)
            try:
                event = await task
            except Exception as exc:  # the audio is sent; say in-band why its times are not
                log.exception("timing a sentence's words failed")
                event = {"type": "error", "message": f"word times failed: {type(exc).__name__}: {exc}",
                         "code": "failed"}
            await send_event(self.ws, event)


def _listened(take, index: int) -> dict:
    """What a listening take knows of sentence `index` when it starts to stream (it was made whole first):
    the kept seed, its WER and how many tries it took; {} for a take that does not listen."""
    if take.check is None or index >= len(take.takes) or take.takes[index] is None:
        return {}
    kept = take.takes[index]
    return {"seed": take.seeds[index], "wer": None if kept.wer is None else round(kept.wer, 4),
            "tries": len(kept.attempts)}


def _retrieved(task: asyncio.Task) -> None:
    """What a stream's task raised once the stream has ended is no one's concern: the client has gone."""
    if not task.cancelled():
        task.exception()


def _describe(exc: Exception) -> tuple[str, str]:
    if isinstance(exc, (ServiceBusy, ServiceClosed)):
        return str(exc), "busy"
    if isinstance(exc, ValueError):
        return str(exc), "bad_request"
    log.error("speech stream failed", exc_info=exc)
    return "The take failed; the server's log says why.", "failed"


__all__ = ["ROUTE", "WEBSOCKET", "SpeechStream", "StreamConfig"]
