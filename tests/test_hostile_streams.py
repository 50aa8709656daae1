"""Hostile streams: the speech WebSocket (studio/api/stream.py) and the Wyoming server (studio/api/wyoming.py) under
inputs meant to wear them down: many idle sockets from one address, a long text in thousands of four-character
pieces, a Wyoming header that declares gigabytes, JSON nested far past Python's recursion limit. Each test
asserts the bound it must hold: streams and threads, /health latency, characters re-read, MB, close codes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import time

import pytest
import websockets
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from wyoming.client import AsyncTcpClient
from wyoming.event import read_event
from wyoming.info import Describe
from wyoming.tts import SynthesizeChunk, SynthesizeStart

from studio.takes import sentences
from studio.api.access import Access
from studio.takes.admission import MAX_OPEN_STREAMS_PER_VISITOR, OWNER, Caller, OpenStreams, Refused
from studio.api.stream import ROUTE, SpeechStream
from studio.takes.sentences import MAX_SENTENCE_CHARS, SentenceBuffer
from studio.takes.service import StudioService
from studio.api.wyoming import MAX_CONNECTIONS_PER_ADDRESS, WyomingServer
from tests.fakes import FakeEngine
from tests.probes import health_latency, loop_held, peak_growth_mb, server_pid, thread_count
from tests.studio_server import free_port

WAIT = 60.0  # seconds any one answer may take on a busy 2-core machine
# 29,900 characters, sent in 7,475 four-character pieces, stalled the server for 6-11 s (24 s on a busy machine):
# every piece re-split all the text so far, on the event loop. Short sentences make the most work for the
# splitter; the server is sent longer ones, so that its demo engine has fewer sentences to speak meanwhile.
REPLY = "It is ok. " * 2990
LONG_REPLY = ("The quick brown fox jumps over the lazy dog, and then it runs far away to the hills. " * 300)[:29_900]
PIECE = 4


def pieces(text: str, size: int = PIECE) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://").rstrip("/") + ROUTE


def fake_app(**options) -> TestClient:
    """The route alone on a keyless app over a fake engine's service: for what happens before any take runs."""
    app = FastAPI()
    app.add_api_websocket_route(ROUTE, SpeechStream(StudioService(FakeEngine()), Access(), **options))
    return TestClient(app)


# ------------------------------------------------------------------------------------------ open streams
def test_one_address_holds_a_few_open_streams_and_an_idle_one_holds_no_thread(demo_studio):
    """Idle sockets from one address: a stream waiting for text counts towards the address's open streams, the
    ones past the cap are refused with a sentence and close code 1013 (try again later), and the ones open
    hold no thread until their text begins. Before: all 10 ready, +20 threads, open for good."""
    cap, pid, url = MAX_OPEN_STREAMS_PER_VISITOR, server_pid(demo_studio.url), ws_url(demo_studio.url)

    async def run():
        before, opened, refused = thread_count(pid), [], []
        try:
            for _ in range(cap + 6):
                ws = await websockets.connect(url)
                with contextlib.suppress(websockets.ConnectionClosed):  # a refused one may be closed already
                    await ws.send(json.dumps({"seed": 1}))
                event = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
                if event["type"] == "ready":
                    opened.append(ws)
                    continue
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(ws.recv(), WAIT)
                refused.append((event, closed.value.rcvd))
            await asyncio.sleep(0.5)  # let any thread a stream would start come up
            grown = thread_count(pid) - before
        finally:
            for ws in opened:
                await ws.close()
        return opened, refused, grown

    opened, refused, grown = asyncio.run(run())
    print(f"\n{len(opened)} streams open, {len(refused)} refused; the server's threads grew by {grown}")
    assert len(opened) == cap and len(refused) == 6
    event, close = refused[0]
    assert event["code"] == "too_many_streams" and f"may have {cap}" in event["message"]
    assert close.code == 1013 and "streams" in close.reason and len(close.reason.encode()) <= 123
    assert grown < cap  # an idle stream starts no take: no job thread, no pump thread (2 per stream before)


def test_open_streams_are_counted_per_visitor_and_in_all_the_owner_only_in_all():
    streams, a, b = OpenStreams(per_visitor=2, total=3), Caller.visitor("10.0.0.1"), Caller.visitor("10.0.0.2")
    streams.open(a)
    streams.open(a)
    with pytest.raises(Refused, match="may have 2") as refused:
        streams.open(a)
    assert refused.value.visitor
    streams.open(OWNER)  # the key holder: no share of its own, but one of the three
    with pytest.raises(Refused, match="3 streams open") as refused:
        streams.open(b)
    assert not refused.value.visitor
    streams.close(a)
    streams.open(b)
    assert streams.open_now == 3


def test_a_silent_stream_is_closed_after_the_idle_timeout_with_a_reason():
    """Before its config and after `ready`, a stream with nothing sent either way is told, then closed with
    1001 and the reason (before: open for good)."""
    client = fake_app(idle_s=0.5)
    for configured in (False, True):
        with client.websocket_connect(ROUTE) as ws:
            if configured:
                ws.send_json({"seed": 1})
                assert ws.receive_json()["type"] == "ready"
            started = time.monotonic()
            event = ws.receive_json()
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            waited = time.monotonic() - started
        assert event["code"] == "idle_timeout" and "0.5 s" in event["message"], event
        assert closed.value.code == 1001 and "0.5 s" in closed.value.reason
        assert len(closed.value.reason.encode()) <= 123
        assert 0.4 <= waited < 5.0


# ------------------------------------------------------------------------------------------ many small pieces
def test_the_splitter_rereads_a_bounded_tail_per_piece_not_the_whole_text(monkeypatch):
    """Characters handed to the sentence splitter per piece: the unfinished sentence with the piece (and once
    more when that sentence passes MAX_SENTENCE_CHARS and is cut), never the text so far. Before, every piece
    re-split everything: 111,766,200 characters for this reply, 1 s for one piece. No word is lost or doubled."""
    scanned: list[int] = []
    split = sentences.split_sentences
    monkeypatch.setattr(sentences, "split_sentences", lambda text, *a: scanned.append(len(text)) or split(text, *a))
    for text in (REPLY, "Dr. " * 7475):  # short sentences; then one that never ends (abbreviations do not cut)
        buffer, out, per_piece = SentenceBuffer(), [], []
        for piece in pieces(text):
            scanned.clear()
            out += buffer.add(piece)
            per_piece.append(sum(scanned))
        out += buffer.finish()
        print(f"\n{len(text):,} characters: at most {max(per_piece):,} re-read per piece, {sum(per_piece):,} in all")
        assert max(per_piece) <= 2 * (MAX_SENTENCE_CHARS + PIECE)
        assert max(per_piece[len(per_piece) // 2:]) <= max(per_piece[:len(per_piece) // 2]) + PIECE  # no growth
        assert " ".join(out).split() == text.split()  # every word once, in order
    assert len(REPLY.split(". ")) - 1 == 2990 and SentenceBuffer().add(REPLY) == split(REPLY)[:-1]


def test_a_reply_in_thousands_of_tiny_messages_never_holds_the_event_loop(demo_studio):
    """7,475 four-character messages on one WebSocket, read as fast as they come: /health answers within
    LOOP_STALL_LIMIT_S throughout (before: one answer in 24 s, the loop busy re-splitting the text)."""
    url = ws_url(demo_studio.url)

    async def run():
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"seed": 1, "max_frames": 1}))
            assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["type"] == "ready"
            started = time.perf_counter()
            for piece in pieces(LONG_REPLY):
                await ws.send(json.dumps({"text": piece}))
            await ws.send(json.dumps({"mark": True}))  # answered once every message before it has been read
            while True:
                message = await asyncio.wait_for(ws.recv(), WAIT)
                if isinstance(message, str) and json.loads(message)["type"] == "error":
                    assert "Unknown message" in json.loads(message)["message"], message
                    return time.perf_counter() - started

    with health_latency(demo_studio.url) as latencies:
        took = asyncio.run(run())
    print(f"\n7,475 messages read in {took:.2f} s; /health's worst latency {1e3 * max(latencies):.0f} ms over "
          f"{len(latencies)} polls")
    assert not loop_held(latencies), sorted(latencies)[-3:]


# ------------------------------------------------------------------------------------------ malformed JSON
def test_json_nested_past_the_recursion_limit_is_a_bad_message_and_the_stream_goes_on():
    """Before the config and after it (before: "The take failed (RecursionError: …)", close 1011)."""
    client = fake_app()
    deep = "[" * 100_000 + "]" * 100_000
    with client.websocket_connect(ROUTE) as ws:
        for text in (deep, '{"voice": ' + deep + "}", "{" * 100_000):
            ws.send_text(text)
            event = ws.receive_json()
            assert event["type"] == "error" and event["code"] == "bad_message", event
            assert "Error" not in event["message"] and "JSON" in event["message"], event
        ws.send_json({"seed": 1})
        assert ws.receive_json()["type"] == "ready"
        ws.send_text('{"text": ' + deep + "}")
        event = ws.receive_json()
        assert event["code"] == "bad_message" and "Error" not in event["message"], event
        ws.send_text(json.dumps({"text": "x" * 1_000_000}))  # past the size read on the event loop
        event = ws.receive_json()
        assert event["code"] == "bad_message" and "the limit for one message is 1,000,000" in event["message"]
        ws.send_text("{}")  # still reading
        assert "Unknown message" in ws.receive_json()["message"]


# ------------------------------------------------------------------------------------------ Wyoming
@pytest.fixture(scope="module")
def wyoming_port():
    """A Wyoming server over a fake engine's service: what is refused here never reaches a take."""
    service = StudioService(FakeEngine())
    port = free_port()
    server = WyomingServer(service, f"tcp://127.0.0.1:{port}")
    server.start()
    yield port
    server.stop()
    service.close()


def events_until_closed(sock: socket.socket, timeout: float = WAIT) -> list:
    """The events the server sends until it closes the connection (or `timeout` passes), read by the
    `wyoming` package's own reader."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionError, TimeoutError):
        pass
    stream, events = io.BytesIO(data), []
    while (event := read_event(stream)) is not None:
        events.append(event)
    return events


def test_a_wyoming_header_declaring_gigabytes_is_refused_before_any_is_read(wyoming_port):
    """The server answers the header with an error and closes; it buffers none of what follows (before: no
    answer, +66 MB for 64 MiB sent, and on for all 2 GB)."""
    block = b"\0" * (1 << 20)
    with peak_growth_mb(os.getpid()) as growth, socket.create_connection(("127.0.0.1", wyoming_port)) as sock:
        header = {"type": "synthesize", "data_length": 2_000_000_000, "version": "1.10.0"}
        sock.sendall(json.dumps(header).encode() + b"\n")
        sent = 0
        sock.settimeout(10)
        try:
            while sent < 64 << 20:  # 64 MiB of the 2 GB it promised
                sock.sendall(block)
                sent += len(block)
        except (ConnectionError, TimeoutError):
            pass
        events = events_until_closed(sock, timeout=10)
    print(f"\nsent {sent >> 20} MiB after the header; this process (the server's) grew {growth['mb']:.1f} MB")
    assert [e.type for e in events] == ["error"], events
    text = events[0].data["text"]
    assert "2,000,000,000 bytes" in text and "limit" in text, text
    assert growth["mb"] < 16


@pytest.mark.parametrize("line, says", [
    (b"[" * 30_000 + b"\n", "nested too deeply"),
    (b"x" * (1 << 17) + b"\n", "65,536 bytes"),
    (b'{"type": "synthesize", "data_length": "a lot"}\n', "whole number of bytes"),
    (b'{"data": {}}\n', "`type`"),
], ids=["nested", "long", "bad-length", "no-type"])
def test_a_malformed_wyoming_header_is_refused_with_a_sentence(wyoming_port, line, says):
    """Before: the connection dropped without a word (the package's reader raised, or gave up)."""
    with socket.create_connection(("127.0.0.1", wyoming_port)) as sock:
        sock.sendall(line)
        events = events_until_closed(sock)
    assert [e.type for e in events] == ["error"] and says in events[0].data["text"], events
    assert "Error" not in events[0].data["text"]


def test_one_address_holds_a_bounded_number_of_wyoming_connections(wyoming_port):
    """Idle connections hold no thread, but each holds a socket: one address may keep
    MAX_CONNECTIONS_PER_ADDRESS open; the next hears why and is closed before it is read (before: no cap at
    all), and one closed makes room again."""
    held = [socket.create_connection(("127.0.0.1", wyoming_port)) for _ in range(MAX_CONNECTIONS_PER_ADDRESS)]
    try:
        time.sleep(0.3)  # every one of them reached the server's loop
        with socket.create_connection(("127.0.0.1", wyoming_port)) as extra:
            events = events_until_closed(extra)
        assert [e.type for e in events] == ["error"] and events[0].data["code"] == "too-many-connections", events
        assert f"may have {MAX_CONNECTIONS_PER_ADDRESS}" in events[0].data["text"]
        held.pop().close()
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", wyoming_port)) as again:
            again.sendall(json.dumps({"type": "describe", "version": "1.10.0"}).encode() + b"\n")
            again.settimeout(WAIT)
            assert b'"info"' in again.recv(65536)
    finally:
        for sock in held:
            sock.close()


def test_a_silent_wyoming_connection_hears_why_and_is_closed():
    service, port = StudioService(FakeEngine()), free_port()
    server = WyomingServer(service, f"tcp://127.0.0.1:{port}", idle_s=0.5)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            started = time.monotonic()
            events = events_until_closed(sock)
            waited = time.monotonic() - started
    finally:
        server.stop()
        service.close()
    assert [e.type for e in events] == ["error"] and events[0].data["code"] == "idle-timeout"
    assert "0.5 s" in events[0].data["text"] and 0.4 <= waited < 5.0


def test_a_reply_in_thousands_of_tiny_wyoming_chunks_never_holds_up_another_client(wyoming_port):
    """7,475 four-character `synthesize-chunk`s on one connection while another asks `describe` again and
    again: each answer comes within LOOP_STALL_LIMIT_S (before: 2 answers, the second after 1.6 s)."""
    async def run():
        waits, done = [], asyncio.Event()

        async def other():
            async with AsyncTcpClient("127.0.0.1", wyoming_port) as c:
                while not done.is_set():
                    asked = time.perf_counter()
                    await c.write_event(Describe().event())
                    assert (await asyncio.wait_for(c.read_event(), WAIT)).type == "info"
                    waits.append(time.perf_counter() - asked)
                    await asyncio.sleep(0.02)

        prober = asyncio.create_task(other())
        async with AsyncTcpClient("127.0.0.1", wyoming_port) as c:
            await c.write_event(SynthesizeStart().event())
            for piece in pieces(LONG_REPLY):
                await c.write_event(SynthesizeChunk(text=piece).event())
            await c.write_event(Describe().event())  # answered once every chunk before it has been read
            while (await asyncio.wait_for(c.read_event(), WAIT)).type != "info":
                pass
        done.set()
        await prober
        return waits

    waits = asyncio.run(run())
    print(f"\nanother client's describe: worst {1e3 * max(waits):.0f} ms over {len(waits)} answers")
    assert not loop_held(waits), sorted(waits)[-3:]
