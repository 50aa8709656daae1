"""The live WebAudio player in real Chromium against `app.py --demo --api-key SECRET --public-page` (the page
itself needs no key: it carries its own session token, and a visitor's takes stay within the public limits).

Heard latency is measured from outside the page: an init script hooks the three ways audio can reach the
output (a worklet's input through `MessagePort.postMessage`, `AudioBufferSourceNode.start` at its scheduled
time, and media `playing` events) and the Generate click. The medians are printed for docs/PERFORMANCE.md;
no test asserts a time (the machine is shared): they assert behaviour, e.g. that sound starts before the take
has finished, that every sample of the take is played once, and that Stop silences the player.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import statistics
import time
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from tests.live_client import HEARD, LiveTake, client, generate, open_page, page_token, wait
from tests.studio_server import need_ffmpeg, running_studio

pytestmark = [pytest.mark.browser, pytest.mark.slow]

KEY = "SECRET"
TAKE_DONE = "() => ['done', 'stopped'].includes(document.querySelector('#m-state')?.innerText)"
LIVE_ENDED = "() => window.__hsLive?.take?.ended === true"

# SHA-256 of every sample handed to the worklet (int16 little-endian, in order), and how many there were.
PLAYED = """async () => {
  const parts = window.__probe.pcm.map((x) => x.data), n = parts.reduce((a, x) => a + x.length, 0);
  const all = new Int16Array(n);
  let at = 0;
  for (const x of parts) { all.set(x, at); at += x.length; }
  const digest = await crypto.subtle.digest('SHA-256', all.buffer);
  return {n, sha: Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('')};
}"""


@pytest.fixture(scope="module")
def studio_url(chromium, tmp_path_factory):
    need_ffmpeg()
    # A public page (no login; the page's own token), with room for the stop test's long take.
    with running_studio(tmp_path_factory.mktemp("live-player"), "--api-key", KEY, "--public-page",
                        "--public-max-seconds", "180") as url:
        yield url


@pytest.fixture
def browser(chromium):
    """The file's one Chromium (tests/conftest.py); each test's pages (a context each) are closed after it, players
    and all."""
    yield chromium
    for context in chromium.contexts:
        context.close()


def take_wav(pg, base: str) -> np.ndarray:
    """The finished take as the page's take player serves it (the Gradio event's output), as int16."""
    pg.wait_for_function("() => document.querySelector('#take a.download-link')?.href", timeout=60_000)
    src = pg.evaluate("document.querySelector('#take a.download-link').href")
    with urllib.request.urlopen(src if src.startswith("http") else base + src, timeout=60) as r:
        data, rate = sf.read(io.BytesIO(r.read()), dtype="int16")
    assert rate == 24_000
    return data


def live(pg) -> dict:
    return pg.evaluate("(() => { const t = window.__hsLive.take; return {heard: t.heard, ttfa: t.ttfa, "
                       "received: t.received, played: t.played, takeId: t.takeId, doneAt: t.doneAt, "
                       "startedAt: t.startedAt, silentMs: t.silentMs, stopped: !!t.stopped, error: t.error}; })()")


def finished(pg) -> dict:
    """The finished take as the metrics panel describes it: frames, seed and stop reason."""
    frames, seed, stop = (pg.inner_text(f"#m-{k}") for k in ("frames", "seed", "stop"))
    return {"frames": int(frames), "seed": seed, "stop": stop}


def health(base: str) -> dict:
    with urllib.request.urlopen(base + "/health", timeout=30) as r:
        return json.loads(r.read())


# The stages of Heard the page worked out for the latest take (studio/static/live.js `breakdown`), and when the
# page's Gradio event was sent (its queue request) against when the first audio reached the worklet.
STAGES = """() => {
  const p = window.__probe, click = p.clicks[p.clicks.length - 1];
  const first = p.pcm.find((x) => x.t >= click);
  const join = p.fetches.find((f) => f.t >= click && /queue\\/join/.test(f.url));
  return {b: window.__hsLive.take.breakdown, first: first && first.t - click, join: join && join.t - click};
}"""


def test_heard_latency(browser, studio_url):
    pg = open_page(browser, studio_url)
    assert pg.evaluate("window.__hsLive.supported") and not pg.is_visible("#live")
    outside, inside, ttfa, stages = [], [], [], []
    for i in range(5):
        generate(pg, f"Take {i}: long enough to tell the first sound from the end of the take.", 50)  # 2 s
        pg.wait_for_function(LIVE_ENDED, timeout=180_000)
        pg.wait_for_function(TAKE_DONE, timeout=180_000)
        t, take = live(pg), finished(pg)
        # Every sample of the take reached the player, and the take ran long enough (over a second) for
        # "sound before the end" to mean something.
        assert t["error"] is None and t["received"] == take["frames"] * 960 >= 24_000, (t, take)
        outside.append(pg.evaluate(HEARD))
        inside.append(t["heard"])
        ttfa.append(t["ttfa"])
        seen = pg.evaluate(STAGES)
        b = seen["b"]
        # The page's event went out after the first sound (it waits for it: nothing of Gradio's competes with
        # the take's first frames), and the breakdown accounts for the click → first samples, stage by stage.
        assert seen["join"] is not None and seen["join"] > seen["first"], seen
        assert all(b[k] is not None and b[k] >= 0 for k in ("page", "setup", "parse", "resolve", "handoff", "queue",
                                                              "prefill", "first_push", "back", "network", "browser",
                                                              "worklet")), b
        # (The hooks' stamps sit a postMessage apart from the page's own.)
        accounted = b["page"] + b["setup"] + b["server"] + b["network"] + b["browser"]
        assert accounted == pytest.approx(seen["first"], abs=10), (b, seen)
        stages.append(b)
        assert re.fullmatch(r"\d+ ms", pg.inner_text("#m-heard"))  # shown in the page too
        assert pg.inner_text("#live-note").startswith("click → request")
        pg.wait_for_function(f"() => document.querySelector('#history')?.innerText.includes('Take {i}')")
    median = {k: statistics.median(b[k] for b in stages) for k in stages[0]}
    print(f"\nheard (live WebAudio player, outside hooks) median {statistics.median(outside):.0f} ms over 5 takes "
          f"{[round(x) for x in outside]}; the page's own Heard median {statistics.median(inside):.0f} ms; "
          f"engine TTFA median {statistics.median(ttfa):.0f} ms; stages (medians, ms): "
          + ", ".join(f"{k} {v:.1f}" for k, v in median.items()))


def test_gapless_the_played_samples_are_the_takes_wav(browser, studio_url):
    pg = open_page(browser, studio_url)
    generate(pg, "A ten second take, played sample for sample.", 250)  # 10 s
    pg.wait_for_function(LIVE_ENDED, timeout=300_000)
    pg.wait_for_function(TAKE_DONE, timeout=180_000)
    t = live(pg)
    wav = take_wav(pg, studio_url)
    played = pg.evaluate(PLAYED)
    take = finished(pg)
    assert len(wav) == take["frames"] * 960 and played["n"] == len(wav) and t["played"] == len(wav), take
    assert played["sha"] == hashlib.sha256(wav.astype("<i2").tobytes()).hexdigest()
    print(f"\n10 s take: {played['n']} samples played, equal to the take's WAV; "
          f"underruns {pg.inner_text('#live-underruns')}")


def test_sound_before_the_take_ends_and_stop_silences_at_once_keeping_the_take(browser, studio_url):
    pg = open_page(browser, studio_url)
    # The guard off: the demo's random weights can repeat a frame, and a take the guard ended while the
    # second of audio played would end "repeat_guard", not by Stop.
    generate(pg, "A long take to stop while it plays.", 3000, repeat_guard=0)
    pg.wait_for_function("() => window.__hsLive.take?.played > 24000", timeout=180_000)  # a second has played
    pg.click("#stop-btn")
    pg.wait_for_function("() => window.__hsLive.take.silentMs !== undefined", timeout=30_000)
    handed = len(pg.evaluate("window.__probe.pcm"))
    pg.wait_for_function(TAKE_DONE, timeout=60_000)
    t = live(pg)
    # A second of sound played while the engine was still making the take: Stop then found it running
    # ("cancelled", with the guard off only the 3000-frame cap could have ended it), so the sound came before
    # the end of the take. (The 4.4 s takes of the latency test can be made faster than the first sound.)
    assert t["stopped"] and pg.inner_text("#m-stop") == "cancelled" and t["startedAt"] is not None
    assert len(pg.evaluate("window.__probe.pcm")) == handed  # nothing more reached the player after silence
    assert pg.inner_text("#live-state") == "stopped"
    pg.wait_for_function("() => document.querySelector('#history')?.innerText.includes('A long take to stop')")
    assert health(studio_url)["queue_depth"] == 0  # the server's take ended: the GPU is free
    assert 0 < len(take_wav(pg, studio_url)) < 3000 * 960  # the partial take is kept
    print(f"\nStop → silence in the page: {t['silentMs']:.1f} ms")


def test_stop_before_the_first_sound_cancels_the_pages_event_and_leaves_generate_free(browser, studio_url):
    """The page's Gradio event waits for the first sound; Stop before it (here the take waits for the GPU: the
    visitor's own share is full) sends the event at once, so Stop's handler cancels it as it always did and
    Generate answers the next click (Gradio skips a click while the event runs; sent after Stop, the event
    would wait 10 s for a take that never ran)."""
    pg = open_page(browser, studio_url)
    http = client(studio_url)  # the page's address: the same visitor
    # 120 s takes: they hold the share for the whole test however fast the machine (stopped at its end).
    holders = [LiveTake(http, page_token(http), text="Holding the visitor's share.", max_frames=3000, seed=i)
               for i in range(2)]
    try:
        wait(lambda: all(t.first_audio is not None for t in holders), 120, "the visitor's share to run")
        generate(pg, "A take that waits its turn.", 50)
        pg.click("#stop-btn")
        first = pg.evaluate("window.__hsLive.take.id")
        assert live(pg)["stopped"] and live(pg)["received"] == 0  # stopped before any audio
        pg.wait_for_function("() => window.__probe.fetches.some((f) => /gradio_api\\/cancel/.test(f.url))")
        pg.wait_for_timeout(1000)  # the page's event is cancelled on the server too
        deadline = time.monotonic() + 7
        while pg.evaluate("window.__hsLive.take.id") == first:
            assert time.monotonic() < deadline, "Generate did not start a take after Stop"
            pg.click("#generate-btn")
            pg.wait_for_timeout(500)
        pg.click("#stop-btn")
    finally:
        for take in holders:
            take.stop.set()
        for take in holders:
            take.join(60)
    wait(lambda: health(studio_url)["queue_depth"] == 0, 60, "the line to empty")


def test_two_tabs_each_play_their_own_take(browser, studio_url):
    """The second tab's take starts while the first is still being made (the engine batches them) and each tab
    plays its own take, whole. The first is up to 12 s of audio, made in a few seconds on the CPU and played in
    real time."""
    first, second = open_page(browser, studio_url), open_page(browser, studio_url)
    generate(first, "First tab, a long take.", 300)
    first.wait_for_function("() => window.__hsLive.take?.received > 0", timeout=180_000)
    generate(second, "Second tab, a short take.", 50)
    for pg, text in ((first, "First tab"), (second, "Second tab")):
        pg.wait_for_function(LIVE_ENDED, timeout=300_000)
        pg.wait_for_function(TAKE_DONE, timeout=180_000)
        pg.wait_for_function(f"() => document.querySelector('#history')?.innerText.includes('{text}')")
        wav = take_wav(pg, studio_url)
        played = pg.evaluate(PLAYED)
        assert live(pg)["heard"] is not None and len(wav) == finished(pg)["frames"] * 960
        assert played["sha"] == hashlib.sha256(wav.astype("<i2").tobytes()).hexdigest()  # its own take, whole
    assert live(first)["takeId"] != live(second)["takeId"]
    assert "First tab" not in second.inner_text("#history")


def test_the_stream_route_needs_the_page_token_or_the_key(browser, studio_url):
    body = json.dumps({"text": "Scripted.", "voice": "", "max_frames": 2, "live_id": "scripted-1234",
                       "temperature": 0.8, "top_p": 0.8, "top_k": 30, "seed": 1, "repeat_guard": 0})
    boundary = "hsboundary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"request\"\r\n\r\n{body}\r\n"
            f"--{boundary}--\r\n").encode()

    def call(headers):
        req = urllib.request.Request(studio_url + "/studio/live", data=form, method="POST", headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}", **headers})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    status, text = call({})
    assert status == 401 and "reload the page" in text
    assert call({"X-Studio-Token": "4102444800.forged"})[0] == 401
    status, text = call({"Authorization": f"Bearer {KEY}"})
    lines = [json.loads(line) for line in text.strip().splitlines() if line]
    assert status == 200 and lines[-1]["type"] == "done"
    # The stream carries its timeline: the first audio line the stamps known by then, the done line all of
    # them, in the order a take passes them (ms since the request arrived).
    order = ["parsed", "ready", "asked", "chunk", "line", "written"]
    first = next(m for m in lines if m["type"] == "audio")
    assert list(first["timeline"]) == order[:5] and list(lines[-1]["timeline"]) == order
    stamps = [lines[-1]["timeline"][k] for k in order]
    assert stamps == sorted(stamps) and stamps[0] >= 0 and first["timeline"] == {k: lines[-1]["timeline"][k]
                                                                                for k in order[:5]}
    assert sum("timeline" in m for m in lines if m["type"] == "audio") == 1
    # The page carries its own token: it generates without the key (the other tests do the same).
    pg = open_page(browser, studio_url)
    generate(pg, "The page works with the key set.", 25)
    pg.wait_for_function(LIVE_ENDED, timeout=180_000)
    assert live(pg)["error"] is None and live(pg)["heard"] is not None


def test_a_one_off_clip_travels_with_the_live_stream(browser, studio_url, tmp_path):
    clip = tmp_path / "clip.wav"
    t = np.arange(3 * 24_000) / 24_000
    sf.write(clip, (0.3 * np.sign(np.sin(2 * np.pi * 140 * t))).astype("float32"), 24_000)
    pg = open_page(browser, studio_url)
    pg.get_by_text("Clone a voice").click()
    pg.locator("#clip input[type=file]").set_input_files(str(clip))
    pg.fill("#clip-text textarea", "A buzz.")
    pg.wait_for_function("() => document.querySelector('#voice input')?.value.startsWith('Reference clip')",
                         timeout=60_000)
    requests = []
    pg.on("request", lambda r: requests.append(r) if r.url.endswith("/studio/live") else None)
    generate(pg, "Said in the clip's voice.", 25)
    pg.wait_for_function(LIVE_ENDED, timeout=180_000)
    pg.wait_for_function(TAKE_DONE, timeout=180_000)
    # The voice is the one-off clip: without the clip in the stream's form the route refuses with a sentence.
    assert len(requests) == 1 and "multipart/form-data" in requests[0].headers["content-type"]
    assert live(pg)["error"] is None and live(pg)["heard"] is not None


@pytest.mark.parametrize("how", ["flag", "no-worklet"])
def test_fallback_plays_through_the_gradio_player(browser, studio_url, how):
    init = "delete window.AudioWorkletNode;" if how == "no-worklet" else ""
    pg = open_page(browser, studio_url + ("/?player=gradio" if how == "flag" else ""), init=init)
    assert pg.evaluate("window.__hsLive.supported") is False and pg.is_visible("#live")
    requests = []
    pg.on("request", lambda r: requests.append(r.url))
    heard = []
    for i in range(5 if how == "flag" else 1):
        generate(pg, f"Fallback take {i}.", 100)
        pg.wait_for_function("() => { const a = document.querySelector('#live audio');"
                             " return a && a.src && a.readyState >= 2 && a.duration > 0; }", timeout=180_000)
        pg.wait_for_function(TAKE_DONE, timeout=180_000)
        pg.wait_for_function("() => /^\\d+ ms$/.test(document.querySelector('#m-heard')?.innerText)",
                             timeout=60_000)
        heard.append(pg.evaluate(HEARD))
        pg.wait_for_function(f"() => document.querySelector('#history')?.innerText.includes('Fallback take {i}')")
    assert not any("/studio/live" in url for url in requests)
    assert len(take_wav(pg, studio_url)) == finished(pg)["frames"] * 960 > 0, finished(pg)
    if how == "flag":
        print(f"\nheard (Gradio streaming player, fallback) median {statistics.median(heard):.0f} ms over 5 takes "
              f"{[round(x) for x in heard]}")


def test_the_worklet_recovers_from_an_underrun_without_a_click(browser, studio_url):
    """The player's AudioWorklet rendered offline: a 0.5 DC level runs dry mid-take, then resumes. A player that
    stops on a non-zero sample steps by 0.5 (a click); this one ramps. Every sample still plays exactly once.
    The module comes from the studio's static route, as the page's player loads it."""
    from studio.views.assets import ROUTE

    pg = open_page(browser, studio_url)
    result = pg.evaluate("""async (url) => {
      const rate = 24000, ctx = new OfflineAudioContext(1, rate, rate);
      await ctx.audioWorklet.addModule(url);
      const node = new AudioWorkletNode(ctx, 'hs-player', {numberOfInputs: 0, outputChannelCount: [1],
        processorOptions: {prebuffer: 1440, maxPrebuffer: 11520, fade: 120}});
      node.connect(ctx.destination);
      const seen = [];
      node.port.onmessage = (e) => seen.push(e.data);
      const chunk = (tail) => {  // 0.1 s at 0.5; the take's last chunk ramps itself down to 0 (its own ending)
        const x = new Int16Array(2400).fill(16384);
        for (let i = 0; i < tail; i++) x[2400 - tail + i] = Math.round(16384 * (1 - (i + 1) / tail));
        return x;
      };
      const settle = () => new Promise((r) => setTimeout(r, 300));  // let the message reach the worklet
      ctx.suspend(0).then(async () => { node.port.postMessage({pcm: chunk(0)}); await settle(); ctx.resume(); });
      ctx.suspend(0.4).then(async () => {  // the first chunk (0.1 s) ran dry long ago: an underrun
        node.port.postMessage({pcm: chunk(480)}); node.port.postMessage({end: true}); await settle(); ctx.resume();
      });
      const out = (await ctx.startRendering()).getChannelData(0);
      // The worklet's last messages may still be on their way when the rendering resolves.
      for (let i = 0; i < 50 && !seen.some((m) => m.type === 'drained'); i++) await settle();
      let step = 0, loud = 0;
      for (let i = 1; i < out.length; i++) step = Math.max(step, Math.abs(out[i] - out[i - 1]));
      for (const v of out) if (Math.abs(v - 0.5) < 1e-6) loud++;
      return {step, loud, seen};
    }""", f"{ROUTE}/player-worklet.js")
    kinds = [m["type"] for m in result["seen"]]
    drained = [m for m in result["seen"] if m["type"] == "drained"]
    assert "underrun" in kinds and drained and drained[0]["played"] == 4800
    # Starting, running dry and resuming move the output by one 5 ms ramp step at most (0.5 / 96 samples at
    # the underrun here), where a hard stop or start would jump by 0.5; the level in between is untouched.
    # Only the ramps (two 120-sample fade-ins, < 128 samples faded out) and the take's own 480-sample tail are
    # below the level.
    assert result["step"] < 0.02 and result["loud"] >= 4800 - 480 - 2 * 120 - 128
    print(f"\nunderrun: largest step between samples {result['step']:.4f} (a hard stop: 0.5)")
