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
from studio.access import QUEUE_FULL, Access, check_limits, friendly_queue_full
from studio.service import MAX_TEXT_CHARS, SynthesisRequest
from tests.studio_server import free_port


class Visitor:
    headers: dict = {}
    username = None


class Owner:
    headers = {"authorization": "Bearer k"}
    username = None


def test_text_and_length_limits_differ_for_visitors_and_the_key():
    access = Access("k", public_page=True, public_max_chars=200, public_max_frames=250)
    with pytest.raises(ValueError, match="up to 200 characters at a time"):
        access.limit_public(SynthesisRequest(text="a" * 201), Visitor())
    with pytest.raises(ValueError, match=r"up to 250 frames \(10 s\)"):
        access.limit_public(SynthesisRequest(text="Hi.", params=SamplingParams(max_frames=251)), Visitor())
    capped = access.limit_public(SynthesisRequest(text="word " * 40), Visitor())
    assert capped.params.max_frames == 250
    owners = SynthesisRequest(text="a" * MAX_TEXT_CHARS, params=SamplingParams(max_frames=3000))
    assert access.limit_public(owners, Owner()) is owners  # the key: only the service's own limits
    held = check_limits(SamplingParams(seed=3), access, "Hi.")  # the settings alone: "auto" becomes its length
    assert held == SamplingParams(seed=3, max_frames=min(default_max_frames("Hi."), 250))
    with pytest.raises(ValueError, match=f"the limit is {MAX_TEXT_CHARS}"):
        SynthesisRequest(text="a" * (MAX_TEXT_CHARS + 1)).validate()


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
