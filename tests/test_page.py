"""Page handlers in-process, over the service with a scripted engine: the queue position shown while a take
waits behind another request, Stop, style presets, and "use these settings"."""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import replace

import pytest

from studio import render
from studio.page import Page
from studio.presets import PresetStore
from studio.service import StudioService, SynthesisRequest
from tests.test_service import FakeEngine


@pytest.fixture
def page(tmp_path):
    service = StudioService(FakeEngine(frames=20, delay=0.01), None, PresetStore(tmp_path / "presets.json"))
    page = Page(service)
    page.build()
    yield page
    service.close()


def gen_args(text, **kw):
    args = dict(text=text, style="", voice="", clip=None, clip_text="", temperature=0.8, top_p=0.8, top_k=30,
                seed=5, max_frames=0, repeat_guard=32, takes_n=1, takes=[], request=None)
    args.update(kw)
    return args


def test_generate_reports_queue_position_then_streams(page):
    holder = SynthesisRequest(text="API take holding the GPU.", seed=1, max_frames=10_000 // 10)
    threading.Thread(target=lambda: list(page.service.stream(holder)), daemon=True).start()
    while holder.text not in page.service.engine.started:  # the holder is running on the GPU worker
        time.sleep(0.01)
    updates = page.generate(**gen_args("Page take."))
    notes = []
    for update in updates:
        html = update.get(page.metrics, "")
        notes.append(html)
        if "queue position 2" in html:
            holder.cancel.set()  # the API take stops; the page's take runs next
        if page.result in update:
            result = update[page.result]
    assert any("queue position 2" in n for n in notes)
    assert any("streaming" in n for n in notes)
    assert result["metrics"]["stop_reason"] == "eoc" and result["recipe"]["seed"] == 5
    assert holder.take.stop_reason == "cancelled"


def test_stop_cancels_the_sessions_take(page):
    page.service.engine.frames = 10_000
    updates = page.generate(**gen_args("Long take."))
    while "streaming" not in next(updates).get(page.metrics, ""):  # until the take is running
        pass
    metrics, take_audio, *_ = page.stop([], None)
    assert "stopped" in metrics and take_audio.endswith(".wav")
    assert page.service.history[-1].stop_reason == "cancelled"
    updates.close()


def test_save_style_preset_and_use_settings(page):
    update = page._save_preset("My calm", "<|emotion:contentment|>")
    assert update["value"] == "<|emotion:contentment|>"
    assert ("My calm", "<|emotion:contentment|>") in page.style_choices()
    list(page.generate(**gen_args("Again.", style="<|emotion:contentment|>", temperature=0.5, seed=42)))
    take = page.service.history[-1]
    text, style, voice, temperature, top_p, top_k, seed, max_frames, guard = page._use_settings(take.id)
    assert (text, style, temperature, seed) == ("Again.", "<|emotion:contentment|>", 0.5, 42)


def test_handler_mistakes_become_warnings_not_errors(page):
    skip = {"__type__": "update"}
    # A plain-language "style" would be read aloud: refused with a warning, the outputs left as they were.
    with pytest.warns(UserWarning, match="Unknown style preset"):
        assert page._save_preset("Bad", "speak slowly please") == skip
    with pytest.warns(UserWarning, match="Select a take"):
        assert page._use_settings(None) == (skip,) * 9


def test_take_files_follow_the_bounded_history(tmp_path):
    service = StudioService(FakeEngine(frames=2), None, None, history_size=2)
    page = Page(service)
    page.build()
    for i in range(4):
        list(page.generate(**gen_args(f"Take {i}.", seed=i)))
        page.take_file(service.history[-1], "flac")
    names = sorted(p.name for p in page.out_dir.iterdir())
    assert names == ["take-3-seed2.flac", "take-3-seed2.wav", "take-4-seed3.flac", "take-4-seed3.wav"]
    service.close()


def test_recipe_curl_reproduces_the_take_over_http(page):
    list(page.generate(**gen_args("It's a test.", style="<|emotion:awe|>", seed=9, max_frames=5)))
    cmd = render.recipe_curl(page.service.history[-1].recipe(), "http://host:1234/")
    words = shlex.split(cmd.replace("\\\n", " "))
    assert words[:3] == ["curl", "-s", "http://host:1234/v1/audio/speech"]
    body = json.loads(words[words.index("-d") + 1])
    assert body["input"] == "It's a test." and body["instructions"] == "<|emotion:awe|>"
    assert (body["seed"], body["max_frames"], body["voice"]) == (9, 5, "default")


def test_render_palette_estimate_and_metrics():
    palette = render.palette_html()
    assert palette.count("data-tag=") == 43 and "data-tag=\"&lt;|sfx:laughter|&gt;\"" in palette
    est = render.estimate_html("Hello <|bogus|> there.", max_frames=50)
    assert "budget 50 frames" in est and "bogus" in est and 'class="hs-lint error"' in est
    assert "auto" in render.estimate_html("Hello there.")
    empty = render.metrics_html()
    assert 'id="m-ttfa">—<' in empty and 'id="m-state">idle<' in empty
    from tests.test_service import FakeMetrics
    html = render.metrics_html(FakeMetrics(frames=50, seed=3, stop_reason="eoc"), state="done", seconds=2.0)
    assert 'id="m-frames">50<' in html and 'id="m-stop">eoc<' in html
    demo = render.header_html({"checkpoint": "/x/demo-checkpoint-v1", "device": "cpu", "demo": True})
    assert "demo-checkpoint-v1" in demo and 'id="demo-banner"' in demo
    assert "demo-banner" not in render.header_html({"checkpoint": "bosonai/higgs-tts-3-4b", "demo": False})


def test_stop_after_gradio_closed_the_generator_still_shows_the_partial_take(page):
    # Stop's `cancels=` may close the generator before Stop's own handler runs.
    page.service.engine.frames = 10_000
    updates = page.generate(**gen_args("Long take."))
    while "streaming" not in next(updates).get(page.metrics, ""):
        pass
    updates.close()
    metrics, take_audio, *_ = page.stop([], None)
    assert "stopped" in metrics and take_audio.endswith(".wav")
    assert page.stop([], None) == ({"__type__": "update"},) * 6  # nothing left to stop


def test_picking_a_preset_takes_its_suggested_temperature(page):
    whisper = page.service.presets.get("Whisper")
    assert page._style_temperature(whisper.prefix) == whisper.temperature
    assert page._style_temperature("<|emotion:awe|>") == {"__type__": "update"}  # typed tags: leave it


def test_without_ffmpeg_takes_still_play(monkeypatch, tmp_path):
    monkeypatch.setattr("studio.page.ffmpeg_path", lambda: None)
    service = StudioService(FakeEngine(frames=30), None, None)
    page = Page(service)
    page.build()
    assert page.streaming is False and page.live.streaming is False
    updates = list(page.generate(**gen_args("No ffmpeg here.")))
    assert all(page.live not in u or u[page.live] is None for u in updates)  # nothing streamed
    assert updates[-1][page.take_audio].endswith(".wav")
    service.close()


def test_three_takes_have_the_next_seeds_side_by_side_and_keep_puts_one_in_the_history(tmp_path):
    from tests.test_service import batched_engine

    engine = batched_engine(frames=20, delay=0.01)
    engine.info = replace(engine.info, max_batch=4)
    service = StudioService(engine, None, None)
    page = Page(service)
    page.build()
    final = list(page.generate(**gen_args("Three ways.", seed=41, takes_n=3)))[-1]
    ids = final[page.variant_ids]
    takes = [service.take(i) for i in ids]
    assert [t.seed for t in takes] == [41, 42, 43] and all(t.text == "Three ways." for t in takes)
    assert final[page.variants_row]["visible"] and [final[c]["visible"] for c in page.variant_cols] == [True] * 3 + [False]
    assert all(final[a].endswith(f"seed{t.seed}.wav") for a, t in zip(page.variant_audio, takes))
    assert 'id="variant-seed-2">43<' in final[page.variant_info[2]]
    assert final[page.takes] == [ids[0]]  # the first take (the one the live player played) is in the history
    wav, _, rows, kept, last_seed = page._keep(2, ids, final[page.takes])
    assert kept == [ids[0], ids[2]] and last_seed == 43 and rows[0][0] == ids[2] and wav.endswith("seed43.wav")
    service.close()
