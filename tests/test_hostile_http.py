"""The HTTP edges under hostile or careless clients: a buffered take whose client has gone, the first moment
after start-up, SSML counted as sent, and no internal exception text in an error.

The take and start-up tests run `app.py --demo` (the shared `demo_studio`, or one started here to watch its
first second); the limit and error tests run the API in process on a scripted engine (tests/fakes.py)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.fakes import ScriptedEngine
from tests.studio_server import START_TIMEOUT_S, spawned_studio

# A take of 3,900 frames (156 s of audio): 12–18 s of work for the demo on a busy 2-core machine. Seed 1 runs
# it to the end (no early stop), so it is still running when its client leaves after a second.
LONG_TAKE = {"input": "Hello there, a long take.", "max_frames": 3900, "repeat_guard": None, "seed": 1}
CANCEL_BOUND_S = 2.0  # from the client's leaving to the take's slot being free


def _queue_depth(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).json()["queue_depth"]


def _until(condition, timeout: float, period: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(period)
    return condition()


# ------------------------------------------------------------------------------------------ client gone

@pytest.mark.parametrize("buffered", [
    {"stream": False, "response_format": "wav"},
    {"response_format": "flac"},
    {"response_format": "wav", "loudness": "podcast"},
    {"response_format": "pcm", "timestamps": "sentence"},
], ids=["wav-stream-false", "flac", "loudness", "timestamps"])
def test_a_buffered_take_stops_when_its_client_leaves(demo_studio, buffered):
    """Each of these is answered once the whole take is made; a client that leaves after a second must not
    keep the take on the line for the rest of it (it ran on 11–14 s, to its end)."""
    url = demo_studio.url
    assert _until(lambda: _queue_depth(url) == 0, 60), "the shared studio's line is still busy"
    body = json.dumps({**LONG_TAKE, **buffered}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body)
        assert _until(lambda: _queue_depth(url) == 1, 30), "the take never reached the line"
        time.sleep(1.0)  # the client waits a second for its answer, then gives up
        assert _queue_depth(url) == 1, "the take ended by itself: it is too short to show anything"
    left = time.monotonic()
    freed = _until(lambda: _queue_depth(url) == 0, CANCEL_BOUND_S + 20)
    took = time.monotonic() - left
    assert freed and took <= CANCEL_BOUND_S, f"the take ran on {took:.1f} s after its client left"


# ------------------------------------------------------------------------------------------ start-up

@pytest.mark.slow
def test_routes_answer_from_the_moment_the_port_opens(tmp_path):
    """The API's routes are in place before the server listens: no request ever meets a 404 for them (they
    answered 404 for ~0.5 s after the port opened)."""
    with spawned_studio(tmp_path) as (proc, port):
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (tmp_path / "app.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the studio never opened its port"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.002)
        statuses = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(5):
                statuses += [(path, client.get(path).status_code) for path in ("/health", "/v1/models")]
    assert all(status == 200 for _, status in statuses), statuses


# ------------------------------------------------------------------------------------------ in process

@pytest.fixture(params=[2000])
def api_client(request):
    """The HTTP API on a scripted engine; its `max_input_chars` is the param (2,000 unless a test says)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api
    from studio.takes.service import StudioService

    service = StudioService(ScriptedEngine())
    app = FastAPI()
    api.register(app, service, request_timeout=60.0, max_input_chars=request.param)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    service.close()


def _speech(client, **body):
    return client.post("/v1/audio/speech", json={"max_frames": 3, "response_format": "pcm", **body})


# Markup with nothing to say: 7 characters of input each, none of the translated text.
def _padded_ssml(text: str, total: int) -> str:
    head, tail = f"<speak>{text}", "</speak>"
    return head + "<s></s>" * ((total - len(head) - len(tail)) // 7 + 1) + tail


def test_the_long_input_limit_counts_the_ssml_that_was_sent(api_client):
    sentence = "The tide came in over the flats, slow and grey, and the birds lifted off the sand. "
    ssml = _padded_ssml(sentence * 4 + '<break time="1s"/>' + sentence * 4, 3000)  # a long input: it has a pause
    r = _speech(api_client, input=ssml)
    assert r.status_code == 400, "SSML over the limit was read as its ~700 characters of text"
    message = r.json()["error"]["message"]
    assert f"{len(ssml)} characters" in message and "limit is 2000" in message


def test_plain_text_and_ssml_under_the_limit_still_speak(api_client):
    assert _speech(api_client, input="Hello there.").status_code == 200
    assert _speech(api_client, input=_padded_ssml("Hello there.", 1000)).status_code == 200


# ------------------------------------------------------------------------------------------ error text

INTERNAL = ("dict[any,any]", "list[any]", ".str`", ".float`", "Error:", "Error)", "Traceback", "NoneType",
            "fell over", "object at 0x")


@pytest.mark.parametrize("body", [
    {"input": "Hi.", "voice": 5},
    {"input": "Hi.", "voice": ["Narrator"]},
    {"input": "Hi.", "loudness": [1]},
    {"input": "Hi.", "dictionary": 5},
    {"input": "Hi.", "dictionary": "a=b"},
], ids=["voice-number", "voice-list", "loudness-list", "dictionary-number", "dictionary-string"])
def test_a_wrong_type_is_named_in_words(api_client, body):
    r = _speech(api_client, **body)
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    field = next(k for k in body if k != "input")
    assert f"`{field}`" in message and not any(text in message for text in INTERNAL), message


@pytest.mark.parametrize("raw", [b"{", b'{"input": "Hi.",}', b'{"input": "\xff"}'],
                         ids=["cut", "trailing-comma", "not-utf8"])
def test_broken_json_is_answered_in_words(api_client, raw):
    r = api_client.post("/v1/audio/speech", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "not valid JSON" in message and "(char " not in message and "codec" not in message, message


@pytest.mark.parametrize("fmt", ["flac", "pcm"])
def test_an_unexpected_failure_says_so_without_its_internals(api_client, fmt):
    """The scripted engine raises RuntimeError("the engine fell over") for this text: the client hears a
    generic sentence (the details go to the log), never the exception."""
    r = _speech(api_client, input="crash now", response_format=fmt)
    assert r.status_code == 500
    message = r.json()["error"]["message"]
    assert "log" in message and not any(internal in message for internal in INTERNAL), message
