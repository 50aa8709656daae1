"""The page for keyboard, screen-reader and phone users, in headless Debian Chromium against `app.py --demo`.

1. axe-core (the `axe-playwright-python` package bundles it; nothing is fetched) finds nothing critical or serious on
   the Studio tab before and after a take, nor on the Voices, Long form and Projects tabs; nor in dark mode.
2. One `h1`, one name for the model, a skip link into the text box, a visible focus ring.
3. The 43 tag buttons are one stop for the Tab key, with the arrow keys inside; Generate is at most 15 Tab presses
   from the text box.
4. At 390 × 844 (a phone) nothing is wider than the screen, before or after a take, every tab is in the tab bar,
   and the History table fits.
"""

from __future__ import annotations

import pytest

from tests.helpers import wait_take_done
from tests.studio_server import need_ffmpeg

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1366, "height": 900}
HARMFUL = ("critical", "serious")
MAX_TABS_TO_GENERATE = 15
# axe-core's default rules, and two more that it leaves off by default: WCAG 2.2's target size (24 px) and a name
# that matches what a control shows (people who speak to their computer say what they see).
AXE_OPTIONS = {"resultTypes": ["violations"],
               "rules": {"target-size": {"enabled": True}, "label-content-name-mismatch": {"enabled": True}}}


@pytest.fixture(scope="module")
def studio_url(chromium, demo_studio):
    need_ffmpeg()
    return demo_studio.url


def open_page(chromium, url, viewport=DESKTOP):
    pg = chromium.new_page(viewport=viewport)
    pg.goto(url)
    pg.wait_for_selector("#generate-btn", timeout=60_000)
    pg.wait_for_function("() => document.querySelector('#text textarea') !== null")
    return pg


@pytest.fixture
def page(chromium, studio_url):
    pg = open_page(chromium, studio_url)
    yield pg
    pg.context.close()


@pytest.fixture
def phone(chromium, studio_url):
    pg = open_page(chromium, studio_url, PHONE)
    yield pg
    pg.context.close()


# Nothing waits for an event's output, and no fade or other finite transition is under way.
SETTLED = """() => !document.querySelector('.pending, .generating, .wrap.translucent')
    && document.getAnimations().every(a => a.playState !== 'running' || a.effect?.getComputedTiming().endTime === Infinity)"""


def harmful_findings(pg) -> list[str]:
    """axe-core's critical and serious findings on what `pg` shows once Gradio has finished updating it (a
    component that waits for an event's output is drawn faded and under a veil for that moment, then fades back
    in), one line per rule and element."""
    from axe_playwright_python.sync_playwright import Axe

    pg.wait_for_function(SETTLED, timeout=30_000)
    found = Axe().run(pg, options=AXE_OPTIONS).response["violations"]
    return [f"{v['id']} ({v['impact']}): {node['target']} {node['html'][:120]} | "
            f"{' '.join(node.get('failureSummary', '').split())[:300]}"
            for v in found if v["impact"] in HARMFUL for node in v["nodes"]]


def take(pg, text="A short line to hear."):
    pg.fill("#text textarea", text)
    pg.click("#generate-btn")
    wait_take_done(pg)
    pg.wait_for_function("() => document.querySelector('#history [role=gridcell]') !== null", timeout=60_000)
    # The captions come last (their own event after the take's): the page is whole once they are shown.
    pg.wait_for_function("() => document.querySelector('#take-captions li') !== null", timeout=60_000)


def open_tab(pg, name):
    pg.get_by_role("tab", name=name).click()
    pg.wait_for_timeout(500)  # the tab's panel mounts; axe reads only what is shown


# ------------------------------------------------------------------------------------------ 1. axe-core

def test_axe_finds_nothing_serious_on_the_studio_tab_before_and_after_a_take(page):
    assert harmful_findings(page) == []
    take(page)
    assert harmful_findings(page) == []


def test_axe_finds_nothing_serious_in_dark_mode(chromium, studio_url):
    pg = chromium.new_page(viewport=DESKTOP, color_scheme="dark")
    try:
        pg.goto(studio_url)
        pg.wait_for_selector("#generate-btn", timeout=60_000)
        take(pg)
        assert harmful_findings(pg) == []
        open_tab(pg, "Projects")
        assert harmful_findings(pg) == []
    finally:
        pg.context.close()


@pytest.mark.parametrize("tab", ["Voices", "Long form", "Projects"])
def test_axe_finds_nothing_serious_on_the_other_tabs(page, tab):
    open_tab(page, tab)
    assert harmful_findings(page) == []


# ------------------------------------------------------------------------------------------ 2. landmarks

def test_one_heading_one_model_name_a_skip_link_and_a_visible_focus(page):
    pg = page
    assert pg.eval_on_selector_all("h1", "hs => hs.map((h) => h.innerText)") == ["Higgs Studio for Higgs TTS 3"]
    shown = pg.inner_text("body")
    assert "Higgs TTS 3" in shown and "Higgs Audio" not in shown and "TTS-4B" not in shown
    # The skip link is the first thing the Tab key reaches, shows when focused, and puts the focus in the text box.
    first = pg.evaluate("""() => [...document.querySelectorAll('a[href], button, input, textarea, select, [tabindex]')]
        .find((e) => e.tabIndex >= 0 && !e.disabled && e.getClientRects().length)?.className""")
    assert "hs-skip" in first
    pg.focus("a.hs-skip")
    box = pg.locator("a.hs-skip").bounding_box()
    assert box is not None and box["x"] >= 0 and box["y"] >= 0 and box["width"] > 20 and box["height"] > 10
    pg.keyboard.press("Enter")
    in_text_box = "() => document.activeElement === document.querySelector('#text textarea')"
    pg.wait_for_function(in_text_box, timeout=5_000)
    open_tab(pg, "Voices")  # from another tab, the skip link opens the Studio tab's text box
    pg.focus("a.hs-skip")
    pg.keyboard.press("Enter")
    pg.wait_for_function(in_text_box, timeout=5_000)
    assert pg.get_by_role("tab", name="Studio").get_attribute("aria-selected") == "true"
    # The focus ring: Tab onto a button, and its outline is drawn.
    pg.focus("button[data-tag]")
    assert pg.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"


# ------------------------------------------------------------------------------------------ 3. keyboard

def test_the_palette_is_one_tab_stop_and_generate_is_near_the_text_box(page):
    pg = page
    pg.focus("#text textarea")
    stops = []
    for _ in range(MAX_TABS_TO_GENERATE):
        pg.keyboard.press("Tab")
        stops.append(pg.evaluate("""() => { const e = document.activeElement;
            return e.id === 'generate-btn' ? 'generate' : e.dataset.tag ? 'tag' : e.tagName; }"""))
        if stops[-1] == "generate":
            break
    assert stops[-1] == "generate", stops
    assert stops.count("tag") == 1, stops
    assert "BODY" not in stops, stops  # the focus never falls out of the page


def test_the_arrow_keys_move_inside_the_palette_and_enter_inserts(page):
    pg = page
    tags = pg.eval_on_selector_all("button[data-tag]", "bs => bs.map((b) => b.dataset.tag)")
    assert len(tags) == 43
    pg.focus("button[data-tag]")
    at = "() => document.activeElement.dataset.tag"
    pg.keyboard.press("ArrowRight")
    assert pg.evaluate(at) == tags[1]
    pg.keyboard.press("End")
    assert pg.evaluate(at) == tags[-1]
    pg.keyboard.press("ArrowRight")  # round to the first
    assert pg.evaluate(at) == tags[0]
    pg.keyboard.press("ArrowLeft")
    assert pg.evaluate(at) == tags[-1]
    # Only the button the keyboard is on stays in the tab order.
    assert pg.eval_on_selector_all("button[data-tag]", "bs => bs.filter((b) => b.tabIndex === 0).length") == 1
    pg.keyboard.press("Enter")
    assert tags[-1] in pg.input_value("#text textarea")


# ------------------------------------------------------------------------------------------ 4. a phone

WIDTH = "() => document.documentElement.scrollWidth"
# Shown table cells that reach past the screen's right edge (a take's History row, on a phone).
CUT_CELLS = """(width) => [...document.querySelectorAll('[role=grid] [role=gridcell], [role=grid] th')]
    .filter((c) => c.getClientRects().length && c.getBoundingClientRect().right > width + 1)
    .map((c) => c.innerText.trim())"""


# Each of Generate and Stop: whether it is what a tap at its centre reaches.
TAPPABLE = """() => ['generate-btn', 'stop-btn'].map((id) => {
  const r = document.getElementById(id).getBoundingClientRect();
  return [id, document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2)?.closest('#' + id) !== null];
})"""


def test_a_phone_shows_every_tab_and_nothing_wider_than_the_screen(phone):
    pg = phone
    assert pg.evaluate(WIDTH) <= PHONE["width"]
    # The action bar that stays on screen keeps to a fifth of it, Generate and Stop on one line, and the form's
    # labels scroll under it, not over its buttons.
    assert pg.eval_on_selector("#actions", "e => e.getBoundingClientRect().height") <= PHONE["height"] / 5
    assert pg.eval_on_selector("#generate-btn", "e => e.getBoundingClientRect().top") == \
        pg.eval_on_selector("#stop-btn", "e => e.getBoundingClientRect().top")
    assert pg.evaluate(TAPPABLE) == [["generate-btn", True], ["stop-btn", True]]
    for name in ("Studio", "Voices", "Long form", "Projects"):
        tab = pg.get_by_role("tab", name=name)
        assert tab.is_visible(), f"{name} is not in the tab bar"
        assert tab.bounding_box()["x"] + tab.bounding_box()["width"] <= PHONE["width"]
    take(pg, "A first take on a phone, with a <|emotion:happy|> tag and a long enough line of text.")
    assert pg.evaluate(WIDTH) <= PHONE["width"]
    assert pg.evaluate(CUT_CELLS, PHONE["width"]) == []
    # Each History cell carries its column's name: a row reads as a card on a phone.
    labels = pg.eval_on_selector_all("#history [role=gridcell]", "cs => cs.map((c) => c.dataset.label)")
    assert labels and all(labels), labels
