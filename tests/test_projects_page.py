"""The Projects tab in headless Chromium against the shared `app.py --demo` studio, as a new user drives it: a
`.txt` with chapter headings uploaded becomes those chapters; a chapter is cast to a saved voice from the page
and rendered, and the project's stored segments say that voice made them; the loudness is kept with the
project; every dropdown shows its choice whole; the project is renamed, then deleted after a confirmation."""
from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request

import pytest

from tests.helpers import clip_bytes

pytestmark = [pytest.mark.demo_threads, pytest.mark.browser]

BOOK = """The Quiet Sea
by Ann Writer

Chapter 1

A red door.

CHAPTER TWO

A blue door.

Part II

Chapter 3: The Storm

A green door.
"""
MAX_FRAMES = 25  # each take cut at 1 s of (noise) audio: the render lasts seconds


def api(url: str, path: str, body: dict | None = None, *, method: str | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"},
                                     method=method or ("GET" if body is None else "POST"))
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read() or b"null")


def save_voice(url: str, name: str) -> str:
    """A saved voice through the API (multipart, as a client uploads one): its id."""
    boundary = "----higgs-test"
    parts = [(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n').encode()
             for k, v in (("name", name), ("ref_text", "A short test tone."), ("consent", "true"))]
    parts.append((f'--{boundary}\r\nContent-Disposition: form-data; name="audio_sample"; filename="tone.wav"\r\n'
                  "Content-Type: audio/wav\r\n\r\n").encode() + clip_bytes() + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    request = urllib.request.Request(url + "/v1/audio/voices", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())["id"]


@pytest.fixture(scope="module")
def page(chromium, demo_studio):
    with contextlib.closing(chromium.new_context(viewport={"width": 1366, "height": 900})) as context:
        pg = context.new_page()
        pg.goto(demo_studio.url)
        pg.get_by_role("tab", name="Projects").click()
        yield pg


def choose(pg, box: str, option: str) -> None:
    """Pick `option` in the dropdown `box` (an elem_id) as a user does: open it, click the choice."""
    pg.click(f"#{box} input")
    pg.get_by_role("option", name=option, exact=True).click()


def summary(pg) -> str:
    return pg.inner_text("#proj-summary")


# Enabled once there is something to hear or export (studio/views/project_rows.py `outputs`).
OUTPUTS = ("proj-play", "proj-acx-check", "proj-export", "proj-captions")


def test_an_uploaded_txt_becomes_its_chapters_and_a_cast_chapter_renders_in_its_voice(page, demo_studio, tmp_path):
    url, pg = demo_studio.url, page
    voice = save_voice(url, "Page Voice")
    upload = tmp_path / "book.txt"
    upload.write_text(BOOK)
    pg.get_by_role("button", name="New project").click()
    pg.set_input_files("#proj-upload input[type=file]", str(upload))
    pg.click("#proj-create")
    pg.wait_for_function("() => document.querySelector('#proj-summary')?.innerText.includes('The Quiet Sea')",
                         timeout=60_000)
    assert "by Ann Writer · 3 chapters" in summary(pg)
    pg.wait_for_function("() => document.querySelector('#proj-chapters')?.innerText.includes('CHAPTER TWO')",
                         timeout=30_000)
    table = pg.inner_text("#proj-chapters")
    for title in ("Chapter 1", "CHAPTER TWO", "Part II · Chapter 3: The Storm"):
        assert title in table
    assert pg.input_value("#proj-picker input") == "The Quiet Sea"  # the book's title, not "book"
    pid = next(p["id"] for p in api(url, "/v1/projects")["projects"] if p["title"] == "The Quiet Sea")
    api(url, f"/v1/projects/{pid}", {"settings": {"max_frames": MAX_FRAMES}}, method="PATCH")  # short takes

    # Cast chapter 2 to the saved voice: pick its row, its voice, and press Cast.
    pg.locator("#proj-chapters [role=gridcell]", has_text="CHAPTER TWO").first.click()
    pg.wait_for_function("() => document.querySelector('#proj-chapter input')?.value === '2'", timeout=30_000)
    choose(pg, "proj-chapter-voice", "Page Voice")
    pg.click("#proj-cast")
    pg.wait_for_function("() => document.querySelector('#proj-chapters')?.innerText.includes('Page Voice')",
                         timeout=30_000)
    assert [c["voice"] for c in api(url, f"/v1/projects/{pid}")["chapters"]] == [None, voice, None]
    pg.locator("#proj-chapters [role=gridcell]", has_text="Chapter 1").first.click()  # its cast: the project's
    pg.wait_for_function("() => document.querySelector('#proj-chapter-voice input')?.value === \"the project's\"",
                         timeout=30_000)
    pg.locator("#proj-chapters [role=gridcell]", has_text="CHAPTER TWO").first.click()
    pg.wait_for_function("() => document.querySelector('#proj-chapter-voice input')?.value === 'Page Voice'",
                         timeout=30_000)

    pg.wait_for_function("() => !document.querySelector('#proj-render').disabled", timeout=30_000)
    assert [pg.is_disabled(f"#{b}") for b in OUTPUTS] == [True] * 4  # nothing rendered: nothing to play or export
    pg.click("#proj-render")
    pg.wait_for_function("() => /done · 3 of 3 segments/.test(document.querySelector('#proj-summary')?.innerText)",
                         timeout=120_000)
    pg.wait_for_function(f"() => {list(OUTPUTS)}.every((b) => !document.getElementById(b).disabled)", timeout=30_000)
    segments = api(url, f"/v1/projects/{pid}/chapters/1")["segments"]
    assert [(s["text"], s["voice"]) for s in segments] == [("A blue door.", voice)]
    assert segments[0]["state"] not in ("waiting", "stale")  # rendered, in the cast voice (its render's record)
    assert api(url, f"/v1/projects/{pid}/chapters/0")["segments"][0]["voice"] is None  # the narrator: zero-shot

    # The loudness is the project's, and every dropdown shows its choice whole.
    choose(pg, "proj-loudness", "audiobook -18")
    pg.wait_for_function(f"async () => (await (await fetch('/v1/projects/{pid}')).json()).settings.loudness"
                         " === 'audiobook'", timeout=30_000)
    boxes = pg.evaluate("() => [...document.querySelectorAll('[id^=proj-] input[role=combobox]')]"
                        ".filter(i => i.offsetParent).map(i => [i.closest('[id^=proj-]').id, i.value,"
                        " i.scrollWidth <= i.clientWidth + 1])")
    assert {box for box, _, _ in boxes} >= {"proj-format", "proj-loudness", "proj-narrator", "proj-chapter-voice"}
    assert [(box, value) for box, value, whole in boxes if not whole] == []


def test_a_project_is_renamed_and_deleted_only_once_confirmed(page, demo_studio):
    url, pg = demo_studio.url, page
    created = api(url, "/v1/projects", {"title": "Doomed", "text": "A short book."})
    pg.reload()
    pg.get_by_role("tab", name="Projects").click()
    # The page load's answer opens the project this browser had open: picking before it lands would be undone.
    pg.wait_for_function("() => document.querySelector('#proj-picker input')?.value", timeout=60_000)
    pg.click("#proj-picker input")
    pg.get_by_role("option", name="Doomed", exact=True).click()
    pg.wait_for_function("() => document.querySelector('#proj-summary')?.innerText.includes('Doomed')",
                         timeout=30_000)

    pg.get_by_role("button", name="Rename or delete this project").click()
    pg.fill("#proj-name textarea, #proj-name input", "Saved From Doom")
    pg.click("#proj-rename")
    pg.wait_for_function("() => document.querySelector('#proj-picker input')?.value === 'Saved From Doom'",
                         timeout=30_000)
    assert api(url, f"/v1/projects/{created['id']}")["title"] == "Saved From Doom"

    pg.click("#proj-delete")
    pg.wait_for_selector("#proj-confirm", state="visible", timeout=30_000)
    assert re.search(r"Delete Saved From Doom.*cannot be undone", pg.inner_text("#proj-confirm"), re.DOTALL)
    pg.click("#proj-delete-no")  # kept
    pg.wait_for_selector("#proj-confirm", state="hidden", timeout=30_000)
    assert api(url, f"/v1/projects/{created['id']}")["title"] == "Saved From Doom"

    pg.click("#proj-delete")
    pg.click("#proj-delete-yes")
    pg.wait_for_function("() => document.querySelector('#proj-picker input')?.value !== 'Saved From Doom'",
                         timeout=30_000)
    with pytest.raises(urllib.error.HTTPError) as gone:
        api(url, f"/v1/projects/{created['id']}")
    assert gone.value.code == 404
