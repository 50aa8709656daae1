"""The Projects tab (studio/views/projects.py): its table formatting; its handlers over a real library and job
runner on the demo engine (create from an upload, render, play, regenerate a segment, export); then in
headless Chromium against the shared `app.py --demo` studio the reattach test of issue 24: start a render,
close the page (the render goes on), open it again, and the table shows the same job, which then resumes and
ends with each segment rendered once; the book exports as an M4B with its chapters through
`GET /v1/projects/{id}/export`."""
from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.request

import pytest

from studio.views.projects import VIEWS, chapter_rows, chapter_state, job_line, segment_rows, summary_md

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

# 3 chapters of 3 one-sentence paragraphs, every sentence different (so none is found rendered already): 9
# segments, each a short take on the demo (a fraction of a second: the test pauses the render through the API
# to know what a page shows).
WORDS = ["red", "blue", "green", "amber", "violet", "silver", "golden", "olive", "coral"]
BOOK = "\n\n".join(f"# Chapter {c + 1}\n\n" + "\n\n".join(f"A {WORDS[3 * c + k]} door." for k in range(3))
                   for c in range(3))
SEGMENTS = 9
MAX_FRAMES = 25  # each take cut at 1 s of (noise) audio: the render lasts seconds, not tens of them
PROGRESS = re.compile(r"(\d+) of (\d+) segments")


def test_the_tables_say_each_chapters_state():
    chapters = [{"index": 0, "title": "One", "skip": False, "state": "done", "segments": 2, "rendered": 2,
                 "seconds": 4.04},
                {"index": 1, "title": "Two", "skip": False, "state": "rendering", "segments": 5, "rendered": 3,
                 "seconds": 6.0},
                {"index": 2, "title": "Three", "skip": False, "state": "stale", "segments": 1, "rendered": 0,
                 "seconds": 0},
                {"index": 3, "title": "Notes", "skip": True, "state": "not started", "segments": 1, "rendered": 0,
                 "seconds": 0}]
    assert [chapter_state(c) for c in chapters] == ["done", "rendering 3 of 5", "out of date", "skipped"]
    project = {"title": "B", "author": "A", "disk_bytes": 2_500_000, "chapters": chapters,
               "job": {"state": "running", "done": 5, "total": 9, "eta_s": 75, "rtf": 0.5, "error": None}}
    assert chapter_rows(project)[1] == [2, "Two", "narrator", "rendering 3 of 5", 5, 6.0]
    assert summary_md(project) == ("**B** by A · 4 chapters · 2.5 MB on disk\n\n"
                                   "Render: rendering 5 of 9 segments · about 1 min 15 s left · RTF 0.50")
    assert job_line({"state": "failed", "done": 1, "total": 3, "eta_s": None, "rtf": None, "error": "disk full"}) == \
        "failed at 1 of 3 segments · error: disk full"
    assert segment_rows({"segments": [{"index": 0, "text": "Hi.", "seed": 7, "seconds": None, "state": "waiting"}]}) \
        == [[1, "Hi.", "7", 0, "not rendered", ""]]
    heard = {"index": 1, "text": "Ho.", "seed": 9, "seconds": 1.26, "state": "done", "wer": 0.125,
             "attempts": [{"seed": 8, "wer": 0.6}, {"seed": 9, "wer": 0.125}]}
    assert segment_rows({"segments": [heard]}) == [[2, "Ho.", "9", 1.3, "done", "0.12 (2 tries)"]]


@pytest.fixture(scope="module")
def view(tmp_path_factory, shared_engine):
    """The tab's handlers over a real library and job runner on the demo engine (no page, no browser)."""
    from studio.projects.jobs import JobRunner
    from studio.projects.library import Projects
    from studio.projects.store import Store
    from studio.takes.service import StudioService
    from studio.views.projects import ProjectsView

    folder = tmp_path_factory.mktemp("projects")
    service = StudioService(shared_engine(max_batch=2))
    projects = Projects(Store(folder / "store"), service)
    runner = JobRunner(projects, service)
    runner.start()
    yield ProjectsView(projects, runner, folder / "page")
    runner.stop()
    service.close()


def wait_done(view, pid: str) -> None:
    deadline = time.monotonic() + 60
    while view.projects.active_job(pid) is not None:
        assert time.monotonic() < deadline, view.project(pid)["job"]
        time.sleep(0.05)


def test_handlers_create_render_regenerate_play_and_export(view, tmp_path):
    import zipfile

    import soundfile as sf

    from studio.projects import importing
    from studio.takes.admission import OWNER

    (view.out_dir).mkdir(exist_ok=True)
    with pytest.raises(ValueError, match="The text is empty"):
        view.create("", "", "  ", None, False)
    with pytest.raises(ValueError, match="Open a project first"):
        view.render("")
    upload = tmp_path / "Two Doors.md"
    upload.write_text("# One\n\nA red door.\n\nA blue door.\n\n# Two\n\nA green door.\n")
    made = view.create("", "Ann", "", str(upload), False)
    (picker, pid, chapter), form = made[:3], made[3:-VIEWS]
    summary, rows, segments, *buttons, shown = made[-VIEWS:]
    assert picker["value"] == pid and chapter == 1 and "**Two Doors** by Ann · 2 chapters" in summary
    assert form[5] == "Two Doors"  # the name box
    assert rows == [[1, "One", "narrator", "not started", 2, 0], [2, "Two", "narrator", "not started", 1, 0]]
    assert [r[1] for r in segments] == ["A red door.", "A blue door."]
    # Render, then Pause, Resume, Cancel; Play chapter, ACX check, Export, Captions: only Render applies
    assert [b["interactive"] for b in buttons] == [True] + [False] * 7
    assert view.tick(pid, 1, shown) == (gr_skip(),) * VIEWS  # nothing changed: nothing sent
    with pytest.raises(ValueError, match="no render in progress"):
        view.pause(pid)
    with pytest.raises(ValueError, match="not rendered yet"):
        view.play_chapter(pid, 1)

    # Short takes for the render: the same book, its settings with max_frames.
    book = importing.from_file(upload.name, upload.read_bytes())
    pid = view.projects.create(OWNER.key, book, {"max_frames": MAX_FRAMES}).id
    assert re.search("waiting to render|rendering", view.render(pid)[0])
    wait_done(view, pid)
    summary, rows, segments, *buttons, _ = view.tick(pid, 1, shown)
    assert "done · 3 of 3 segments" in summary and [r[3] for r in rows] == ["done", "done"]
    assert [b["interactive"] for b in buttons] == [True, False, False, False, True, True, True, True]
    samples = view.projects.chapter_audio(pid, 0).samples
    assert sf.info(view.play_chapter(pid, 1)).frames == samples
    assert sf.info(view.play_segment(pid, 1, 2)).frames > 0

    seed = int(segments[1][2])
    view.regenerate(pid, 1, 2, "", "")  # the next seed, rendered by a job
    wait_done(view, pid)
    segments = view.show(pid, 1)[2]
    # Rendered again with a later seed (the demo's takes are cut short, so the render itself retried once more).
    assert "waiting" not in [r[4] for r in segments] and int(segments[1][2]) > seed
    with pytest.raises(ValueError, match="whole number"):
        view.regenerate(pid, 1, 2, "12a", "")
    with pytest.raises(ValueError, match="Pick a chapter between 1 and 2"):
        view.export_file(pid, "mp3", 3)

    book_file = view.export_file(pid, "zip", 0)
    with zipfile.ZipFile(book_file) as zf:
        assert sorted(zf.namelist()) == ["01 One.mp3", "02 Two.mp3", "manifest.json"]
    chapter_file = view.export_file(pid, "wav", 2)
    assert chapter_file.endswith("Two Doors - 02 Two.wav")
    assert sf.info(chapter_file).frames == view.projects.chapter_audio(pid, 1).samples


def gr_skip():
    import gradio as gr

    return gr.skip()


def api(url: str, path: str, body: dict | None = None, *, raw: bool = False):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=60) as r:
        return r.read() if raw else json.loads(r.read())


@pytest.fixture(scope="module")
def studio_url(chromium, demo_studio):
    return demo_studio.url


def open_tab(context, url: str):
    pg = context.new_page()
    pg.goto(url)
    pg.get_by_role("tab", name="Projects").click()
    return pg


def shown_progress(pg) -> tuple[int, int] | None:
    found = PROGRESS.search(pg.inner_text("#proj-summary"))
    return (int(found.group(1)), int(found.group(2))) if found else None


def paused_after(url: str, pid: str, done: int) -> dict:
    """The project's render (started by a page's click: it may not have reached the server yet) paused by the
    API as soon as it has rendered more than `done` segments: the job."""
    deadline = time.monotonic() + 60
    while (job_id := api(url, f"/v1/projects/{pid}")["job"]) is None:
        assert time.monotonic() < deadline, "the page's Render started no job"
        time.sleep(0.02)
    while (job := api(url, f"/v1/jobs/{job_id}"))["done"] <= done:
        assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.02)
    job = api(url, f"/v1/jobs/{job_id}/pause", {})
    assert job["state"] == "paused" and done < job["done"] < SEGMENTS, job
    return job


def enabled(pg, want: dict[str, bool] | None = None) -> dict[str, bool]:
    """Which of the render job's buttons can be pressed; with `want`, waiting up to a few of the page's polls for
    them to be so (the Render click's own answer can land just after a poll that showed the job paused: the
    next poll corrects it)."""
    deadline = time.monotonic() + 5
    while True:
        now = {name: pg.is_enabled(f"#proj-{name}") for name in ("render", "pause", "resume", "cancel")}
        if want is None or now == want or time.monotonic() > deadline:
            return now
        pg.wait_for_timeout(100)


def table_done(pg) -> int:
    """The segments rendered as the chapters table counts them (3 chapters: done, rendering k of 3)."""
    states = re.findall(r"(?:rendering|paused at) (\d) of 3|(done)", pg.inner_text("#proj-chapters"))
    assert len(states) == 3, states
    return sum(int(n) if n else 3 for n, _ in states)


@pytest.mark.browser
def test_a_page_opened_again_shows_the_same_render_going_on(studio_url, chromium, tmp_path, artifacts_dir):
    project = api(studio_url, "/v1/projects", {"title": "Reattach", "text": BOOK, "format": "markdown",
                                               "settings": {"max_frames": MAX_FRAMES}})
    pid = project["id"]
    assert [c["segments"] for c in project["chapters"]] == [3, 3, 3]
    with contextlib.closing(chromium.new_context(viewport={"width": 1400, "height": 1400})) as context:
        pg = open_tab(context, studio_url)  # a browser with nothing remembered opens the newest project: this one
        pg.wait_for_function("() => document.querySelector('#proj-picker input')?.value === 'Reattach'"
                             " && document.querySelector('#proj-summary')?.innerText.includes('Reattach')",
                             timeout=30_000)
        pg.click("#proj-render")
        # A take on the demo lasts a fraction of a second, shorter than the page's poll: paused by the API as soon
        # as a segment is rendered, so what the page shows next does not race the render.
        job = paused_after(studio_url, pid, 0)
        before = (job["done"], SEGMENTS)
        pg.wait_for_function(f"() => document.querySelector('#proj-summary')?.innerText"
                             f".includes('paused at {before[0]} of {SEGMENTS} segments')", timeout=30_000)
        assert table_done(pg) == before[0]  # the table agrees
        assert "rendering" not in pg.inner_text("#proj-chapters")  # paused, as the line says
        paused = {"render": False, "pause": False, "resume": True, "cancel": True}
        assert enabled(pg, paused) == paused
        pg.close()  # nothing of the render lives in the page

        # It goes on with no page open; paused again (by the API), so what the next page shows is known.
        assert api(studio_url, f"/v1/jobs/{job['id']}/resume", {})["state"] in ("queued", "running")
        job = paused_after(studio_url, pid, before[0])

        pg = open_tab(context, studio_url)  # the browser remembers which project was open; the rest is the server's
        pg.wait_for_function("() => /Reattach/.test(document.querySelector('#proj-summary')?.innerText)"
                             " && /paused/.test(document.querySelector('#proj-summary')?.innerText)", timeout=30_000)
        done = api(studio_url, f"/v1/jobs/{job['id']}")["done"]
        assert shown_progress(pg) == (done, SEGMENTS)
        assert table_done(pg) == done  # the table agrees
        pg.click("#proj-resume")  # the same job goes on from where it stopped
        seen = [shown_progress(pg)]
        while seen[-1][0] < SEGMENTS:
            pg.wait_for_function(f"() => !document.querySelector('#proj-summary')?.innerText"
                                 f".includes('{seen[-1][0]} of {SEGMENTS} segments')", timeout=30_000)
            seen.append(shown_progress(pg))
            assert seen[-1] is not None, pg.inner_text("#proj-summary")
        assert seen == sorted(seen), seen
        assert f"done · {SEGMENTS} of {SEGMENTS} segments" in pg.inner_text("#proj-summary")
        pg.wait_for_function("() => (document.querySelector('#proj-chapters')?.innerText.match(/\\bdone\\b/g) || [])"
                             ".length === 3", timeout=30_000)
        pg.wait_for_function("() => !document.querySelector('#proj-render').disabled", timeout=30_000)
        assert enabled(pg) == {"render": True, "pause": False, "resume": False, "cancel": False}
        pg.screenshot(path=str(artifacts_dir / "projects.png"), full_page=True)

    # The job started on the first page is the one that finished, and it generated each segment once.
    finished = api(studio_url, f"/v1/jobs/{job['id']}")
    assert (finished["state"], finished["done"], finished["total"], finished["rendered"]) == \
        ("done", SEGMENTS, SEGMENTS, SEGMENTS)
    assert api(studio_url, f"/v1/projects/{pid}")["job"] is None
    (tmp_path / "book.m4b").write_bytes(api(studio_url, f"/v1/projects/{pid}/export?format=m4b", raw=True))
    probe = json.loads(subprocess.run(["ffprobe", "-v", "error", "-show_chapters", "-of", "json",
                                       str(tmp_path / "book.m4b")], capture_output=True, check=True).stdout)
    assert [c["tags"]["title"] for c in probe["chapters"]] == ["Chapter 1", "Chapter 2", "Chapter 3"]
