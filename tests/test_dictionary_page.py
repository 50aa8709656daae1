"""The pronunciation dictionary's editor (studio/views/dictionary.py): a sentence is tried as a take reads it
(numbers written out, then the rules), and in a real browser (headless Debian Chromium, Playwright, against
`app.py --demo`) typing on a selected cell replaces its text whole and "Try it" is a button."""

from __future__ import annotations

import pytest

from studio.api.access import Access
from studio.takes.service import StudioService
from studio.text.pronounce import DictionaryStore
from studio.views.dictionary import DictionaryView
from tests.fakes import FakeEngine

CELLS = ("() => [...document.querySelectorAll('#dictionary-rules [role=gridcell]')]"
         ".map((c) => c.innerText.replace('⋮', '').trim())")


def test_a_tried_sentence_has_its_numbers_written_out_before_the_rules(tmp_path):
    service = StudioService(FakeEngine(frames=1), dictionary=DictionaryStore(tmp_path / "dictionary.json"))
    try:
        view = DictionaryView(service, Access(), tmp_path)
        rows = [["dollars", "bucks", False, False, "", ""], ["Nguyen", "Win", False, False, "", ""]]
        assert view.trial("Nguyen paid $5 for it.", rows) == "Win paid five bucks for it."
        assert view.trial("It was 3 dollars on 2024-03-01.", rows) == \
            "It was three bucks on March first, twenty twenty-four."
    finally:
        service.close()


@pytest.mark.browser
@pytest.mark.slow
def test_typing_on_a_cell_replaces_it_and_try_it_is_a_button(chromium, demo_studio):
    pg = chromium.new_page(viewport={"width": 1366, "height": 900})
    try:
        pg.goto(demo_studio.url)
        pg.wait_for_selector("#generate-btn", timeout=60_000)
        pg.get_by_text("Pronunciation dictionary").click()
        pg.locator("#dictionary-rules button.add-row-button").click()
        pg.locator("#dictionary-rules [role=gridcell]").first.click()
        pg.keyboard.type("Nguyen", delay=30)  # was "guyen": the first key was lost
        pg.keyboard.press("Enter")
        pg.wait_for_function(f"() => ({CELLS})()[0] === 'Nguyen'", timeout=10_000)
        pg.locator("#dictionary-rules [role=gridcell]").nth(1).click()
        pg.keyboard.type("Win")  # no pause: Enter comes before the editor has opened, and waits for the keys
        pg.keyboard.press("Enter")
        pg.wait_for_function(f"() => ({CELLS})()[1] === 'Win'", timeout=10_000)
        pg.locator("#dictionary-rules [role=gridcell]").first.click()
        pg.keyboard.type("Tran", delay=30)  # on a filled cell: replaced, not "NguyenTran" nor "Nguyenran"
        pg.keyboard.press("Enter")
        pg.wait_for_function(f"() => ({CELLS})()[0] === 'Tran'", timeout=10_000)

        pg.fill("#dictionary-try textarea", "Tran paid $5 for it.")
        pg.click("#dictionary-try-button")  # a button, not only Enter in the box
        pg.wait_for_function("() => document.querySelector('#dictionary-spoken textarea')?.value === "
                             "'Win paid five dollars for it.'", timeout=30_000)
    finally:
        pg.context.close()
