"""Private voices in a real browser: two Playwright contexts are two visitors of one `app.py --demo` started
as a Space starts (an owner's key, a public page, private voices). What A saves is A's alone: B sees it
neither on the page, nor through the API or the page's config, and the server never writes it to disk. A
reloads and still has it; A exports it, B imports the file, and then B has it."""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.request

import pytest

from tests.helpers import espeak_clip, wait_take_done
from tests.studio_server import KEY, need_ffmpeg

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TRANSCRIPT = "The quick brown fox jumps over the lazy dog near the river bank."
NAME = "Visitor Fox"


@pytest.fixture(scope="module")
def space(chromium, space_studio):
    """(url, tmp): the studio and the folder every file it writes lands under (its library, its temp files,
    Gradio's upload cache)."""
    need_ffmpeg()
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    return space_studio.url, space_studio.root


def owners_voice_list(url: str) -> str:
    req = urllib.request.Request(f"{url}/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def files_mentioning(root, text: str) -> list[str]:
    needle = text.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def table_has(pg, name: str, present: bool = True):
    pg.get_by_role("tab", name="Voices").click()
    op = "" if present else "!"
    pg.wait_for_function(f"() => {op}document.querySelector('#private-table')?.innerText.includes('{name}')",
                         timeout=60_000)


def test_a_visitors_voice_is_theirs_alone(space, chromium, tmp_path, artifacts_dir):
    url, server_tmp = space
    clip = tmp_path / "clip.wav"
    espeak_clip(clip, TRANSCRIPT)
    viewport = {"width": 1400, "height": 1200}
    with (contextlib.closing(chromium.new_context(viewport=viewport, accept_downloads=True)) as for_a,
          contextlib.closing(chromium.new_context(viewport=viewport)) as for_b):
        a, b = for_a.new_page(), for_b.new_page()
        for pg in (a, b):
            pg.goto(url)
            pg.wait_for_selector("#generate-btn", timeout=60_000)

        # A saves a voice from the clone panel; it lands in A's voice menu and A's Voices tab.
        a.get_by_text("Clone a voice").click()
        a.locator("#clip input[type=file]").set_input_files(str(clip))
        a.fill("#clip-text textarea", TRANSCRIPT)
        a.fill("#voice-name textarea", NAME)
        a.check("#consent input[type=checkbox]")
        a.click("#save-voice")
        a.wait_for_function(f"() => document.querySelector('#voice input')?.value === '{NAME} (yours)'",
                            timeout=180_000)
        # ... and A generates with it.
        a.click("#text textarea")
        a.keyboard.type("Now in my private voice.")
        a.click("#generate-btn")
        wait_take_done(a)
        # The history fills when the page's Gradio event ends, after the player: on a busy 2-core machine, late.
        a.wait_for_function(f"() => document.querySelector('#history')?.innerText.includes('{NAME}')",
                            timeout=180_000)
        table_has(a, NAME)
        a.screenshot(path=str(artifacts_dir / "space-private-voice.png"), full_page=True)

        # B sees nothing of it: not on the page, not in the voice menu, not through the API or the config.
        b.reload()
        b.wait_for_selector("#generate-btn", timeout=60_000)
        b.locator("#voice input").click()
        b.wait_for_selector("[role=option]", timeout=30_000)
        options = b.locator("[role=option]").all_inner_texts()
        assert any("zero-shot" in o for o in options) and not any(NAME in o for o in options), options
        b.keyboard.press("Escape")
        table_has(b, NAME, present=False)
        assert NAME not in owners_voice_list(url)
        with urllib.request.urlopen(f"{url}/config", timeout=30) as r:
            assert NAME not in r.read().decode()
        # Nor is it on the server's disk: no voice was written to the library, and no file (library, temp files,
        # Gradio's cache of A's upload, the server's log) names it.
        assert not [p for p in (server_tmp / "voices").iterdir() if p.name.startswith("v_")]
        assert files_mentioning(server_tmp, NAME) == []

        # A reloads: the voice is still there (it lives in A's browser).
        a.reload()
        a.wait_for_selector("#generate-btn", timeout=60_000)
        table_has(a, NAME)
        stored = a.evaluate("() => localStorage.getItem('higgs-studio-private-voices')")
        assert stored and NAME not in stored  # encrypted at rest in the browser

        # A exports; B imports the file and then has the voice.
        a.click("#private-export")
        link = a.locator("#private-export-file a").first
        link.wait_for(timeout=60_000)
        with a.expect_download() as download:
            link.click()
        bundle = tmp_path / "my-voices.zip"
        download.value.save_as(bundle)
        b.locator("#private-import input[type=file]").set_input_files(str(bundle))
        table_has(b, NAME)
        b.get_by_role("tab", name="Studio").click()
        b.locator("#voice input").click()
        b.wait_for_selector(f"[role=option]:has-text('{NAME} (yours)')", timeout=30_000)
    assert NAME not in json.dumps(owners_voice_list(url))
