"""The live player's route and tokens in process, over the service with a scripted engine: who may stream,
what the NDJSON stream carries (queue positions, the take's PCM, the take id), and how the page's Gradio
event follows the same take. The browser side is tests/test_live_player.py."""

from __future__ import annotations

import base64
import json
import threading
import time

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.types import SamplingParams
from studio.api.access import Access
from studio.takes.limits import PUBLIC_MAX_TEXT_CHARS
from studio.audio.formats import to_pcm16
from studio.views.live import CLIP_VOICE, ROUTE, TOKEN_HEADER, TOKEN_TTL_S, LivePlayer
from studio.views.page import Page
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine

KEY = "SECRET"
FIELDS = dict(text="Hello there.", style="", voice="", clip_text="", temperature=0.8, top_p=0.8, top_k=30,
              seed=5, max_frames=0, repeat_guard=32)


@pytest.fixture
def page():
    service = StudioService(FakeEngine(frames=6, delay=0.01), None, None)
    page = Page(service)
    page.build()
    yield page
    service.close()


@pytest.fixture
def client(page):
    app = FastAPI()
    page.player.mount(app, access=Access(KEY))
    with TestClient(app) as client:
        yield client


def post(client, headers, live_id="abcdefgh1234", files=None, **fields):
    body = {"request": json.dumps({**FIELDS, **fields, "live_id": live_id})}
    return client.stream("POST", ROUTE, data=body, files=files, headers=headers)


def messages(response) -> list[dict]:
    return [json.loads(line) for line in response.iter_lines() if line]


def test_tokens_are_signed_and_expire():
    player = LivePlayer(None, secret=b"k" * 32)
    token = player.issue_token(now=1000.0)
    assert player.check_token(token, now=1000.0 + TOKEN_TTL_S - 1)
    assert not player.check_token(token, now=1000.0 + TOKEN_TTL_S + 1)  # expired: the page must be reloaded
    expires, mac = token.split(".")
    assert not player.check_token(f"{int(expires) + 3600}.{mac}", now=1000.0)  # a stretched expiry is refused
    assert not LivePlayer(None, secret=b"o" * 32).check_token(token, now=1000.0)  # another server's token
    assert not player.check_token("", now=1000.0) and not player.check_token(None, now=1000.0)


def test_without_the_page_token_or_the_key_the_route_answers_401(page, client):
    for headers in ({}, {TOKEN_HEADER: "123.abc"}, {"Authorization": "Bearer wrong"}):
        with post(client, headers) as r:
            assert r.status_code == 401, headers
            r.read()
            assert "reload the page" in r.json()["error"]
    assert page.service.history == []  # nothing was generated


def test_stream_carries_positions_the_takes_pcm_and_its_id(page, client):
    holder = page.service.start(Order(text="API take holding the GPU.",
                                                 params=SamplingParams(seed=1, max_frames=400)))
    threading.Thread(target=lambda: list(holder.stream()), daemon=True).start()
    while holder.order.text not in page.service.engine.started:
        time.sleep(0.01)
    threading.Timer(0.5, holder.cancel.set).start()  # the page's take waits its turn, then runs
    with post(client, {TOKEN_HEADER: page.player.issue_token()}) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        got = messages(r)
    kinds = [m["type"] for m in got]
    assert kinds[0] == "queued" and got[0]["position"] == 2
    assert kinds[-1] == "done" and set(kinds[1:-1]) <= {"queued", "audio"} and "audio" in kinds
    take = page.service.take(got[-1]["take_id"])
    assert take.door == "ui" and take.seed == 5 and got[-1]["stop_reason"] == "eoc"
    pcm = np.concatenate([np.frombuffer(base64.b64decode(m["pcm"]), "<i2") for m in got if m["type"] == "audio"])
    assert np.array_equal(pcm, to_pcm16(take.audio))  # the samples played are the take's, all of them
    assert got[1 + kinds[1:].index("audio")]["metrics"]["frames"] >= 1


def test_the_api_key_also_opens_the_route(client):
    with post(client, {"Authorization": f"Bearer {KEY}"}, max_frames=2) as r:
        assert r.status_code == 200 and messages(r)[-1]["type"] == "done"


def test_the_clean_switch_travels_with_the_stream(page, client):
    token = {TOKEN_HEADER: page.player.issue_token()}
    with post(client, token, text="**Hi** *waves* `code` there 🎉", clean=True, clean_actions="skip",
              max_frames=2) as r:
        done = messages(r)[-1]
    assert done["type"] == "done" and page.service.take(done["take_id"]).text == "Hi there."
    with post(client, token, live_id="abcdefgh5678", text="```\ncode\n```", clean=True) as r:
        got = messages(r)
        assert r.status_code == 200 and got[0]["type"] == "error" and "nothing left to say" in got[0]["message"]


def test_bad_requests_are_sentences(page, client):
    token = {TOKEN_HEADER: page.player.issue_token()}
    with post(client, token, text="  ", live_id="empty-text-1") as r:
        r.read()
        assert r.status_code == 400 and "Text is empty" in r.json()["error"]
    with post(client, token, live_id="no") as r:
        r.read()
        assert r.status_code == 400 and "live_id" in r.json()["error"]
    with post(client, token, voice=CLIP_VOICE, live_id="no-clip-123") as r:
        r.read()
        assert r.status_code == 400 and "no clip is loaded" in r.json()["error"]
    with post(client, token, live_id="no-clip-123") as r:  # ids are single-use
        r.read()
        assert r.status_code == 409


def test_a_take_that_cannot_start_fails_in_the_stream_and_the_page_panel_says_why(page, client):
    live_id = "no-library-1234"
    with post(client, {TOKEN_HEADER: page.player.issue_token()}, live_id=live_id, voice="Ann") as r:
        got = messages(r)
    assert r.status_code == 200 and got == [{"type": "error", "message": got[0]["message"]}]
    assert "No voice library" in got[0]["message"]
    updates = list(page.takes.generate(text="", style="", voice="", clip=None, clip_text="", temperature=0.8,
                                       top_p=0.8, top_k=30, seed=-1, max_frames=0, repeat_guard=32, takes_n=1,
                                       takes=[], live_id=live_id, request=None))
    # The page's event says why in the metrics panel's own line (the stream said it too) and records nothing.
    assert len(updates) == 1 and "No voice library" in updates[0][page.takes.metrics]
    assert page.service.history == []
    assert live_id not in page.player._entries


def test_a_one_off_clip_travels_in_the_form(page, client):
    import io

    import soundfile as sf
    wav = io.BytesIO()
    sf.write(wav, np.sin(np.arange(24_000) / 10).astype(np.float32) * 0.3, 24_000, format="WAV")
    with post(client, {TOKEN_HEADER: page.player.issue_token()}, voice=CLIP_VOICE, clip_text="Hi.", max_frames=2,
              files={"clip": ("clip.wav", wav.getvalue(), "audio/wav")}) as r:
        assert messages(r)[-1]["type"] == "done"
    ref = page.service.engine.calls[-1]["voice"]
    assert ref[1:] == (24_000, 24_000, "Hi.")  # FakeEngine.encode_voice: (tag, samples, rate, transcript)


def test_the_gradio_event_follows_the_live_take_into_the_history(page, client):
    live_id = "follow-me-123"
    outputs = {}

    def gradio_event():  # the page's `generate` with the id CLICK_JS put in its last input
        for update in page.takes.generate(text="", style="", voice="", clip=None, clip_text="", temperature=0.8,
                                          top_p=0.8, top_k=30, seed=-1, max_frames=0, repeat_guard=32, takes_n=1,
                                          takes=[], live_id=live_id, request=None):
            outputs.update(update)

    event = threading.Thread(target=gradio_event)
    event.start()  # before the stream arrives: it waits for it
    time.sleep(0.1)
    with post(client, {TOKEN_HEADER: page.player.issue_token()}, live_id=live_id) as r:
        take_id = messages(r)[-1]["take_id"]
    event.join(10)
    assert outputs[page.takes.result]["take_id"] == take_id and outputs[page.takes.takes] == [take_id]
    assert outputs[page.takes.take_audio].endswith(".wav") and outputs[page.takes.history][0][0] == take_id


def live_stream(page, client, live_id: str) -> tuple[threading.Thread, list[dict]]:
    """The browser's side of a live take in a thread: the stream's messages land in the list."""
    got: list[dict] = []

    def stream():
        with post(client, {TOKEN_HEADER: page.player.issue_token()}, live_id=live_id) as r:
            got.extend(messages(r))

    streamer = threading.Thread(target=stream)
    streamer.start()
    return streamer, got


def test_stop_cancels_a_live_take_through_the_page(page, client):
    page.service.engine.frames = 10_000
    live_id = "stop-me-12345"
    streamer, got = live_stream(page, client, live_id)
    updates = page.takes.generate(text="", style="", voice="", clip=None, clip_text="", temperature=0.8,
                                  top_p=0.8, top_k=30, seed=-1, max_frames=0, repeat_guard=32, takes_n=1, takes=[],
                                  live_id=live_id, request=None)
    follower = threading.Thread(target=lambda: list(updates))
    follower.start()
    while not page.takes._active:
        time.sleep(0.01)
    time.sleep(0.2)
    metrics, take_audio, *_ = page.takes.stop([], None)
    streamer.join(10)
    follower.join(10)
    assert "stopped" in metrics and take_audio.endswith(".wav")
    assert got[-1]["type"] == "done" and got[-1]["stop_reason"] == "cancelled"
    assert page.service.queue_depth == 0 and page.service.history[-1].stop_reason == "cancelled"


def test_stop_before_the_pages_event_stops_the_live_take_and_shows_it(page, client):
    """On a busy server Stop's handler can run before the page's event has claimed the live take (the event is
    sent at the first sound, and Stop's `cancels=` then ends it unseen): STOP_JS hands Stop the live id, and
    the take is stopped and shown all the same. A take that ended on its own is left to the page's event."""
    page.service.engine.frames = 10_000
    live_id = "stop-first-123"
    streamer, got = live_stream(page, client, live_id)
    deadline = time.monotonic() + 10
    while page.player.handle(live_id) is None:
        assert time.monotonic() < deadline, "the stream never started its take"
        time.sleep(0.01)
    time.sleep(0.2)
    assert not page.takes._active  # the page's event has not run
    metrics, take_audio, _, rows, takes, _ = page.takes.stop([], live_id)
    streamer.join(10)
    assert "stopped" in metrics and take_audio.endswith(".wav") and takes == [got[-1]["take_id"]] == [rows[0][0]]
    assert got[-1]["type"] == "done" and got[-1]["stop_reason"] == "cancelled"
    assert page.service.queue_depth == 0

    page.service.engine.frames = 3
    with post(client, {TOKEN_HEADER: page.player.issue_token()}, live_id="ends-alone-12") as r:
        assert messages(r)[-1]["stop_reason"] != "cancelled"
    assert page.takes.stop([], "ends-alone-12") == ({"__type__": "update"},) * 6  # nothing to stop or show


def test_a_stream_nobody_claims_fails_the_gradio_event_with_a_sentence(page):
    with pytest.raises(ValueError, match="did not reach the server"):
        page.player.claim("never-came-1", timeout=0.05)


def public_client(page, public_page: bool) -> TestClient:
    app = FastAPI()
    page.player.mount(app, access=Access(KEY, public_page=public_page))
    return TestClient(app)


def test_a_public_page_token_is_held_to_the_public_limits(page):
    long_text = "word " * (PUBLIC_MAX_TEXT_CHARS // 5 + 10)
    token = {TOKEN_HEADER: page.player.issue_token()}
    with public_client(page, public_page=True) as client:
        with post(client, token, text=long_text) as r:  # any visitor can load a public page: limits apply
            got = messages(r)
            assert r.status_code == 200 and got[0]["type"] == "error" and "public page" in got[0]["message"]
        with post(client, {"Authorization": f"Bearer {KEY}"}, live_id="keyed-owner-1", text=long_text) as r:
            assert r.status_code == 200  # the key is the owner: no public limits
    with public_client(page, public_page=False) as client:  # the page sits behind the owner's login
        with post(client, token, live_id="login-owner-1", text=long_text) as r:
            assert r.status_code == 200


def test_the_body_is_capped_before_it_is_parsed(client, page):
    token = {TOKEN_HEADER: page.player.issue_token()}
    big = ("clip.wav", b"\0" * (11 * 2**20), "audio/wav")
    with post(client, token, files={"clip": big}, voice="__clip__") as r:
        assert r.status_code == 413 and "MB" in json.loads(r.read())["error"]
