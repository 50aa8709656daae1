"""The studio in a real browser: headless Debian Chromium driven by Playwright against `app.py --demo`.

1. Type text, insert a tag from the palette, Generate: the live WebAudio player starts playing and the
   metrics panel shows numeric TTFA and RTF; the take lands in the history. Screenshot: artifacts/studio.png.
2. Upload a clip (espeak-ng speech), save it as a voice (consent required), generate with it.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.helpers import espeak_clip, wait_take_done
from tests.studio_server import need_ffmpeg

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NUMBER = re.compile(r"^\d+(\.\d+)?$")


@pytest.fixture(scope="module")
def studio_url(chromium, demo_studio):
    need_ffmpeg()
    return demo_studio.url


@pytest.fixture
def page(chromium, studio_url):
    """A fresh page (in a context of its own) of the file's one Chromium (tests/conftest.py)."""
    pg = chromium.new_page(viewport={"width": 1400, "height": 1200})
    pg.goto(studio_url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    yield pg
    pg.context.close()


def test_generate_streams_audio_and_shows_metrics(page, artifacts_dir):
    pg = page
    assert "Demo mode" in pg.inner_text("#demo-banner")
    pg.click("#text textarea")
    pg.keyboard.type("Hello there, this is the studio. ")
    pg.click("button[data-tag='<|sfx:laughter|>']")  # the palette inserts at the cursor, with no space after sfx
    pg.keyboard.type("Haha.")
    assert pg.input_value("#text textarea") == "Hello there, this is the studio. <|sfx:laughter|>Haha."
    pg.wait_for_function("() => document.querySelector('#plan')?.innerText.includes('one take')")

    pg.click("#generate-btn")
    # The live player starts playing while the take is produced (tests/test_live_player.py goes further).
    pg.wait_for_function("() => window.__hsLive?.take?.startedAt !== undefined", timeout=180_000)
    wait_take_done(pg)
    ttfa, rtf = pg.inner_text("#m-ttfa"), pg.inner_text("#m-rtf")
    assert NUMBER.match(ttfa) and float(ttfa) > 0, ttfa
    assert NUMBER.match(rtf) and float(rtf) > 0, rtf
    assert NUMBER.match(pg.inner_text("#m-frames"))
    pg.wait_for_function("() => document.querySelector('#history')?.innerText.includes('Hello there')")
    # The browser-side "heard" latency was measured (click to the live player's first sound).
    pg.wait_for_function("() => /^\\d+ ms$/.test(document.querySelector('#m-heard')?.innerText)", timeout=60_000)
    pg.screenshot(path=str(artifacts_dir / "studio.png"), full_page=True)

    # History: select the take, read its recipe, and load its settings back (seed included).
    seed = pg.inner_text("#m-seed")
    pg.locator("#history [role=gridcell]", has_text="Hello there").first.click()
    pg.wait_for_function(f"() => document.querySelector('#recipe')?.innerText.includes('{seed}')")
    pg.click("#use-settings")
    pg.wait_for_function(f"() => document.querySelector('#seed input')?.value === '{seed}'")
    pg.screenshot(path=str(artifacts_dir / "studio-history.png"), full_page=True)


def test_stop_ends_a_long_take(page):
    pg = page
    pg.get_by_text("Advanced").click()
    pg.fill("#max-frames input", "3000")
    pg.fill("#repeat-guard input", "0")
    pg.click("#text textarea")
    pg.keyboard.type("A long take to stop.")
    pg.click("#generate-btn")
    # The live player's state (the Gradio metrics panel shows 'streaming' instead with ?player=gradio).
    pg.wait_for_function("() => [...document.querySelectorAll('#m-state, #live-state')]"
                         ".some((e) => e.innerText === 'streaming')", timeout=120_000)
    pg.click("#stop-btn")
    # Not a speed claim: a loaded 2-core machine once took over 30 s to show the stop.
    pg.wait_for_function("() => document.querySelector('#m-state')?.innerText === 'stopped'", timeout=90_000)
    assert pg.inner_text("#m-stop") == "cancelled"
    assert int(pg.inner_text("#m-frames")) < 3000


def test_three_takes_play_side_by_side_and_keep_puts_one_in_the_history(page, studio_url, artifacts_dir):
    import io
    import urllib.request

    import soundfile as sf

    pg = page
    pg.get_by_text("Advanced").click()
    pg.fill("#max-frames input", "40")
    pg.fill("#repeat-guard input", "0")  # the demo's random weights repeat; keep takes their full length
    pg.fill("#seed input", "7")
    pg.fill("#text textarea", "Three takes of one line.")
    pg.click("#takes-n label:has-text('3')")
    pg.click("#generate-btn")
    wait_take_done(pg)
    pg.wait_for_selector("#variant-seed-2", timeout=120_000)
    assert [pg.inner_text(f"#variant-seed-{i}") for i in range(3)] == ["7", "8", "9"]
    assert not pg.is_visible("#variant-3")
    for i in range(3):  # each take is playable: its player serves a WAV of the take
        src = pg.evaluate(f"document.querySelector('#variant-{i} a.download-link')?.href")
        with urllib.request.urlopen(src if src.startswith("http") else studio_url + src, timeout=60) as r:
            samples, rate = sf.read(io.BytesIO(r.read()), dtype="int16")
        assert rate == 24_000 and 0 < len(samples) <= 40 * 960
    pg.screenshot(path=str(artifacts_dir / "studio-takes.png"), full_page=True)
    rows = "() => [...document.querySelectorAll('#history .virtual-row')]" \
           ".map((r) => [...r.querySelectorAll('[role=gridcell]')].map((cell) => cell.innerText.trim()))"
    assert pg.evaluate(rows)[0][4] == "7"  # the first take (the one the live player played) is in the history
    pg.click("#keep-2")
    pg.wait_for_function(f"() => ({rows})()[0]?.[4] === '9'", timeout=30_000)
    assert [r[4] for r in pg.evaluate(rows)[:2]] == ["9", "7"]


def test_save_voice_from_upload_then_generate_with_it(page, tmp_path, artifacts_dir):
    clip = tmp_path / "clip.wav"
    transcript = "The quick brown fox jumps over the lazy dog near the river bank."
    if shutil.which("espeak-ng"):
        espeak_clip(clip, transcript)
    else:  # a synthetic voiced signal: a 140 Hz buzz with a slow amplitude envelope
        import numpy as np
        import soundfile as sf
        t = np.arange(4 * 24_000) / 24_000
        sig = np.sign(np.sin(2 * np.pi * 140 * t)) * (0.3 + 0.2 * np.sin(2 * np.pi * 3 * t))
        sf.write(clip, (0.3 * sig).astype("float32"), 24_000)

    pg = page
    pg.get_by_text("Clone a voice").click()  # open the accordion
    pg.locator("#clip input[type=file]").set_input_files(str(clip))
    pg.fill("#clip-text textarea", transcript)
    pg.fill("#voice-name textarea", "Test Fox")
    pg.click("#save-voice")
    # Without consent the save is refused with a message, and nothing is saved.
    pg.wait_for_selector("text=consent", timeout=60_000)
    pg.check("#consent input[type=checkbox]")
    pg.click("#save-voice")
    pg.wait_for_function("() => document.querySelector('#voice input')?.value === 'Test Fox'", timeout=180_000)

    pg.click("#text textarea")
    pg.keyboard.type("Now in the saved voice.")
    pg.click("#generate-btn")
    wait_take_done(pg)
    assert NUMBER.match(pg.inner_text("#m-ttfa"))
    pg.wait_for_function("() => document.querySelector('#history')?.innerText.includes('Test Fox')")
    pg.screenshot(path=str(artifacts_dir / "studio-voice.png"), full_page=True)

    # Voices tab: select, rename, then delete (which needs the confirmation tick).
    pg.get_by_role("tab", name="Voices").click()
    pg.wait_for_function("() => document.querySelector('#voices-table')?.innerText.includes('Test Fox')")
    pg.locator("#voices-table [role=gridcell]", has_text="Test Fox").first.click()
    pg.wait_for_function("() => document.querySelector('#edit-name textarea')?.value === 'Test Fox'")
    pg.fill("#edit-name textarea", "Renamed Fox")
    pg.click("#edit-save")
    pg.wait_for_function("() => document.querySelector('#voices-table')?.innerText.includes('Renamed Fox')")
    pg.screenshot(path=str(artifacts_dir / "studio-voices-tab.png"), full_page=True)
    pg.click("#delete-voice")
    pg.wait_for_selector("text=nothing was deleted", timeout=30_000)
    assert "Renamed Fox" in pg.inner_text("#voices-table")
    pg.check("#delete-confirm input[type=checkbox]")
    pg.click("#delete-voice")
    pg.wait_for_function("() => !document.querySelector('#voices-table')?.innerText.includes('Renamed Fox')")


LONG_TEXT = "\n\n".join(
    f"Paragraph {n} begins here, calm and slow. It goes on for a while about the sea and the sky. "
    f"Then it ends with a short remark." for n in ("one", "two", "three", "four"))


def _long_take(pg, previous: str | None = None):
    """The Long form tab's take as downloaded: its file URL (once it differs from `previous`) and samples."""
    import io

    import httpx
    import numpy as np
    import soundfile as sf

    pg.wait_for_function("prev => { const a = document.querySelector('#long-take a[download]');"
                         " return a && a.href && a.href !== prev; }", arg=previous or "", timeout=180_000)
    src = pg.eval_on_selector("#long-take a[download]", "a => a.href")  # the take's download link
    samples, rate = sf.read(io.BytesIO(httpx.get(src, timeout=60).content), dtype="float32")
    assert rate == 24_000
    return src, np.asarray(samples)


def test_long_form_fills_the_segment_table_and_regenerates_one_row(page):
    import numpy as np

    pg = page
    pg.get_by_role("tab", name="Long form").click()
    pg.fill("#long-text textarea", LONG_TEXT)
    pg.click("#long-generate")
    pg.wait_for_function("() => document.querySelector('#long-progress')?.innerText.startsWith('Done')",
                         timeout=240_000)
    done = re.match(r"Done: (\d+) segments", pg.inner_text("#long-progress"))
    assert done and int(done.group(1)) >= 4  # the first segment is one sentence; none crosses a paragraph
    pg.wait_for_function("() => document.querySelector('#long-table')?.innerText.includes('Paragraph four')")
    first_src, first = _long_take(pg)

    pg.fill("#long-row input", "2")
    pg.fill("#long-row-seed input", "4242")
    pg.click("#long-regenerate")
    pg.wait_for_function("() => document.querySelector('#long-progress')?.innerText.includes('Row 2 generated')",
                         timeout=240_000)
    _, second = _long_take(pg, previous=first_src)
    n = min(len(first), len(second))
    differs = np.flatnonzero(first[:n] != second[:n])
    assert len(differs) or len(first) != len(second)  # the download has the new audio of row 2 ...
    assert not len(differs) or differs[0] > 0.5 * 24_000  # ... and row 1 (a sentence and its pause) is untouched
