"""Page handlers in-process, over the service with a scripted engine: the queue position shown while a take
waits behind another request, Stop, style presets, and "use these settings"."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import threading
import time

import pytest

from engine.types import Metrics, SamplingParams
from studio.views import panel, render
from studio.views.page import Page
from studio.text.presets import PresetStore
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine
from tests.helpers import gen_args


@pytest.fixture
def page(tmp_path):
    service = StudioService(FakeEngine(frames=20, delay=0.01), None, PresetStore(tmp_path / "presets.json"))
    page = Page(service)
    page.build()
    yield page
    service.close()


def test_generate_reports_queue_position_then_streams(page):
    holder = page.service.start(Order(text="API take holding the GPU.",
                                                 params=SamplingParams(seed=1, max_frames=10_000 // 10)))
    threading.Thread(target=lambda: list(holder.stream()), daemon=True).start()
    while holder.order.text not in page.service.engine.started:  # the holder is running on the GPU worker
        time.sleep(0.01)
    updates = page.takes.generate(**gen_args("Page take."))
    notes = []
    for update in updates:
        html = update.get(page.takes.metrics, "")
        notes.append(html)
        if "queue position 2" in html:
            holder.cancel.set()  # the API take stops; the page's take runs next
        if page.takes.result in update:
            result = update[page.takes.result]
    assert any("queue position 2" in n for n in notes)
    assert any("streaming" in n for n in notes)
    assert result["metrics"]["stop_reason"] == "eoc" and result["recipe"]["seed"] == 5
    assert holder.take.stop_reason == "cancelled"


def test_stop_cancels_the_sessions_take(page):
    page.service.engine.frames = 10_000
    updates = page.takes.generate(**gen_args("Long take."))
    while "streaming" not in next(updates).get(page.takes.metrics, ""):  # until the take is running
        pass
    metrics, take_audio, *_ = page.takes.stop([], None)
    assert "stopped" in metrics and take_audio.endswith(".wav")
    assert page.service.history[-1].stop_reason == "cancelled"
    updates.close()


def test_save_style_preset_and_use_settings(page):
    update = page.studio._save_preset("My calm", "<|emotion:contentment|>")
    assert update["value"] == "<|emotion:contentment|>"
    assert ("My calm", "<|emotion:contentment|>") in page.style_choices()
    list(page.takes.generate(**gen_args("Again.", style="<|emotion:contentment|>", temperature=0.5, seed=42)))
    take = page.service.history[-1]
    text, style, _voice, temperature, _top_p, _top_k, seed, _max_frames, _guard = page.takes._use_settings(take.id)
    assert (text, style, temperature, seed) == ("Again.", "<|emotion:contentment|>", 0.5, 42)


def test_handler_mistakes_become_warnings_not_errors(page):
    skip = {"__type__": "update"}
    # A plain-language "style" would be read aloud: refused with a warning, the outputs left as they were.
    with pytest.warns(UserWarning, match="Unknown style preset"):
        assert page.studio._save_preset("Bad", "speak slowly please") == skip
    with pytest.warns(UserWarning, match="Select a take"):
        assert page.takes._use_settings(None) == (skip,) * 9


def test_take_files_follow_the_bounded_history(tmp_path):
    service = StudioService(FakeEngine(frames=2), None, None, history_size=2)
    page = Page(service)
    page.build()
    for i in range(4):
        list(page.takes.generate(**gen_args(f"Take {i}.", seed=i)))
        page.takes.take_file(service.history[-1], "flac")
    names = sorted(p.name for p in page.out_dir.iterdir())
    assert names == ["take-3-seed2.flac", "take-3-seed2.wav", "take-4-seed3.flac", "take-4-seed3.wav"]
    service.close()


def test_recipe_curl_reproduces_the_take_over_http(page):
    list(page.takes.generate(**gen_args("It's a test.", style="<|emotion:awe|>", seed=9, max_frames=5)))
    cmd = render.recipe_curl(page.service.history[-1].recipe(), "http://host:1234/")
    words = shlex.split(cmd.replace("\\\n", " "))
    assert words[:3] == ["curl", "-s", "http://host:1234/v1/audio/speech"]
    body = json.loads(words[words.index("-d") + 1])
    assert body["input"] == "It's a test." and body["instructions"] == "<|emotion:awe|>"
    assert (body["seed"], body["max_frames"], body["voice"]) == (9, 5, "default")


def test_clean_chat_text_speaks_the_cleaned_text_and_the_alias_table_lists_the_names(page):
    raw = "## Plan\n\n*nods* Run `make` then read [this](https://example.com) 🎉"
    list(page.takes.generate(**gen_args(raw, clean=True, clean_actions="skip", seed=3, max_frames=4)))
    take = page.service.history[-1]
    assert take.text == "Plan.\n\nRun then read this." and page.service.engine.started[-1] == take.text
    list(page.takes.generate(**gen_args(raw, seed=3, max_frames=4)))  # off (the default): said as typed
    assert page.service.history[-1].text == raw
    with pytest.raises(Exception, match="nothing left to say"):
        list(page.takes.generate(**gen_args("```\ncode\n```", clean=True)))
    table = page.alias_table(None)
    assert "| `alloy` | style Neutral | built in |" in table and "| `nova` | style Excited | built in |" in table


def test_render_palette_and_metrics():
    palette = render.palette_html()
    assert palette.count("data-tag=") == 43 and "data-tag=\"&lt;|sfx:laughter|&gt;\"" in palette
    empty = panel.metrics_html()
    assert 'id="m-ttfa">—<' in empty and 'id="m-state">idle<' in empty
    html = panel.metrics_html(Metrics.blank(frames=50, seed=3, stop_reason="eoc"), state="done", seconds=2.0)
    assert 'id="m-frames">50<' in html and 'id="m-stop">eoc<' in html
    demo = render.header_html({"checkpoint": "/x/demo-checkpoint-v1", "device": "cpu", "demo": True})
    assert "demo-checkpoint-v1" in demo and 'id="demo-banner"' in demo
    assert "demo-banner" not in render.header_html({"checkpoint": "bosonai/higgs-tts-3-4b", "demo": False})


def test_stop_after_gradio_closed_the_generator_still_shows_the_partial_take(page):
    # Stop's `cancels=` may close the generator before Stop's own handler runs.
    page.service.engine.frames = 10_000
    updates = page.takes.generate(**gen_args("Long take."))
    while "streaming" not in next(updates).get(page.takes.metrics, ""):
        pass
    updates.close()
    metrics, take_audio, *_ = page.takes.stop([], None)
    assert "stopped" in metrics and take_audio.endswith(".wav")
    assert page.takes.stop([], None) == ({"__type__": "update"},) * 6  # nothing left to stop


def test_picking_a_preset_takes_its_suggested_temperature(page):
    whisper = page.service.presets.get("Whisper")
    assert page.studio._style_temperature(whisper.prefix) == whisper.temperature
    assert page.studio._style_temperature("<|emotion:awe|>") == {"__type__": "update"}  # typed tags: leave it


def test_without_ffmpeg_takes_still_play(monkeypatch, tmp_path):
    monkeypatch.setattr("studio.views.page.ffmpeg_path", lambda: None)
    service = StudioService(FakeEngine(frames=30), None, None)
    page = Page(service)
    page.build()
    assert page.streaming is False and page.takes.live.streaming is False
    updates = list(page.takes.generate(**gen_args("No ffmpeg here.")))
    assert all(page.takes.live not in u or u[page.takes.live] is None for u in updates)  # nothing streamed
    assert updates[-1][page.takes.take_audio].endswith(".wav")
    service.close()


def test_three_takes_have_the_next_seeds_side_by_side_and_keep_puts_one_in_the_history(tmp_path):
    engine = FakeEngine(frames=20, delay=0.01, max_batch=4)
    service = StudioService(engine, None, None)
    page = Page(service)
    page.build()
    final = list(page.takes.generate(**gen_args("Three ways.", seed=41, takes_n=3)))[-1]
    ids = final[page.takes.variant_ids]
    takes = [service.take(i) for i in ids]
    assert [t.seed for t in takes] == [41, 42, 43] and all(t.text == "Three ways." for t in takes)
    assert final[page.takes.variants_row]["visible"]
    assert [final[c]["visible"] for c in page.takes.variant_cols] == [True] * 3 + [False]
    assert all(final[a].endswith(f"seed{t.seed}.wav") for a, t in zip(page.takes.variant_audio, takes))
    assert 'id="variant-seed-2">43<' in final[page.takes.variant_info[2]]
    assert final[page.takes.takes] == [ids[0]]  # the first take (the one the live player played) is in the history
    metrics, wav, _, rows, kept, last_seed, kept_id = page.takes._keep(2, ids, final[page.takes.takes])
    assert kept == [ids[0], ids[2]] and last_seed == 43 and rows[0][0] == ids[2] and wav.endswith("seed43.wav")
    assert kept_id == ids[2] and rows[0][5] == "kept" and f"take #{ids[2]} · kept" in metrics
    service.close()


def test_the_page_scripts_and_stylesheet_are_the_static_files_the_app_serves(page):
    """The palette's and the player's scripts are the files in studio/static/, the stylesheet goes to launch(),
    and the worklet the player loads is served where live.js asks for it."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio.views import assets
    from studio.views.page import launch_kwargs

    assert page.takes.live_panel.js_on_load == assets.script("live.js")
    assert ".hs-live" in launch_kwargs()["css_paths"][0].read_text()
    assert f"'{assets.ROUTE}/player-worklet.js'" in assets.script("live.js")
    app = FastAPI()
    assets.mount(app)
    r = TestClient(app).get(f"{assets.ROUTE}/player-worklet.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert "registerProcessor('hs-player'" in r.text
    typeahead = next(b for b in page.build().blocks.values() if getattr(b, "elem_id", None) == "typeahead")
    assert typeahead.js_on_load == assets.script("typeahead.js") and 'id="typeahead-toggle"' in typeahead.value


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed: the scripts' syntax is not checked")
@pytest.mark.parametrize("name", ["live.js", "palette.js", "player-worklet.js", "typeahead.js", "captions.js"])
def test_the_page_scripts_parse(name):
    from studio.views.assets import STATIC_DIR

    result = subprocess.run(["node", "--check", str(STATIC_DIR / name)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_sliders_span_the_engines_limits_and_start_at_its_defaults(page):
    import gradio as gr

    from engine import types

    controls = {c.elem_id or c.label: c for c in page.build().blocks.values() if isinstance(c, (gr.Slider, gr.Number))}
    temperature, top_p, top_k = controls["temperature"], controls["top-p"], controls["top-k (0 = off)"]
    assert (temperature.minimum, temperature.maximum, temperature.value) == (0, types.MAX_TEMPERATURE,
                                                                             types.DEFAULT_TEMPERATURE)
    assert (top_p.maximum, top_p.value) == (types.MAX_TOP_P, types.DEFAULT_TOP_P)
    assert 0 < top_p.minimum <= top_p.step  # top_p's range is open at 0: the slider starts one step up
    assert (top_k.minimum, top_k.maximum, top_k.value) == (0, types.TOP_K_SLIDER_MAX, types.DEFAULT_TOP_K)
    assert controls["repeat-guard"].value == types.DEFAULT_REPEAT_GUARD
    assert controls["repeat-guard"].minimum == 0 < types.MIN_REPEAT_GUARD  # 0 is "off" on the page
    assert controls["max-frames"].maximum == types.MAX_FRAMES and controls["seed"].maximum == types.MAX_SEED
    # Every value a slider offers is one SamplingParams accepts.
    types.SamplingParams(temperature=temperature.maximum, top_p=top_p.minimum, top_k=int(top_k.maximum),
                         max_frames=int(controls["max-frames"].maximum), seed=int(controls["seed"].maximum))


def test_the_browser_draws_seeds_as_the_engine_does():
    """A seed the live player draws (several takes, random seed) has engine.types' bits: it reads them from
    the panel the server renders, so the one number lives in engine/types.py."""
    from engine.types import DRAWN_SEED_BITS
    from studio.views.assets import STATIC_DIR

    assert f'data-seed-bits="{DRAWN_SEED_BITS}"' in render.live_player_html("token")
    script = (STATIC_DIR / "live.js").read_text()
    assert "dataset.seedBits" in script and "2 ** 31" not in script


def test_the_player_and_the_route_spell_a_refused_stream_the_same():
    """The live id the player sends the page's event when the route refused its stream is the route's own."""
    from studio.views import live
    from studio.views.assets import STATIC_DIR

    assert f"const REFUSED_PREFIX = '{live.REFUSED_PREFIX}';" in (STATIC_DIR / "live.js").read_text()
    assert not live.LIVE_ID.match(live.REFUSED_PREFIX + "a" * 8)  # no stream's own id can be taken for it
