"""A client of the studio's live route for tests and benchmarks: page tokens as a page load gets them, and live
takes read line by line in their own threads, from a chosen local address (two addresses are two visitors);
and the page's side of it in Chromium (Playwright): the outside hooks that see when audio reaches the output,
Heard as they measure it, and opening the studio page and generating a take on it."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx


def client(url: str, address: str = "127.0.0.1", **kw) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, transport=httpx.HTTPTransport(local_address=address), **kw)


def page_token(http: httpx.Client) -> str:
    """A fresh page token, as a page load gets it (the load event that fills the live player)."""
    config = http.get("/config").json()
    for fn_index, dep in enumerate(config["dependencies"]):
        if any(trigger == "load" for _, trigger in dep["targets"]):
            r = http.post("/gradio_api/run/predict", json={"data": [], "fn_index": fn_index, "session_hash": "t"})
            found = re.search(r'data-token=\\?"([0-9]+\.[0-9a-f]+)', r.text)
            if found:
                return found.group(1)
    raise AssertionError("no load event issued a page token")


def live_fields(text: str = "Hello from a visitor.", **fields) -> dict:
    return {"text": text, "style": "", "voice": "", "clip_text": "", "temperature": 0.8, "top_p": 0.8, "top_k": 30,
            "seed": 11, "max_frames": 40, "repeat_guard": 0, **fields}


# Hooks set before the page's own scripts: the Generate click, the three ways audio can reach the output (a
# worklet's input through `MessagePort.postMessage`, `AudioBufferSourceNode.start` at its scheduled time, and
# media `playing` events) and the page's fetches (Gradio's own requests among them), each with its
# performance.now().
PROBE = """
window.__probe = {clicks: [], pcm: [], starts: [], playing: [], fetches: []};
const fetch0 = window.fetch;
window.fetch = function (resource, ...rest) {
  __probe.fetches.push({url: String(resource instanceof Request ? resource.url : resource), t: performance.now()});
  return fetch0.call(this, resource, ...rest);
};
document.addEventListener('click', (e) => {
  if (e.target.closest && e.target.closest('#generate-btn')) __probe.clicks.push(performance.now());
}, true);
document.addEventListener('playing', () => __probe.playing.push(performance.now()), true);
const post = MessagePort.prototype.postMessage;
MessagePort.prototype.postMessage = function (message, ...rest) {
  if (message && message.pcm instanceof Int16Array) __probe.pcm.push({t: performance.now(), data: message.pcm.slice()});
  return post.call(this, message, ...rest);
};
const start = AudioBufferSourceNode.prototype.start;
AudioBufferSourceNode.prototype.start = function (when = 0, ...rest) {
  const ahead = Math.max(0, when - this.context.currentTime);
  __probe.starts.push(performance.now() + 1000 * ahead);
  return start.call(this, when, ...rest);
};
"""

# Heard, seen from outside: the first moment after the click that audio was handed to the output.
HEARD = """() => {
  const p = window.__probe, click = p.clicks[p.clicks.length - 1];
  const after = [...p.pcm.map((x) => x.t), ...p.starts, ...p.playing].filter((t) => t >= click);
  return after.length ? Math.min(...after) - click : null;
}"""


def open_page(browser, url, *, init: str = ""):
    """The studio page in a new Chromium page with the hooks in, the repeat guard off."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1200})
    pg.add_init_script(PROBE + init)
    pg.goto(url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    pg.wait_for_function("() => window.__hsLive !== undefined", timeout=60_000)
    pg.get_by_text("Advanced").click()
    pg.fill("#repeat-guard input", "0")  # the demo's random weights repeat; keep takes their full length
    return pg


def generate(pg, text: str, frames: int, seed: int = 1, repeat_guard: int | None = None) -> None:
    """A take of `frames` frames. The seed is fixed: the demo's random weights sample the stop token now and
    then (a 110-frame take once ended at 76), and with a fixed seed the CPU take is the same on every run.
    `repeat_guard=0` turns the guard off, so only the length cap (or Stop) ends the take."""
    pg.fill("#max-frames input", str(frames))
    pg.fill("#seed input", str(seed))
    if repeat_guard is not None:
        pg.fill("#repeat-guard input", str(repeat_guard))
    pg.fill("#text textarea", text)
    pg.click("#generate-btn")


class LiveTake(threading.Thread):
    """One live take read line by line in its own thread; `stop` closes the connection (which cancels it)."""

    _ids = iter(range(10**9))

    def __init__(self, http: httpx.Client, token: str, **fields):
        super().__init__(daemon=True)
        self.http, self.token, self.fields = http, token, fields
        self.lines: list[dict] = []
        self.posted = self.first_audio = self.ended = None
        self.stop = threading.Event()
        self.start()

    def run(self):
        body = {"request": json.dumps({**live_fields(**self.fields), "live_id": f"fair-take-{next(self._ids)}"})}
        self.posted = time.perf_counter()
        try:
            with self.http.stream("POST", "/studio/live", data=body, headers={"X-Studio-Token": self.token}) as r:
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    if not line:
                        continue
                    message = json.loads(line)
                    if message["type"] == "audio" and self.first_audio is None:
                        self.first_audio = time.perf_counter() - self.posted
                    self.lines.append(message)
        finally:
            self.ended = time.perf_counter()

    @property
    def frames(self) -> int:
        """The frames of a finished take (0 for one refused or stopped)."""
        return self.lines[-1]["metrics"]["frames"] if self.end == "done" else 0

    @property
    def end(self) -> str | None:
        return self.lines[-1]["type"] if self.lines and self.lines[-1]["type"] in ("done", "error") else None


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
