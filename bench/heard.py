"""Heard latency in Chromium, stage by stage, on `app.py --demo --api-key … --public-page` (the page as a
Space serves it): `python -m bench.heard [--takes 5] [--frames 110] [--url http://…]`.

Each take is clicked on the studio page as tests/test_live_player.py::test_heard_latency does, and Heard is
measured the same way, from outside the page (tests/live_client.py `PROBE`: the click to the first samples
handed to the player's AudioWorklet). Its stages come from the page's own breakdown (studio/static/live.js
`breakdown`): the browser's marks around the server's timeline (studio/views/live.py `Timeline`) and the engine's
metrics, so the table says where the time between the click and the sound goes. After each page take the
same take is asked for by a plain HTTP client (tests/live_client.py `LiveTake`): its time to the first audio
line and its TTFA are the engine and the route without a browser or Gradio beside them, under the same
machine load. One row per take, then the median of each column. Debian's Chromium (/usr/bin/chromium)
through Playwright; the demo's weights are random, so the engine's share is the tiny model's.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from pathlib import Path

from bench.common import Table, machine_line
from tests.live_client import HEARD, LiveTake, client, generate, open_page, page_token
from tests.studio_server import running_studio
from tests.test_studio_browser import CHROMIUM, CHROMIUM_ARGS

KEY = "bench-heard-key"
ENDED = "() => window.__hsLive?.take?.ended === true && window.__hsLive.take.breakdown?.server != null"
DONE = "() => ['done', 'stopped'].includes(document.querySelector('#m-state')?.innerText)"

# (column, the breakdown's key, what it is), in the order the time passes.
STAGES = (("page", "page", "the click until Gradio's Generate hook calls the player (studio/views/studio.py CLICK_JS)"),
          ("setup", "setup", "the player's form and worklet node until the fetch is sent"),
          ("parse", "parse", "server: the request until its form is read and checked"),
          ("resolve", "resolve", "server: `service.start` (voice, style, tag lint)"),
          ("hand-off", "handoff", "server: the route's thread hop, the line's admission and the take's thread "
                                  "until the engine starts (voice and prompt preparation included)"),
          ("queue", "queue", "engine: waiting for a batch slot"),
          ("prefill", "prefill", "engine: the prompt's prefill"),
          ("first push", "first_push", "engine: decoding to the first codec push, and the push"),
          ("back", "back", "server: the chunk out of the line until its line is written"),
          ("network", "network", "the fetch's wait beyond the server's time: the connection, both ways"),
          ("browser", "browser", "the first bytes until the samples are posted to the worklet"),
          ("worklet", "worklet", "posted until the worklet reports its first sound (the page's Heard)"))


def text(i: int) -> str:
    return f"Take {i}: long enough to tell the first sound from the end of the take."


def page_take(pg, i: int, frames: int) -> list[float]:
    generate(pg, text(i), frames)
    pg.wait_for_function(ENDED, timeout=180_000)
    pg.wait_for_function(DONE, timeout=180_000)
    heard = pg.evaluate(HEARD)
    b = pg.evaluate("window.__hsLive.take.breakdown")
    pg.wait_for_function(f"() => document.querySelector('#history')?.innerText.includes('Take {i}')")
    return [heard, *(b[key] for _, key, _ in STAGES), b["ttfa"], b["heard"]]


def http_take(http, token: str, i: int, frames: int) -> list[float]:
    take = LiveTake(http, token, text=text(i), max_frames=frames, seed=1)
    take.join(300)
    assert take.end == "done", take.lines
    first = next(m for m in take.lines if m["type"] == "audio")
    return [1e3 * take.first_audio, first["metrics"]["ttfa_ms"]]


def run(url: str, takes: int, frames: int) -> Table:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            pg = open_page(browser, url)
            http = client(url)
            token = page_token(http)
            rows = [page_take(pg, i, frames) + http_take(http, token, i, frames) for i in range(takes)]
        finally:
            browser.close()
    columns = ["take", "Heard (outside)", *(name for name, _, _ in STAGES), "engine TTFA", "page's Heard",
               "HTTP first audio", "HTTP TTFA"]
    median = [statistics.median(v for v in col if v is not None) if any(v is not None for v in col) else None
              for col in zip(*rows)]
    return Table(f"Heard in Chromium, {takes} takes of {frames} frames, ms", columns,
                 [[i + 1, *row] for i, row in enumerate(rows)] + [["median", *median]])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--takes", type=int, default=5)
    ap.add_argument("--frames", type=int, default=110, help="frames per take (110 = 4.4 s; the test uses 50 = 2 s)")
    ap.add_argument("--url", help="a studio already running (else a demo studio is started)")
    args = ap.parse_args(argv)
    if not CHROMIUM.exists():
        raise SystemExit("Debian chromium is not installed at /usr/bin/chromium (apt-get install chromium)")
    print(machine_line(), flush=True)
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            url = stack.enter_context(running_studio(tmp, "--api-key", KEY, "--public-page"))
        table = run(url, args.takes, args.frames)
    print(table.markdown())
    print("\n" + "\n".join(f"- {name}: {what}" for name, _, what in STAGES))


if __name__ == "__main__":
    main()
