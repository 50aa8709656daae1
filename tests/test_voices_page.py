"""The Voices tab in a real browser (headless Debian Chromium, Playwright) against `app.py --demo`: a zipped Higgs
preset folder imports (as the README says), its row reads whole, importing it again or a different voice of the
same name tells what happened and overwrites nothing, and Delete asks first and then says what it deleted."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
import soundfile as sf

from tests.helpers import speech_clip

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NAME = "Page Narrator (warm)"  # the studio's library is shared by the files using it: a name of this file's own
STATUS = "() => document.querySelector('#voices-status')?.innerText ?? ''"


def preset_zip(path, *, pitch: float) -> str:
    """A Higgs preset folder (config.json beside its clip), zipped as a folder."""
    rate, samples = speech_clip(pitch=pitch, seed=int(pitch))
    wav = io.BytesIO()
    sf.write(wav, samples, rate, format="WAV")
    config = {NAME: {"transcript": "A narrator reads the opening of the book, slowly and warmly.",
                     "audio_file": "narrator.wav"}}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("voice_examples/config.json", json.dumps(config))
        zf.writestr("voice_examples/narrator.wav", wav.getvalue())
    return str(path)


@pytest.fixture(scope="module")
def page(chromium, demo_studio):
    pg = chromium.new_page(viewport={"width": 1366, "height": 900})
    pg.goto(demo_studio.url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    pg.get_by_role("tab", name="Voices").click()
    pg.wait_for_selector("#voices-table")
    yield pg
    pg.context.close()


def upload(pg, path: str, expect: str) -> str:
    pg.set_input_files("#import-voices input[type=file]", path)
    pg.wait_for_function(f"() => ({STATUS})().includes({json.dumps(expect)})", timeout=60_000)
    return pg.evaluate(STATUS)


def test_a_zipped_preset_folder_imports_and_its_row_reads_whole(page, tmp_path):
    pg = page
    said = upload(pg, preset_zip(tmp_path / "presets.zip", pitch=150), "Imported 1 voice")
    assert f"'{NAME}'" in said
    pg.wait_for_function(f"() => document.querySelector('#voices-table')?.innerText.includes({json.dumps(NAME)})")
    cut = pg.evaluate("""() => [...document.querySelectorAll('#voices-table th, #voices-table [role=gridcell]')]
        .filter((c) => c.innerText.trim() && c.scrollWidth > c.clientWidth + 1).map((c) => c.innerText)""")
    assert cut == []  # no label cut to "rator)"
    widths = pg.evaluate("() => [...document.querySelectorAll('#voices-table th')].map((t) => t.clientWidth)")
    assert min(widths) >= 60, widths  # no column squeezed to a letter a line


def test_importing_again_tells_and_overwrites_nothing(page, tmp_path):
    pg = page
    said = upload(pg, preset_zip(tmp_path / "same.zip", pitch=150), "Already in the library")
    assert f"'{NAME}'" in said and "Imported" not in said
    said = upload(pg, preset_zip(tmp_path / "other.zip", pitch=260), "both are kept")
    assert f"'{NAME} (2)'" in said
    table = pg.inner_text("#voices-table")
    assert NAME in table and f"{NAME} (2)" in table


def test_delete_asks_first_then_says_what_it_deleted(page):
    pg = page
    pg.locator("#voices-table [role=gridcell]", has_text=f"{NAME} (2)").first.click()
    pg.wait_for_function(f"() => document.querySelector('#edit-name textarea')?.value === {json.dumps(NAME + ' (2)')}")
    pg.click("#delete-voice")
    pg.wait_for_function("() => [...document.querySelectorAll('.toast-body')].some((t) => "
                         "t.innerText.includes('nothing was deleted'))", timeout=30_000)
    assert f"{NAME} (2)" in pg.inner_text("#voices-table")
    pg.check("#delete-confirm input[type=checkbox]")
    pg.click("#delete-voice")
    pg.wait_for_function(f"() => ({STATUS})().includes('Deleted the voice')", timeout=30_000)
    assert f"'{NAME} (2)'" in pg.evaluate(STATUS)
    pg.wait_for_function(f"() => !document.querySelector('#voices-table').innerText.includes({json.dumps(NAME + ' (2)')})")
    assert NAME in pg.inner_text("#voices-table") and pg.input_value("#edit-name textarea") == ""
