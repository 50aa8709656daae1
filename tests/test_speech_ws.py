"""`WS /v1/audio/speech/stream` (studio/api/stream.py) against a StudioService on the demo engine in this process
(Starlette's test client): a reply streamed in at an LLM's pace is spoken sentence by sentence, its first audio
within the engine's own TTFA (+ 50 ms) of the chunk that completed the first sentence, its PCM equal to the long
take (engine/longtake.py) of the same sentences and seeds, with no gap longer than the planned pause; a close
cancels the take; the key rule; bad messages. One test goes through the real server (`app.py --demo` with a key,
uvicorn + the `websockets` client)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import threading
import time

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from engine.config import SAMPLE_RATE
from engine.longform import SENTENCE_PAUSE, plan
from engine.longtake import LongTake
from studio import api
from studio.takes.limits import TakeLimits
from studio.api.access import Access
from studio.api import stream as speech_ws
from studio.audio.formats import to_pcm16
from studio.takes.sentences import SentenceBuffer, SentenceFeed
from studio.takes.service import StudioService
from studio.voices import VoiceLibrary
from tests.fakes import AsrPipeline

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

SEED = 7
FRAMES = 30  # per sentence: the demo's random weights run to the cap
KEY = "SECRET"
REPLY = ("Sure, here is the plan. First we pack the bags. Then we drive to the lake. The water is calm today. "
         "We swim until noon. After that we rest at home.")
CONFIG = {"seed": SEED, "max_frames": FRAMES}
AUTH = {"authorization": f"Bearer {KEY}"}  # pass copies: Starlette's test client adds its handshake to the dict


@pytest.fixture(scope="module")
def studio(tmp_path_factory, shared_engine):
    """One demo engine and service; a keyed app with the page-token hook and a keyless one (cross-site rule)."""
    service = StudioService(shared_engine(), VoiceLibrary(tmp_path_factory.mktemp("v")),
                            limits=TakeLimits(public_max_chars=40))  # a visitor's (the public app's) limit
    keyed, open_app, public = FastAPI(), FastAPI(), FastAPI()
    api.register(keyed, service, api_key=KEY, page_tokens=lambda token: token == "PAGE-TOKEN")
    api.register(open_app, service)
    api.register(public, service, access=Access(KEY, public_page=True),
                 page_tokens=lambda token: token == "PAGE-TOKEN")
    yield service, TestClient(keyed), TestClient(open_app), TestClient(public)
    service.close()


def chunks_of(text: str, seed: int = 0) -> list[str]:
    """`text` in pieces of 3–7 characters, as an LLM's tokens come."""
    rng, out, at = random.Random(seed), [], 0
    while at < len(text):
        size = rng.randint(3, 7)
        out.append(text[at:at + size])
        at += size
    return out


def events_until_done(ws) -> tuple[list[dict], bytes, list[tuple[float, int, int]]]:
    """Every JSON event and the audio up to `done` (or an error), with each audio frame's (arrival, first
    sample, samples)."""
    events, audio, frames = [], bytearray(), []
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            frames.append((time.perf_counter(), len(audio) // 2, len(message["bytes"]) // 2))
            audio += message["bytes"]
            continue
        event = json.loads(message["text"])
        events.append(event)
        if event["type"] in ("done", "error"):
            return events, bytes(audio), frames


def long_take(service, sentences: list[str]) -> LongTake:
    """The long take of these sentences, one segment each, with the stream's seed and settings."""
    segments = [dataclasses.replace(plan(s)[0], index=i, pause_after=SENTENCE_PAUSE) for i, s in enumerate(sentences)]
    segments[-1] = dataclasses.replace(segments[-1], pause_after=0.0)
    return LongTake(service.engine, segments, seed=SEED, max_frames=FRAMES)


def engine_ttfa(service, sentence: str) -> float:
    """Seconds from asking to the first audio of `sentence` as a long take's first segment, run straight on the
    engine (the median of 2, warm)."""
    times = []
    for _ in range(2):
        take = long_take(service, [sentence])
        started = time.perf_counter()
        stream = take.stream()
        next(stream)
        times.append(time.perf_counter() - started)
        take.cancel.set()
        stream.close()
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ sentences
def test_the_feed_gives_out_planned_sentences_once_complete_and_ends_on_end():
    feed, cancel = SentenceFeed(language="en"), threading.Event()
    assert feed.add("Dr. Smith paid 3.") == []  # "Dr." and "3." do not cut
    assert feed.add("5 dollars. He") == ["Dr. Smith paid 3.5 dollars."]
    segment = feed.next_segment(cancel)
    assert segment.source == "Dr. Smith paid 3.5 dollars." and "three point five" in segment.text
    assert segment.pause_after == SENTENCE_PAUSE
    assert feed.flush() == ["He"] and feed.next_segment(cancel).source == "He"
    assert feed.add(" left. And") == ["left."]  # after a flush the buffer starts afresh
    assert feed.end() == ["And"]
    assert [feed.next_segment(cancel).source for _ in range(2)] == ["left.", "And"]
    assert feed.next_segment(cancel) is None
    with pytest.raises(ValueError, match="ended"):
        feed.add("more")
    cancel.set()
    assert SentenceFeed().next_segment(cancel) is None  # a take waiting for text sees its cancel
    buffer = SentenceBuffer(limit=10)
    buffer.add("x" * 6)
    with pytest.raises(ValueError, match="10 characters"):
        buffer.add("y" * 5)
    assert buffer.text == "x" * 6  # the refused piece lost nothing


def test_a_sentence_cut_into_pieces_shows_each_piece_once():
    """The planner cuts a sentence of over 20 s at clauses and puts the whole sentence on its first piece;
    a stream shows (`source or text`) each piece's own words, never the whole sentence and then its pieces."""
    feed, cancel = SentenceFeed(normalize=False), threading.Event()
    sentence = ", ".join(f"clause number {i} of a sentence that goes on" for i in range(14)) + "."
    feed.add(sentence + " Next one.")
    feed.end()
    shown = []
    while (segment := feed.next_segment(cancel)) is not None:
        shown.append(segment.source or segment.text)
    assert len(shown) > 2 and shown[-1] == "Next one."
    assert " ".join(shown[:-1]) == sentence  # every word once, in order


def test_a_take_waiting_for_text_holds_no_slot_and_takes_its_turn_again():
    """`Job.turn(wait=...)`: with one slot, a take waiting for its next text lets another take run meanwhile."""
    from studio.takes.gpu_queue import GpuQueue

    line, text, order = GpuQueue(1), threading.Event(), []

    def open_take(job):
        order.append("first sentence")
        job.out.put(job.turn(wait=lambda: text.wait(5) and "second sentence"))
        order.append("second sentence")

    def other(job):
        order.append("other take")
        text.set()  # it ran while the open take waited: now the text comes

    results = []
    waiting = threading.Thread(target=lambda: results.extend(line.run(open_take, threading.Event())))
    waiting.start()
    while not order:
        time.sleep(0.01)
    list(line.run(other, threading.Event()))
    waiting.join(5)
    assert order == ["first sentence", "other take", "second sentence"] and results == ["second sentence"]


# ------------------------------------------------------------------------------------------ the stream
def test_a_reply_streamed_at_an_llms_pace_is_the_long_take_heard_at_once_and_gapless(studio):
    service, client, *_ = studio
    pieces = chunks_of(REPLY)
    buffer = SentenceBuffer()
    completing = next(i for i, _ in enumerate(pieces) if buffer.add(pieces[i]))  # the chunk ending sentence 1
    first_sentence = SentenceBuffer().add("".join(pieces[:completing + 1]))[0]
    alone = engine_ttfa(service, first_sentence)
    sent_at: dict[int, float] = {}

    def send(ws) -> None:
        for i, piece in enumerate(pieces):
            ws.send_json({"text": piece})
            sent_at[i] = time.perf_counter()
            time.sleep(0.04)
        ws.send_json({"end": True})

    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json(CONFIG)
        assert ws.receive_json() == {"type": "ready", "sample_rate": SAMPLE_RATE, "format": "pcm", "seed": SEED}
        sender = threading.Thread(target=send, args=(ws,))
        sender.start()
        events, audio, frames = events_until_done(ws)
        sender.join()
    assert events[-1]["type"] == "done", events[-1]
    sentences = [e for e in events if e["type"] == "sentence"]
    texts = [e["text"] for e in sentences]
    assert texts[0] == first_sentence and len(texts) == 6

    # Heard at once: the first sentence's audio came while the reply was still arriving (a take that waited for
    # the whole reply would start after its last chunk). The latency itself is printed, never asserted (it is the
    # machine's load as much as ours): the engine's TTFA of that sentence in this stream, and alone.
    heard, ttfa = frames[0][0] - sent_at[completing], events[-1]["ttfa_ms"] / 1e3
    print(f"\nfirst audio {1e3 * heard:.0f} ms after the chunk completing sentence 1; the engine's TTFA of that "
          f"sentence {1e3 * ttfa:.0f} ms in the stream, {1e3 * alone:.0f} ms alone")
    assert frames[0][0] < sent_at[len(pieces) - 1], "the first audio waited for the whole reply"

    take = long_take(service, texts)
    made = time.perf_counter()
    expected = to_pcm16(take.run())
    made = time.perf_counter() - made  # the engine's own time for the whole take, in this run
    pcm = np.frombuffer(audio, "<i2")
    assert len(pcm) == len(expected) and np.array_equal(pcm, expected)  # the stream is the long take
    assert [e["offset"] for e in sentences] == [start for start, _ in take.spans()]
    assert events[-1]["samples"] == len(pcm) and events[-1]["sentences"] == 6

    # Played as the page's worklet plays it (studio/static/player-worklet.js: it starts once 60 ms are
    # buffered): the longest wait for audio not yet there.
    prebuffer = 0.06 * SAMPLE_RATE
    buffered = 0
    played_to, gaps = None, []
    for arrived, first, n in frames:
        buffered += n
        if played_to is None and buffered < prebuffer:
            continue
        start = arrived if played_to is None else max(played_to, arrived)
        n = buffered if played_to is None else n
        if played_to is not None:
            gaps.append(start - played_to)
        played_to = start + n / SAMPLE_RATE
    # A stream cannot be gapless on an engine slower than real time: on a loaded machine the bound grows by
    # what the engine itself, making the same take offline in this run, fell behind the take's length.
    behind = max(0.0, made - len(expected) / SAMPLE_RATE)
    print(f"longest gap in playback {1e3 * max(gaps):.1f} ms (planned pause {1e3 * SENTENCE_PAUSE:.0f} ms; the "
          f"engine made the take in {made:.2f} s for {len(expected) / SAMPLE_RATE:.2f} s of audio)")
    assert max(gaps) <= SENTENCE_PAUSE + behind


def test_flush_speaks_what_is_buffered_and_timestamps_mark_each_sentence_end(studio):
    service, client, *_ = studio
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json({**CONFIG, "timestamps": True})
        ws.receive_json()
        ws.send_json({"text": "No full stop here"})
        ws.send_json({"flush": True})
        ws.send_json({"text": "Then one more.", "end": True})
        events, audio, _ = events_until_done(ws)
    take = long_take(service, ["No full stop here", "Then one more."])
    assert np.array_equal(np.frombuffer(audio, "<i2"), to_pcm16(take.run()))
    spans = take.spans()
    assert [(e["type"], e["offset"]) for e in events if e["type"] in ("sentence", "sentence_end")] == [
        ("sentence", spans[0][0]), ("sentence_end", spans[0][1]), ("sentence", spans[1][0]),
        ("sentence_end", spans[1][1])]


def scripted_app(service, answers, *, listen: bool = False) -> TestClient:
    from studio.audio.asr import Transcriber
    from studio.audio.listen import Listener

    asr = Transcriber("fake", make_pipeline=lambda model, device: AsrPipeline(answers))
    app = FastAPI()
    api.register(app, service, api_key=KEY, transcriber=asr, listener=Listener(asr) if listen else None)
    return TestClient(app)


def test_word_timestamps_come_from_the_asr_shifted_to_each_sentences_offset(studio):
    service, _, open_client, _ = studio
    client = scripted_app(service, [[("One", 0.1), ("two", 0.3)], [("Three", 0.2), ("four", 0.4)]])
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json({**CONFIG, "timestamps": "word"})
        ws.receive_json()
        ws.send_json({"text": "One two. Three four.", "end": True})
        events, _, _ = events_until_done(ws)
    offsets = {e["index"]: e["offset"] / SAMPLE_RATE for e in events if e["type"] == "sentence"}
    words = [e for e in events if e["type"] == "words"]
    assert [e["index"] for e in words] == [0, 1] and events[-1]["type"] == "done"
    assert [[w["word"] for w in e["words"]] for e in words] == [["One", "two."], ["Three", "four."]]
    assert words[1]["words"][1]["start"] == round(offsets[1] + 0.4, 3) and not words[1]["words"][1]["estimated"]
    assert [e["words"][0]["start"] for e in words] == [0.0, round(offsets[1], 3)]  # a sentence's exact offset
    assert not words[0]["estimated"] and words[0]["note"] is None
    with open_client.websocket_connect(speech_ws.ROUTE) as ws:  # a studio without ASR estimates, and says so
        ws.send_json({**CONFIG, "timestamps": "word"})
        ws.receive_json()
        ws.send_json({"text": "One two.", "end": True})
        events, _, _ = events_until_done(ws)
    (timed,) = [e for e in events if e["type"] == "words"]
    assert timed["estimated"] and "no transcriber" in timed["note"] and [w["word"] for w in timed["words"]] == [
        "One", "two."]


def test_listen_checks_each_sentence_and_makes_a_misheard_one_again(studio):
    service, _, open_client, _ = studio
    client = scripted_app(service, ["One two.", "something else entirely", "Three four."], listen=True)
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json({**CONFIG, "listen": True})
        assert "warnings" not in ws.receive_json()
        ws.send_json({"text": "One two. Three four.", "end": True})
        events, _, _ = events_until_done(ws)
    heard = [(e["index"], e["seed"], e["wer"], e["tries"]) for e in events if e["type"] == "sentence"]
    assert heard == [(0, SEED, 0.0, 1), (1, SEED + 2, 0.0, 2)]  # sentence 1: seed + 1 heard wrong, seed + 2 kept
    with open_client.websocket_connect(speech_ws.ROUTE) as ws:  # no ASR: the stream says so and goes on
        ws.send_json({**CONFIG, "listen": True})
        ready = ws.receive_json()
        assert "Listen and retry is off" in ready["warnings"][0]
        ws.send_json({"text": "One two.", "end": True})
        events, _, _ = events_until_done(ws)
    assert events[-1]["type"] == "done" and "wer" not in events[0]


def test_opus_comes_as_ogg_pages_of_the_same_take(studio):
    from tests.studio_server import need_ffmpeg

    need_ffmpeg()
    _, client, *_ = studio
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json({**CONFIG, "response_format": "opus"})
        assert ws.receive_json()["format"] == "opus"
        ws.send_json({"text": "Hello there.", "end": True})
        events, audio, _ = events_until_done(ws)
    assert events[-1]["type"] == "done" and audio.startswith(b"OggS") and b"OpusHead" in audio[:100]


def test_closing_mid_way_cancels_the_take_at_the_next_step(studio, monkeypatch):
    service, client, *_ = studio
    handles = []
    start = service.start_open
    monkeypatch.setattr(service, "start_open", lambda *a, **k: handles.append(start(*a, **k)) or handles[-1])
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        ws.send_json({"seed": SEED, "max_frames": 1500})  # a minute of audio: far from done when closed
        assert ws.receive_json()["type"] == "ready"
        ws.send_json({"text": "A long first sentence that takes its time. And"})
        while (message := ws.receive()).get("bytes") is None:  # the first audio; an error or a close fails here
            assert message.get("type") == "websocket.send" and '"error"' not in message.get("text", ""), message
    handle = handles[0]
    assert handle.cancel.wait(5)
    closed = time.perf_counter()
    while service.queue_depth:
        time.sleep(0.002)
    stopped = time.perf_counter() - closed
    print(f"\nthe take left the line {1e3 * stopped:.0f} ms after the close")
    assert stopped < 0.25  # one demo step is a few ms; the rest of the take would take seconds


# ------------------------------------------------------------------------------------------ who, and bad input
def test_the_key_rule_the_page_token_and_the_cross_site_rule(studio):
    _, keyed, open_app, public = studio
    with keyed.websocket_connect(speech_ws.ROUTE) as ws:
        ws.send_json(CONFIG)
        event = ws.receive_json()
        assert event["type"] == "error" and event["code"] == "invalid_api_key" and "Bearer" in event["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008
    with keyed.websocket_connect(speech_ws.ROUTE, headers={"authorization": "Bearer wrong"}) as ws:
        ws.send_json({**CONFIG, "token": "forged"})
        assert ws.receive_json()["code"] == "invalid_api_key"
    with keyed.websocket_connect(speech_ws.ROUTE) as ws:
        ws.send_json({**CONFIG, "token": "PAGE-TOKEN"})
        assert ws.receive_json()["type"] == "ready"
    with open_app.websocket_connect(speech_ws.ROUTE, headers={"origin": "http://evil.example"}) as ws:
        event = ws.receive_json()
        assert event["code"] == "cross_site_request" and "another site" in event["message"]
    with open_app.websocket_connect(speech_ws.ROUTE, headers={"origin": "http://localhost:7860"}) as ws:
        ws.send_json(CONFIG)
        assert ws.receive_json()["type"] == "ready"
    with public.websocket_connect(speech_ws.ROUTE) as ws:  # a public page's visitor: the public limits
        ws.send_json({**CONFIG, "token": "PAGE-TOKEN", "max_frames": 5000})
        assert "public page" in ws.receive_json()["message"]
        ws.send_json({**CONFIG, "token": "PAGE-TOKEN"})
        assert ws.receive_json()["type"] == "ready"
        ws.send_json({"text": "x " * 25})
        assert "passed 40 characters" in ws.receive_json()["message"]


def test_bad_messages_are_answered_and_the_stream_goes_on(studio):
    service, client, *_ = studio
    with client.websocket_connect(speech_ws.ROUTE, headers=dict(AUTH)) as ws:
        bad_configs = [("not json", "not JSON"), ("[1, 2]", "JSON object"), ('{"voise": "x"}', "voise"),
                       ('{"temperature": -1}', "emperature"), ('{"voice": "Nobody"}', "Nobody"),
                       ('{"response_format": "mp3"}', "response_format")]
        for text, says in bad_configs:
            ws.send_text(text)
            event = ws.receive_json()
            assert event["type"] == "error" and says in event["message"], (text, event)
        ws.send_bytes(b"\x00\x01")
        assert "binary" in ws.receive_json()["message"]
        ws.send_json(CONFIG)  # a good config after the bad ones
        assert ws.receive_json()["type"] == "ready"
        for text, says in [('{"txt": "hi"}', "Unknown message"), ('{"text": 5}', "string"), ("{}", "Unknown")]:
            ws.send_text(text)
            event = ws.receive_json()
            assert event["type"] == "error" and says in event["message"], (text, event)
        ws.send_json({"text": "Still here.", "end": True})
        ws.send_json({"text": "After the end."})
        events, audio = [], b""
        while (message := ws.receive())["type"] != "websocket.close":
            if message.get("bytes") is not None:
                audio += message["bytes"]
            else:
                events.append(json.loads(message["text"]))
        assert [e for e in events if e["type"] == "error"] == [
            {"type": "error", "message": "The text has ended; open a new stream to say more.", "code": "bad_message"}]
        assert events[-1]["type"] == "done" and events[-1]["samples"] * 2 == len(audio) > 0
        assert message["code"] == 1000  # one stream, one take: closed after `done`
    assert service.queue_depth == 0


def test_the_pages_type_as_you_go_script_streams_through_this_route_into_the_live_players_worklet():
    """Without a browser: the toggle's script (served from studio/static/) opens this route, sends the page's
    token in its config, and plays through the worklet processor live.js loads (tests/test_page.py checks the
    toggle is on the page with this script, and that it parses)."""
    from studio.views import assets

    script = assets.script("typeahead.js")
    assert f"'{speech_ws.ROUTE}'" in script and "token: live?.dataset.token" in script
    assert "new AudioWorkletNode(hs.ctx, 'hs-player'" in script and "registerProcessor('hs-player'" in assets.script(
        "player-worklet.js")
    for message in ("{text: added}", "{flush: true}", "{end: true}"):
        assert message in script
    assert {"token", "voice", "style", "seed"} <= set(speech_ws.StreamConfig.model_fields)  # what it sends


def test_the_real_server_streams_over_uvicorn_with_the_key(keyed_studio):
    """`app.py --demo --api-key`: uvicorn serves the route (the `websockets` package), Bearer key in the header."""
    import websockets

    url = keyed_studio.url.replace("http://", "ws://").rstrip("/") + speech_ws.ROUTE

    async def run():
        async with websockets.connect(url) as ws:  # no key
            await ws.send(json.dumps(CONFIG))
            assert json.loads(await ws.recv())["code"] == "invalid_api_key"
        async with websockets.connect(url, additional_headers=dict(AUTH)) as ws:
            await ws.send(json.dumps(CONFIG))
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.send(json.dumps({"text": "Hello there. Bye.", "end": True}))
            audio = b""
            while isinstance(message := await asyncio.wait_for(ws.recv(), 60), bytes) or \
                    json.loads(message)["type"] not in ("done", "error"):
                audio += message if isinstance(message, bytes) else b""
            assert json.loads(message)["type"] == "done" and json.loads(message)["samples"] * 2 == len(audio)

    asyncio.run(run())
