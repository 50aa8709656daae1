"""Limits of a public studio (docs/SPACES.md "Limits"): a full queue answers with a sentence, and text and
take length are held to the public limits for visitors while the owner's key has the service's own."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import gradio as gr
import pytest

from engine.delay import default_max_frames
from engine.types import SamplingParams
from studio.api.access import QUEUE_FULL, friendly_queue_full
from studio.takes.admission import OWNER, Caller
from studio.takes.limits import TakeLimits
from tests.studio_server import free_port


class Visitor:
    headers: dict = {}
    username = None


class Owner:
    headers = {"authorization": "Bearer k"}
    username = None


def test_text_and_length_limits_differ_for_visitors_and_the_key():
    limits = TakeLimits(max_input_chars=5000, public_max_chars=200, public_max_frames=250)
    visitor = Caller.visitor("203.0.113.9")
    with pytest.raises(ValueError, match="up to 200 characters at a time"):
        limits.check_text("a" * 201, visitor)
    with pytest.raises(ValueError, match=r"up to 250 frames \(10 s\)"):
        limits.hold(SamplingParams(max_frames=251), "Hi.", visitor)
    assert limits.hold(SamplingParams(), "word " * 40, visitor).max_frames == 250
    owners = SamplingParams(max_frames=3000)
    assert limits.hold(owners, "a" * 5000, OWNER) is owners  # the key: only the studio's own limits
    limits.check_text("a" * 5000, OWNER)
    held = limits.hold(SamplingParams(seed=3), "Hi.", visitor)  # "auto" becomes the text's own length, capped
    assert held == SamplingParams(seed=3, max_frames=min(default_max_frames("Hi."), 250))
    with pytest.raises(ValueError, match="the limit for one take is 5000"):
        limits.check_text("a" * 5001, OWNER)


def test_a_full_queue_answers_with_a_sentence():
    release = threading.Event()

    def slow(x):
        release.wait(30)
        return x

    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(slow, box, box, api_name="slow", concurrency_limit=1)
    demo.queue(max_size=1)
    friendly_queue_full(demo)
    port = free_port()
    demo.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        def join(session):
            body = json.dumps({"data": ["x"], "fn_index": 0, "session_hash": session, "event_data": None,
                               "trigger_id": None}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/gradio_api/queue/join", body,
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        answers = [join(f"s{i}") for i in range(4)]  # one runs, one waits, the rest find the queue full
        full = [a for a in answers if a[0] == 503]
        assert full, answers
        assert all(QUEUE_FULL.format(size=1) in text for _, text in full)
        assert "Max size" not in json.dumps(answers)
    finally:
        release.set()
        demo.close()
