"""The studio's Gradio endpoints through gradio_client, against `python app.py --demo` in a subprocess:
`/generate` returns audio and metrics; `/stop` cancels a long take and the next request starts at once."""

from __future__ import annotations

import io
import json
import shlex
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from studio.views import render
from tests.studio_server import need_ffmpeg

gradio_client = pytest.importorskip("gradio_client")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def studio_url(demo_studio):
    need_ffmpeg()
    return demo_studio.url


def generate_args(text, **kw) -> list:
    """`/generate`'s inputs in order. The endpoint is "undocumented" (kept out of MCP, docs/SECURITY.md), so the
    client has no parameter names for it and takes them by position."""
    args = dict(text=text, style="", voice="", clip=None, clip_text="", temperature=0.8, top_p=0.8, top_k=30,
                seed=-1, max_frames=0, repeat_guard=32, takes_n=1, clean=False, clean_actions="speak", live_id="")
    args.update(kw)
    return list(args.values())


def test_generate_returns_audio_and_metrics(studio_url):
    client = gradio_client.Client(studio_url, verbose=False)
    live, metrics_html, take, download, history, result, *_side_by_side = client.predict(
        *generate_args("Hello from the test. <|emotion:bogus|>", seed=1234, max_frames=40), api_name="/generate")
    wav, sr = sf.read(take)
    assert sr == 24_000
    frames = result["metrics"]["frames"]
    assert 0 < frames <= 40 and len(wav) == frames * 960
    assert result["recipe"]["seed"] == 1234 and result["metrics"]["seed"] == 1234
    assert result["metrics"]["ttfa_ms"] > 0 and result["metrics"]["rtf"] > 0
    assert any("bogus" in w for w in result["warnings"])
    assert 'id="m-ttfa"' in metrics_html and "done" in metrics_html
    assert history["data"][0][4] == 1234  # the newest take first, with its seed
    assert live is not None  # the streamed playlist

    # Same seed, same settings: the same take (reproducibility is what the recipe promises).
    again = client.predict(*generate_args("Hello from the test. <|emotion:bogus|>", seed=1234, max_frames=40),
                           api_name="/generate")
    assert (sf.read(again[2])[0] == wav).all()

    # And the page's "reproduce over HTTP" command gives the same take through the OpenAI-compatible route.
    words = shlex.split(render.recipe_curl(result["recipe"], studio_url).replace("\\\n", " "))
    response = httpx.post(words[2], json=json.loads(words[words.index("-d") + 1]), timeout=120)
    assert response.status_code == 200, response.text
    assert np.array_equal(sf.read(io.BytesIO(response.content), dtype="int16")[0], sf.read(take, dtype="int16")[0])


def test_bad_request_is_a_message_not_a_crash(studio_url):
    client = gradio_client.Client(studio_url, verbose=False)
    with pytest.raises(Exception, match="empty"):
        client.predict(*generate_args("   "), api_name="/generate")
    with pytest.raises(Exception, match="not a known control tag|Unknown style"):
        client.predict(*generate_args("Hi.", style="<|emotion:nonsense|>"), api_name="/generate")
    # The server is still up and serving.
    assert client.predict(*generate_args("Still here.", max_frames=8), api_name="/generate")[5]["metrics"]["frames"]


def test_stop_cancels_a_long_take_and_the_next_starts_at_once(studio_url):
    client = gradio_client.Client(studio_url, verbose=False)
    # 3000 frames = 2 minutes of audio with the repeat guard off: minutes of CPU time if not stopped.
    job = client.submit(*generate_args("A very long take that we are going to stop.", max_frames=3000,
                                        repeat_guard=0, seed=7), api_name="/generate")
    deadline = time.monotonic() + 120
    while len(job.outputs()) < 2:  # "waiting" then the first streamed chunk
        assert time.monotonic() < deadline, "the long take never started streaming"
        time.sleep(0.1)
    t0 = time.monotonic()
    # The live id: none (this take is not the live player's); samples heard: 0, unknown (the take as made).
    stopped = client.predict("", 0, api_name="/stop")
    assert "stopped" in stopped[0] and "cancelled" in stopped[0]
    assert time.monotonic() - t0 < 10
    stopped_frames = sf.info(stopped[1]).frames // 960
    assert 0 < stopped_frames < 3000

    t1 = time.monotonic()
    result = client.predict(*generate_args("Next one.", max_frames=10, seed=1), api_name="/generate")[5]
    assert result["metrics"]["stop_reason"] in ("max_frames", "eoc", "repeat_guard")
    # It did not wait for the stopped take's remaining ~2900 frames.
    assert time.monotonic() - t1 < 30
    job.cancel()

