"""The Wyoming server (studio/api/wyoming.py) driven by the `wyoming` package's own client over TCP on localhost,
against a StudioService on the demo engine in this process: the voice list, one-shot and streamed takes
(their samples equal to the same takes made through the service with the same seeds), two clients at once,
bad requests, and a client that goes away."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from engine.config import SAMPLE_RATE
from engine.types import SamplingParams
from studio.audio.formats import to_pcm16
from studio.takes.sentences import SentenceBuffer
from studio.takes.service import StudioService, Order
from studio.voices import VoiceLibrary
from studio.api.wyoming import LANGUAGES, WYOMING, WyomingServer
from tests.fakes import add_voices
from tests.studio_server import free_port

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

SEED = 7
PARAMS = SamplingParams.of(seed=SEED, max_frames=30)  # short takes: the demo's random weights run to the cap
WAIT = 120.0  # seconds any one event may take on a busy 2-core machine


@pytest.fixture(scope="module")
def studio(tmp_path_factory, shared_engine):
    """A service on the demo engine with one shared and one private saved voice, and a Wyoming server on it."""
    library = VoiceLibrary(tmp_path_factory.mktemp("voices"))
    service = StudioService(shared_engine(), library)
    add_voices(library, service, (("Narrator", 140.0), ("Secret", 220.0)))
    library.update("Narrator", shared=True)  # "Secret" stays the owner's: a Wyoming client may not use it
    port = free_port()
    server = WyomingServer(service, f"tcp://127.0.0.1:{port}", params=PARAMS)
    server.start()
    yield service, server, port
    server.stop()
    service.close()


def client(port: int):
    return AsyncTcpClient("127.0.0.1", port)


async def answer(c, last: str = AudioStop().event().type) -> list:
    """Events up to and including `last` (or an error); fails if the server closes first."""
    events = []
    while True:
        event = await asyncio.wait_for(c.read_event(), WAIT)
        assert event is not None, f"the server closed the connection after {[e.type for e in events]}"
        events.append(event)
        if event.type == last or Error.is_type(event.type):
            return events


def pcm_of(events) -> np.ndarray:
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert all((c.rate, c.width, c.channels) == (SAMPLE_RATE, 2, 1) for c in chunks)
    return np.frombuffer(b"".join(c.audio for c in chunks), "<i2")


def alone(service, server, text: str, voice_id=None, index: int = 0) -> np.ndarray:
    """The same take made straight through the service (sentence `index` of a stream has seed 7 + index): what
    the Wyoming answer must equal."""
    request = Order(text=text, voice=voice_id, params=PARAMS.with_seed(SEED + index), caller=WYOMING)
    return to_pcm16(service.synthesize(request).audio)


def speak(port: int, text: str, voice: str | None = None) -> list:
    async def run():
        async with client(port) as c:
            await c.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice) if voice else None).event())
            return await answer(c)
    return asyncio.run(run())


# ------------------------------------------------------------------------------------------ sentences
def test_sentences_are_given_out_once_complete_and_never_cut_at_an_abbreviation_or_a_decimal():
    buffer = SentenceBuffer()
    assert buffer.add("Dr. Smith paid 3.") == []
    assert buffer.add("5 dollars. He") == ["Dr. Smith paid 3.5 dollars."]  # complete: the next one has begun
    assert buffer.add(" left") == []
    assert buffer.finish() == ["He left"]
    assert SentenceBuffer().finish() == []
    with pytest.raises(ValueError, match="characters"):
        SentenceBuffer(limit=10).add("x" * 11)


def test_only_tcp_or_unix_addresses_are_served_and_the_app_says_why_it_cannot():
    import socket

    import app

    with pytest.raises(ValueError, match="tcp://"):
        WyomingServer(None, "stdio://")
    with pytest.raises(ValueError, match="port"):
        WyomingServer(None, "tcp://0.0.0.0")
    with pytest.raises(SystemExit, match="Cannot serve Wyoming at stdio://"):
        app.start_wyoming("stdio://", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit, match="Pick another address"):
            app.start_wyoming(f"tcp://127.0.0.1:{taken.getsockname()[1]}", None)
    assert app.start_wyoming(None, None) is None


# ------------------------------------------------------------------------------------------ the protocol
def test_describe_lists_the_shared_voices_the_default_and_the_languages(studio):
    _, _, port = studio

    async def run():
        async with client(port) as c:
            await c.write_event(Describe().event())
            return await answer(c, "info")
    info = Info.from_event(asyncio.run(run())[-1])
    (program,) = info.tts
    assert program.supports_synthesize_streaming
    assert [v.name for v in program.voices] == ["Narrator", "default"]  # never the owner's private "Secret"
    assert all(set(LANGUAGES) <= set(v.languages) for v in program.voices) and {"en", "zh"} <= set(LANGUAGES)


@pytest.mark.parametrize("voice", [None, "Narrator", "default"])
def test_synthesize_streams_the_takes_samples(studio, voice):
    service, server, port = studio
    text = "The kettle is on."
    events = speak(port, text, voice)
    assert AudioStart.is_type(events[0].type) and AudioStop.is_type(events[-1].type)
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (SAMPLE_RATE, 2, 1)
    chunks = [e for e in events if AudioChunk.is_type(e.type)]
    assert len(chunks) > 1  # sent as the take is made, not as one piece at its end
    voice_id = None if voice == "default" else service.resolve_voice("Narrator").id  # none named: the first
    expected = alone(service, server, text, voice_id)
    assert expected.size and np.array_equal(pcm_of(events), expected)


def test_a_text_longer_than_one_take_is_spoken_as_the_long_form(studio):
    from studio.takes.prepare import is_long

    service, _, port = studio
    text = "The tide came in over the flats, slow and grey, and the birds lifted off the sand. " * 6
    assert is_long(text)
    request = Order(text=text, params=PARAMS, caller=WYOMING)
    expected = to_pcm16(np.concatenate([c.audio for c in service.stream(request)]))
    events = speak(port, text, "default")
    assert [e.type for e in events][::len(events) - 1] == ["audio-start", "audio-stop"]
    assert expected.size and np.array_equal(pcm_of(events), expected)


def test_the_streaming_form_speaks_each_sentence_as_it_completes_gapless_and_in_order(studio):
    service, server, port = studio
    reply = "Hello there. The lights are off now. Is there anything else I can do for you this evening?"
    pieces, i, n = [], 0, 3
    while i < len(reply):  # an LLM's pace: 3-7 characters every 40 ms
        pieces.append(reply[i:i + n])
        i, n = i + n, 3 + (n + 1) % 5
    buffer, completes = SentenceBuffer(), None
    for k, piece in enumerate(pieces):
        if buffer.add(piece) and completes is None:
            completes = k  # the piece after which the first sentence is known to be complete
    sentences = ["Hello there.", "The lights are off now.", "Is there anything else I can do for you this evening?"]
    assert buffer.finish() == sentences[-1:]  # the pieces gave out the others one by one

    async def run():
        async with client(port) as c:
            sent_at = {}

            async def write():
                await c.write_event(SynthesizeStart(voice=SynthesizeVoice(name="Narrator")).event())
                for k, piece in enumerate(pieces):
                    await c.write_event(SynthesizeChunk(text=piece).event())
                    sent_at[k] = time.perf_counter()
                    await asyncio.sleep(0.04)
                await c.write_event(Synthesize(text=reply).event())  # what Home Assistant adds for old servers
                await c.write_event(SynthesizeStop().event())

            writer = asyncio.create_task(write())
            t0 = time.perf_counter()
            events, first_audio, late = [], None, 0.0
            while not events or not SynthesizeStopped.is_type(events[-1].type):
                event = await asyncio.wait_for(c.read_event(), WAIT)
                assert event is not None and not Error.is_type(event.type), event
                if AudioChunk.is_type(event.type):
                    first_audio = first_audio or time.perf_counter()
                    # how far this chunk came after a player started at the first one would have needed it
                    late = max(late, time.perf_counter() - first_audio - len(pcm_of(events)) / SAMPLE_RATE)
                events.append(event)
            await writer
            assert first_audio < sent_at[len(pieces) - 1], "no audio before the whole text had come"
            return events, first_audio - t0, first_audio - sent_at[completes], late

    events, from_start, from_sentence, late = asyncio.run(run())
    print(f"\nWyoming streaming: first audio-chunk {1e3 * from_sentence:.0f} ms after the chunk completing the "
          f"first sentence ({1e3 * from_start:.0f} ms after synthesize-start); a player started at the first "
          f"chunk waits at most {1e3 * late:.0f} ms")
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
    assert types.count("audio-start") == 1 and types.count("audio-stop") == 1  # one stream: no gap between
    voice_id = service.resolve_voice("Narrator").id
    expected = np.concatenate([alone(service, server, s, voice_id, i) for i, s in enumerate(sentences)])
    assert np.array_equal(pcm_of(events), expected)  # every sentence, in order, with seed 7 + its index
    assert from_sentence < 5.0  # Voice PE satellites give up after 5 s without audio
    assert late < 0.5  # the next sentence is made while the one before plays: no audible gap between them


def test_two_clients_at_once_both_get_their_takes(studio):
    service, server, port = studio
    texts = ["Good morning.", "The door is locked."]

    async def one(text):
        async with client(port) as c:
            await c.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="default")).event())
            return await answer(c)

    async def both():
        return await asyncio.gather(*(one(t) for t in texts))
    results = asyncio.run(both())
    for text, events in zip(texts, results):
        assert np.array_equal(pcm_of(events), alone(service, server, text))


@pytest.mark.parametrize("event, says", [
    (Synthesize(text="Hello.", voice=SynthesizeVoice(name="Nobody")), "Nobody"),
    (Synthesize(text="Hello.", voice=SynthesizeVoice(name="Secret")), "Secret"),  # the owner's own voice
    (Synthesize(text="   "), "empty"),
    (SynthesizeStart(voice=SynthesizeVoice(name="Nobody")), "Nobody"),
    (SynthesizeChunk(text="Hi."), "synthesize-start"),
])
def test_a_bad_request_gets_an_error_and_the_server_keeps_serving(studio, event, says):
    service, server, port = studio

    async def run():
        async with client(port) as c:
            await c.write_event(event.event())
            events = await answer(c)
            closed = await asyncio.wait_for(c.read_event(), WAIT)
            return events, closed
    events, closed = asyncio.run(run())
    assert [e.type for e in events] == ["error"] and says in Error.from_event(events[0]).text
    assert closed is None  # that connection ends, as Home Assistant expects
    assert np.array_equal(pcm_of(speak(port, "Still here.", "default")), alone(service, server, "Still here."))


def test_a_client_that_goes_away_cancels_its_take(studio):
    service, _, _ = studio
    port = free_port()
    # No repeat guard: on the demo's random weights it can end the take by itself before the client's leaving
    # reaches it on a loaded machine (CI saw "repeat_guard" once); only the cancel may end this take.
    long = WyomingServer(service, f"tcp://127.0.0.1:{port}",
                         params=SamplingParams.of(seed=SEED, max_frames=2000, repeat_guard=None))
    long.start()
    try:
        async def run():
            async with client(port) as c:
                await c.write_event(Synthesize(text="A long story begins here.", voice=SynthesizeVoice(
                    name="default")).event())
                while not AudioChunk.is_type((await asyncio.wait_for(c.read_event(), WAIT)).type):
                    pass
        asyncio.run(run())  # leaves after the first chunk, which came long before the take's 2000 frames
        deadline = time.monotonic() + 30
        while service.queue_depth and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.queue_depth == 0
        take = service.history[-1]
        assert take.text == "A long story begins here." and take.stop_reason == "cancelled"
        assert take.metrics.frames < 2000
    finally:
        long.stop()


def test_app_serves_wyoming_beside_the_page_with_the_flag(tmp_path):
    from tests.studio_server import running_studio

    port = free_port()
    with running_studio(tmp_path, "--wyoming", f"tcp://127.0.0.1:{port}"):
        # The Wyoming server starts after the page and the API answer (app.py start_wyoming), so the studio
        # being up is not yet the port listening: wait for the line it prints once it listens.
        log, deadline = tmp_path / "app.log", time.monotonic() + 60
        while "Wyoming (Home Assistant): tcp://" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)

        async def run():
            async with client(port) as c:
                await c.write_event(Describe().event())
                info = Info.from_event((await answer(c, "info"))[-1])
                await c.write_event(Synthesize(text="Hello from the studio.").event())
                return info, await answer(c)
        info, events = asyncio.run(run())
    assert [p.name for p in info.tts] == ["higgs-studio"] and "default" in [v.name for v in info.tts[0].voices]
    assert [e.type for e in events][::len(events) - 1] == ["audio-start", "audio-stop"] and pcm_of(events).size
    assert "Wyoming (Home Assistant): tcp://127.0.0.1:" in (tmp_path / "app.log").read_text()
