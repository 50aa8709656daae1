"""Retake the README's screenshots: every tab of the studio at a laptop's size (1366 × 900) and a phone's (390 × 844),
into docs/screenshots/<tab>-<size>.png.

    python scripts/screenshots.py            # starts `app.py --demo` on a free port, stops it when done
    python scripts/screenshots.py --url URL  # a studio already running

It drives Debian's Chromium (/usr/bin/chromium, `apt-get install chromium`) with Playwright, as the browser tests do.
The Studio tab is shown after one take (its metrics and player filled in); the demo model's audio is noise, the page
is the real one. Each picture is reduced to 256 colours, which keeps it small without blurring text.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--autoplay-policy=no-user-gesture-required", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SIZES = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
TABS = {"studio": "Studio", "voices": "Voices", "long-form": "Long form", "projects": "Projects"}
START_TIMEOUT_S = 300
TAKE_TIMEOUT_MS = 180_000
TEXT = "Welcome to Higgs Studio. <|emotion:elation|> Every take streams as it is made."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def demo_studio():
    """`app.py --demo` on a free port, its voices and projects in a temporary folder; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="higgs-screenshots-") as tmp:
        port = free_port()
        env = {**os.environ, "HIGGS_VOICES_DIR": f"{tmp}/voices", "HIGGS_PROJECTS_DIR": f"{tmp}/projects",
               "GRADIO_ANALYTICS_ENABLED": "False"}
        with open(Path(tmp) / "app.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "app.py", "--demo", "--port", str(port)], cwd=REPO, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, proc, Path(tmp) / "app.log")
                yield url
            finally:
                proc.terminate()
                proc.wait(30)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"app.py did not answer in {START_TIMEOUT_S} s")


def save_small(png: bytes, path: Path) -> None:
    """`png` reduced to 256 colours (text stays sharp; the file is a fraction of the size)."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256)
    image.save(path, optimize=True)
    print(f"{path.relative_to(REPO)}: {path.stat().st_size // 1024} KB")


def shoot(browser, url: str, size: str) -> None:
    page = browser.new_page(viewport=SIZES[size])
    page.goto(url)
    page.wait_for_selector("#generate-btn", timeout=60_000)
    page.fill("#text textarea", TEXT)
    page.click("#generate-btn")
    page.wait_for_function("() => ['done', 'stopped'].includes(document.querySelector('#m-state')?.innerText)",
                           timeout=TAKE_TIMEOUT_MS)
    page.wait_for_timeout(1500)  # the History row and the player settle
    for slug, name in TABS.items():
        page.get_by_role("tab", name=name).click()
        page.wait_for_timeout(800)
        page.evaluate("window.scrollTo(0, 0)")
        save_small(page.screenshot(), OUT / f"{slug}-{size}.png")
    page.context.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a studio already running (default: start `app.py --demo`)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(demo_studio())
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        for size in SIZES:
            shoot(browser, url, size)
        browser.close()


if __name__ == "__main__":
    main()
