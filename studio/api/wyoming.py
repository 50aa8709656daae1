"""Home Assistant's local TTS: a Wyoming server (the `wyoming` package's own events and server classes) over the
studio's `StudioService`, so its takes batch with the page's and the API's and take their turns in the same
fair line.

    server = WyomingServer(service, "tcp://0.0.0.0:10200")   # app.py --wyoming tcp://0.0.0.0:10200
    server.start()                                           # its own thread and event loop
    ...
    server.stop()                                            # connections closed, their takes cancelled

What a connection may send, and what it gets:
* `describe` → `info`: one TTS program listing the voices a Wyoming client may use (the preset voices, the
  library's shared voices, and "default", the model's own voice) and the languages;
* `synthesize` → `audio-start`, `audio-chunk`s (PCM16, 24 kHz, mono) as the take is made, `audio-stop`; a text
  too long for one take goes through the long form, as on `/v1/audio/speech`;
* `synthesize-start`, `synthesize-chunk`s, `synthesize-stop` → each sentence is spoken as soon as it is complete
  (studio/takes/sentences.py), in order, as one gapless audio stream (`audio-start` … `audio-stop`), then
  `synthesize-stopped`. The next sentence's take starts while the current one is sent, so it is ready when the
  current one ends. The
  `synthesize` Home Assistant sends inside a stream, for servers that cannot stream, is ignored;
* a bad request (unknown voice, empty text, the line full) → an `error` event with a sentence, then this
  connection is closed, as wyoming-piper does: Home Assistant waits for `audio-stop` and would otherwise hang.
  A client that goes away cancels its takes. Other connections are never touched;
* an event whose header declares more data or payload than studio/api/wyoming_events.py allows is refused the same
  way before any of it is read, and a connection with no event for STREAM_IDLE_S while none of its takes runs
  hears why and is closed. Text is cut into sentences, and takes are checked, off the event loop;
* past MAX_CONNECTIONS_PER_ADDRESS connections open from one address, or MAX_CONNECTIONS in all, a new one
  hears why (`too-many-connections`) and is closed before it is read.

Every take is the Wyoming caller's (`WYOMING`): a caller of its own under the admission rule, with a visitor's
share (`--visitor-concurrency`, `--visitor-queue`) and a visitor's view of the voices, behind the owner. The
Wyoming protocol has no authentication: bind the port to the home network only.

Wyoming requests carry no sampling settings: every take uses the server's `params`. With a seed there, takes
are reproducible (sentence i of a stream uses seed + i, as the long take's segments do); without one each take
draws its own, as an API request without a seed does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlparse

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from engine.config import SAMPLE_RATE
from engine.types import SEED_LIMIT, SamplingParams
from studio.api.model import DEFAULT_VOICE
from studio.api.wyoming_events import BadEvent, read_event
from studio.audio.formats import to_pcm16
from studio.takes.admission import STREAM_IDLE_S, Caller
from studio.takes.failure import Failure
from studio.takes.order import Order, voice_named
from studio.takes.prepare import lookup_voice
from studio.takes.sentences import SentenceBuffer
from studio.takes.service import StudioService
from studio.takes.take import LoopTake, TakeHandle

log = logging.getLogger("higgs.wyoming")

WYOMING = Caller("wyoming")  # every Wyoming client's takes: one share, behind the owner
# The languages the model speaks well (Home Assistant offers a voice under each language it lists).
LANGUAGES = ["en", "zh"]
PROGRAM = "higgs-studio"
ATTRIBUTION = Attribution(name="Boson AI", url="https://huggingface.co/bosonai")
WIDTH, CHANNELS = 2, 1  # PCM16 mono
AHEAD = 2  # a stream's takes in flight: the one being sent and the next (a visitor's running share is 2)


class _Take(LoopTake):
    """One take of a connection streamed into its event loop."""

    def __init__(self, handle: TakeHandle, loop: asyncio.AbstractEventLoop):
        super().__init__(handle, loop, name="higgs-wyoming-take")

    async def audio(self) -> AsyncIterator[np.ndarray]:
        async for item in self.items():
            if isinstance(item, Exception):
                raise item
            if len(item.audio):
                yield item.audio


MAX_CONNECTIONS_PER_ADDRESS = 16  # one address's: Home Assistant speaks for every satellite from one address
MAX_CONNECTIONS = 64  # everyone's together; an idle one holds no thread, only a socket and a little memory


class WyomingServer:
    """The Wyoming endpoint of one `StudioService`: the voice list, the requests its takes are made from, and
    the server's thread and event loop."""

    def __init__(self, service: StudioService, uri: str, *, params: SamplingParams | None = None,
                 caller: Caller = WYOMING, idle_s: float = STREAM_IDLE_S):
        scheme = urlparse(uri).scheme
        if scheme not in ("tcp", "unix"):
            raise ValueError(f"The Wyoming address must be tcp://HOST:PORT (e.g. tcp://0.0.0.0:10200) or "
                             f"unix://PATH; got {uri!r}.")
        self.server = AsyncServer.from_uri(uri)  # ValueError with the package's own sentence for a bad one
        self.service, self.uri, self.caller, self.idle_s = service, uri, caller, idle_s
        self.params = params or SamplingParams()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[_Connection] = set()

    # ---------------------------------------------------------------- what clients see
    def voice_names(self) -> list[str]:
        """The voices this server offers, in order: the caller's voices (presets, shared), then the default."""
        return [v.name for v in self.service.list_voices(self.caller)] + [DEFAULT_VOICE]

    def info(self) -> Info:
        voices = [TtsVoice(name=v.name, attribution=ATTRIBUTION, installed=True, version=None, languages=LANGUAGES,
                           description=v.description or ("preset voice" if v.preset else "saved voice"))
                  for v in self.service.list_voices(self.caller)]
        voices.append(TtsVoice(name=DEFAULT_VOICE, attribution=ATTRIBUTION, installed=True, version=None,
                               languages=LANGUAGES, description="The model's own voice (no reference clip)"))
        program = TtsProgram(name=PROGRAM, attribution=ATTRIBUTION, installed=True, version=None,
                             description="Higgs Audio TTS through Higgs Studio", voices=voices,
                             supports_synthesize_streaming=True)
        return Info(tts=[program])

    def voice_of(self, voice: SynthesizeVoice | None) -> str | None:
        """The voice a request names as written, checked now (VoiceNotFound naming it for an unknown one), or
        None for the model's own voice. A request naming none gets the first voice listed."""
        name = voice.name if voice is not None and voice.name else self.voice_names()[0]
        lookup_voice(self.service, name, self.caller)
        return name if voice_named(name) else None

    def order(self, text: str, voice: str | None, index: int = 0) -> Order:
        params = self.params
        if params.seed is not None:
            params = params.with_seed((params.seed + index) % SEED_LIMIT)
        return Order(text=text, voice=voice, params=params, caller=self.caller, door="wyoming")

    def start_take(self, text: str, voice: str | None, index: int = 0) -> TakeHandle:
        """A take's handle, prepared now (ValueError with a sentence); a long text is one long take."""
        return self.service.start(self.order(text, voice, index))

    # ---------------------------------------------------------------- the thread and the loop
    def start(self, timeout: float = 30.0) -> None:
        """Listen (OSError when the address is taken) and serve on a thread of its own."""
        ready: dict = {}
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.server.start(self._connect))
            except BaseException as exc:
                ready["error"] = exc
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="higgs-wyoming", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise OSError(f"The Wyoming server did not start listening on {self.uri} in {timeout:g} s.")
        if "error" in ready:
            raise ready["error"]

    def stop(self, timeout: float = 10.0) -> None:
        """Close every connection (their takes are cancelled) and the listener, then end the thread."""
        loop = self._loop
        if loop is None or self._thread is None or not loop.is_running():
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        try:
            future.result(timeout)
        except Exception as exc:  # still stop the loop below
            log.warning("Wyoming shutdown: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)

    async def _shutdown(self) -> None:
        await self.server.stop()
        for connection in list(self._connections):
            await connection.disconnect()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:  # the connections' tasks end at their next step; let them, so none is left pending
            await asyncio.wait(others, timeout=5)

    def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Connection:
        connection = _Connection(self, reader, writer)
        self._connections.add(connection)
        return connection


class _Connection(AsyncEventHandler):
    """One client. Reading goes on while audio is sent (so a disconnect is seen at once and text keeps
    arriving); the answers of one connection are sent one after the other, in the order asked."""

    def __init__(self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(reader, writer)
        self.server = server
        peer = writer.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) and peer else None  # None: a unix socket, one user
        self._sentences: asyncio.Queue | None = None  # the open text stream's sentences (None: no stream open)
        self._buffer: SentenceBuffer | None = None
        self._last: asyncio.Task | None = None  # the latest answer; each waits for the one before it
        self._tasks: set[asyncio.Task] = set()
        self._takes: set[_Take] = set()

    async def run(self) -> None:
        """The package's loop (`AsyncEventHandler.run`) over studio/api/wyoming_events.py `read_event`, which checks
        an event's declared sizes before reading it; a refused event, or `idle_s` with no event while no take
        of this connection runs, is told to the client and ends the connection; so is a connection past the
        connection caps, before anything is read."""
        self._is_running = True
        try:
            if refusal := self._over_caps():
                with contextlib.suppress(ConnectionError, OSError):
                    await self.write_event(Error(text=refusal, code="too-many-connections").event())
                return
            while self._is_running:
                try:
                    event = await read_event(self.reader, wait_s=self.server.idle_s)
                except asyncio.TimeoutError:
                    if self._takes:  # an answer is being made or sent: the client need not speak meanwhile
                        continue
                    with contextlib.suppress(ConnectionError, OSError):
                        await self.write_event(Error(text=f"Nothing was sent for {self.server.idle_s:g} s, so the "
                                                          "connection is closed.", code="idle-timeout").event())
                    break
                except BadEvent as exc:
                    await self._fail(exc)
                    break
                if event is None or not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            self.writer.close()

    def _over_caps(self) -> str | None:
        """Why this connection is one too many (None: it is not), counting the connections open now."""
        others = [c for c in self.server._connections if c is not self]
        if len(others) >= MAX_CONNECTIONS:
            return (f"The studio has {len(others)} Wyoming connections open, as many as it serves at once; "
                    "try again shortly.")
        mine = sum(c.address == self.address for c in others)
        if self.address is not None and mine >= MAX_CONNECTIONS_PER_ADDRESS:
            return (f"This address already has {mine} Wyoming connections open; one address may have "
                    f"{MAX_CONNECTIONS_PER_ADDRESS}. Close one first.")
        return None

    async def handle_event(self, event: Event) -> bool:
        try:
            return await self._handle(event)
        except Exception as exc:  # one client's bad request: it hears why; the server goes on
            await self._fail(exc)
            return False

    async def _handle(self, event: Event) -> bool:
        server = self.server
        if Describe.is_type(event.type):
            await self.write_event(server.info().event())
        elif Synthesize.is_type(event.type):
            if self._sentences is None:  # inside a stream it repeats the streamed text for older servers
                synthesize = Synthesize.from_event(event)
                handle = await asyncio.to_thread(server.start_take, synthesize.text, server.voice_of(synthesize.voice))
                take = self._begin(handle)
                self._answer(lambda: self._speak(_one(take)))
        elif SynthesizeStart.is_type(event.type):
            voice_id = server.voice_of(SynthesizeStart.from_event(event).voice)
            if self._buffer is not None:  # a new stream ends the open one: what it has is spoken first
                self._end_stream()
            self._sentences, self._buffer = asyncio.Queue(), SentenceBuffer()
            sentences = self._sentences
            self._answer(lambda: self._speak_stream(sentences, voice_id))
        elif SynthesizeChunk.is_type(event.type):
            buffer, text = self._open_buffer("synthesize-chunk"), SynthesizeChunk.from_event(event).text
            for sentence in await asyncio.to_thread(buffer.add, text):
                self._sentences.put_nowait(sentence)
        elif SynthesizeStop.is_type(event.type):
            self._open_buffer("synthesize-stop")
            self._end_stream()
        return True  # other events are not for a TTS server: ignored, as the protocol asks

    def _end_stream(self) -> None:
        for sentence in self._buffer.finish():
            self._sentences.put_nowait(sentence)
        self._sentences.put_nowait(None)
        self._sentences = self._buffer = None

    def _open_buffer(self, what: str) -> SentenceBuffer:
        if self._buffer is None:
            raise ValueError(f"Got {what} with no text stream open; send synthesize-start first.")
        return self._buffer

    def _begin(self, handle: TakeHandle) -> _Take:
        take = _Take(handle, asyncio.get_running_loop())
        self._takes.add(take)
        return take

    def _answer(self, make: Callable) -> None:
        """Run the coroutine `make()` after the answer before it; a failure is told to the client."""
        before = self._last

        async def answer() -> None:
            if before is not None:
                await asyncio.wait({before})
            try:
                await make()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._fail(exc)
                await self.stop()

        self._last = task = asyncio.create_task(answer())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _speak(self, takes: AsyncIterator[_Take]) -> None:
        """`takes` as one audio stream: each take's chunks as they come, the takes in order."""
        sent = 0
        await self.write_event(AudioStart(rate=SAMPLE_RATE, width=WIDTH, channels=CHANNELS, timestamp=0).event())
        async for take in takes:
            try:
                async for audio in take.audio():
                    pcm = to_pcm16(audio)
                    await self.write_event(AudioChunk(rate=SAMPLE_RATE, width=WIDTH, channels=CHANNELS,
                                                      audio=pcm.tobytes(), timestamp=_ms(sent)).event())
                    sent += len(pcm)
            finally:
                take.cancel()  # a no-op once the take has finished; stops it when the client has gone
                self._takes.discard(take)
        await self.write_event(AudioStop(timestamp=_ms(sent)).event())

    async def _speak_stream(self, sentences: asyncio.Queue, voice_id: str | None) -> None:
        """The stream's sentences as one audio stream, then `synthesize-stopped`. Up to `AHEAD` takes run at
        once, so the next sentence is made while the one before is sent: no gap between them."""
        room = asyncio.Semaphore(AHEAD)
        started: asyncio.Queue = asyncio.Queue()  # takes in sentence order, then None (or the failure)

        async def starter() -> None:
            try:
                index = 0
                while (sentence := await sentences.get()) is not None:
                    await room.acquire()
                    handle = await asyncio.to_thread(self.server.start_take, sentence, voice_id, index)
                    started.put_nowait(self._begin(handle))
                    index += 1
                started.put_nowait(None)
            except Exception as exc:  # a bad sentence, the line full: heard after the audio before it
                started.put_nowait(exc)

        async def in_order() -> AsyncIterator[_Take]:
            while (take := await started.get()) is not None:
                if isinstance(take, Exception):
                    raise take
                yield take
                room.release()

        feed = asyncio.create_task(starter())
        try:
            await self._speak(in_order())
            await self.write_event(SynthesizeStopped().event())
        finally:
            feed.cancel()

    async def _fail(self, exc: Exception) -> None:
        if isinstance(exc, (ConnectionError, OSError)) and not isinstance(exc, TimeoutError):  # the client left
            return
        failure = Failure.of(exc, "Wyoming request")
        code = {"user": "bad-request", "busy": "busy"}.get(failure.kind, "failed")
        try:
            await self.write_event(Error(text=failure.message, code=code).event())
        except (ConnectionError, OSError):
            pass

    async def disconnect(self) -> None:
        """The client went away (or the server stops): its takes are cancelled, waiting or running."""
        for take in list(self._takes):
            take.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.server._connections.discard(self)


async def _one(take: _Take) -> AsyncIterator[_Take]:
    yield take


def _ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


__all__ = ["LANGUAGES", "MAX_CONNECTIONS", "MAX_CONNECTIONS_PER_ADDRESS", "WYOMING", "WyomingServer"]
