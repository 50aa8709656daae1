"""The Long form tab in a real browser (headless Debian Chromium, Playwright) against `app.py --demo`: a script
fills a segment table whose key columns are readable, with pauses and seeds; a clicked row is picked and plays;
a row generated again gets a seed of its own; the captions tell short sentences apart; and a Generate that
fails (an unknown speaker) keeps the table, the player and the spoken text, and says why."""

from __future__ import annotations

import re

import pytest

from tests.studio_server import need_ffmpeg

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT = ("Alice: Hello there. This first line is long enough to wrap inside its cell of the table, on and on.\n\n"
          "Bob: It is. Yes.\n\nAlice: Bye now.")
ROWS = ("() => [...document.querySelectorAll('#long-table .virtual-row, #long-table tbody tr')]"
        ".map((r) => [...r.querySelectorAll('[role=gridcell], td')].map((c) => c.innerText.trim()))"
        ".filter((r) => r.some((c) => c))")
TAKE_FILE = "() => document.querySelector('#long-take a.download-link')?.href"
HEADERS = "() => [...document.querySelectorAll('#long-table th')].map((t) => t.innerText.replace(/\\s+/g, ' ').trim())"


@pytest.fixture(scope="module")
def page(chromium, demo_studio):
    """One page with one generated take, shared by the file's tests (in order)."""
    need_ffmpeg()
    pg = chromium.new_page(viewport={"width": 1366, "height": 900})
    pg.goto(demo_studio.url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    pg.get_by_role("tab", name="Long form").click()
    pg.fill("#long-text textarea", SCRIPT)
    pg.fill("#long-voices textarea", "Alice =\nBob =")
    pg.click("#long-generate")
    pg.wait_for_function("() => document.querySelector('#long-progress')?.innerText.startsWith('Done')",
                         timeout=240_000)
    pg.wait_for_function("() => document.querySelectorAll('.hs-captions li').length >= 4", timeout=60_000)
    yield pg
    pg.context.close()


def column(pg, name: str) -> list[str]:
    index = pg.evaluate(HEADERS).index(name)
    return [row[index] for row in pg.evaluate(ROWS)]


def test_the_segment_table_shows_its_key_columns_readably(page):
    pg = page
    assert pg.evaluate(HEADERS) == ["#", "speaker", "status", "seconds", "pause after", "WER", "text", "seed"]
    widths = pg.evaluate("() => Object.fromEntries([...document.querySelectorAll('#long-table th')]"
                         ".map((t) => [t.innerText.replace(/\\s+/g, ' ').trim(), t.getBoundingClientRect()]))")
    table = pg.evaluate("() => document.querySelector('#long-table').getBoundingClientRect().right")
    assert widths["speaker"]["width"] >= 60, widths  # was one character wide
    for name in ("speaker", "status", "seconds", "pause after", "WER", "seed"):
        assert widths[name]["right"] <= table + 1, (name, widths[name], table)  # on screen, not scrolled away
    speakers = column(pg, "speaker")
    assert [s for i, s in enumerate(speakers) if i == 0 or s != speakers[i - 1]] == ["Alice", "Bob", "Alice"]
    assert all(re.fullmatch(r"\d+", seed) for seed in column(pg, "seed"))
    assert all(re.fullmatch(r"\d+(\.\d+)?", s) for s in column(pg, "seconds"))
    pauses = column(pg, "pause after")
    assert all(re.fullmatch(r"\d\.\d\d s", p) for p in pauses[:-1]) and pauses[-1] == ""  # nothing after the end
    assert all("(" not in s and "_" not in s for s in column(pg, "status")), column(pg, "status")
    progress = pg.inner_text("#long-progress")
    assert ".;" not in progress and "repeat_guard" not in progress and "max_frames" not in progress, progress


def test_the_captions_tell_short_sentences_apart(page):
    times = page.evaluate("() => [...document.querySelectorAll('.hs-captions .hs-cue-time')].map((t) => t.innerText)")
    assert all(re.fullmatch(r"\d+:\d\d\.\d", t) for t in times), times
    assert len(set(times)) == len(times), times


def test_a_clicked_row_is_picked_and_plays(page):
    pg = page
    pg.locator("#long-table [role=gridcell]", has_text="Bye now.").first.click()
    last = str(len(pg.evaluate(ROWS)))
    pg.wait_for_function(f"() => document.querySelector('#long-row input')?.value === '{last}'", timeout=30_000)
    assert pg.input_value("#long-row-text textarea") == "Bye now."
    pg.wait_for_function("() => /long-segment-\\d+\\.wav$/.test("
                         "document.querySelector('#long-segment a.download-link')?.href ?? '')", timeout=30_000)


def test_a_row_generated_again_gets_a_seed_of_its_own(page):
    pg = page
    before = column(pg, "seed")
    pg.fill("#long-row input", "2")
    pg.fill("#long-row-seed input", "-1")
    pg.fill("#long-row-text textarea", "")
    pg.click("#long-regenerate")
    pg.wait_for_function("() => document.querySelector('#long-progress')?.innerText.startsWith('Row 2')",
                         timeout=120_000)
    after = column(pg, "seed")
    assert after[1] != before[1] and after[1] not in before, (before, after)
    assert after[:1] + after[2:] == before[:1] + before[2:]


def test_a_failed_generate_keeps_the_panel_and_says_why(page):
    pg = page
    rows, spoken, take = pg.evaluate(ROWS), pg.input_value("#long-spoken textarea"), pg.evaluate(TAKE_FILE)
    assert re.search(r"long-take-\d+-seed\d+\.wav$", take)
    assert spoken.startswith("Hello there.")
    pg.fill("#long-voices textarea", "Alice =")  # Bob is not in the map
    pg.click("#long-generate")
    pg.wait_for_function("() => document.querySelector('#long-progress')?.innerText.startsWith('Not generated')",
                         timeout=60_000)
    assert "'Bob'" in pg.inner_text("#long-progress")
    assert pg.evaluate(HEADERS)[:3] == ["#", "speaker", "status"]  # not "0 1 2 …"
    assert pg.evaluate(ROWS) == rows and pg.input_value("#long-spoken textarea") == spoken
    assert pg.evaluate(TAKE_FILE) == take  # the player still holds the take
