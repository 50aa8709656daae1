"""Projects on the tiny random checkpoint, in process: imports (Markdown, an EPUB built here, refused books),
the render worker (every segment stored once, only an edited paragraph rendered again, pause / resume /
cancel, ETA), and the HTTP API with its owner rule. The kill test is tests/test_projects_kill.py."""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest
import soundfile as sf

from studio.projects import importing
from studio.projects.importing import ImportRefused
from studio.projects.jobs import JobRunner
from studio.takes.service import StudioService
from tests.helpers import PROJECT_SETTINGS, projects_client, running_projects, wait_job

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

BOOK = ("# The book\n\n## One\n\nThe boat left at dawn.\n\nThe sea was calm.\n\n"
        "## Two\n\nGulls followed it out.\n\nBy noon the wind had turned.\n\n## Three\n\nNobody spoke.")


@pytest.fixture(scope="module")
def service(shared_engine, tiny_checkpoint):
    service = StudioService(shared_engine(tiny_checkpoint, precision="fp32", max_batch=2), None, None)
    yield service
    service.close()


class Counting:
    """The engine, with the texts of the takes it was asked for (what the cache test counts)."""

    def __init__(self, engine):
        self.engine, self.texts = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate_stream(self, *args, prompt=None, **kwargs):
        self.texts.append(prompt)
        return self.engine.generate_stream(*args, prompt=prompt, **kwargs)


@pytest.fixture
def studio(service, tmp_path):
    with running_projects(service, tmp_path / "projects") as studio:
        yield studio


# ------------------------------------------------------------------------------------------- imports
def test_markdown_headings_give_chapters_under_the_book_title():
    book = importing.from_text(BOOK, markdown=True)
    assert book.title == "The book"
    assert [c.title for c in book.chapters] == ["One", "Two", "Three"]
    assert book.chapters[0].text == "The boat left at dawn.\n\nThe sea was calm."


def _epub(chapters, *, cover=True) -> bytes:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("isbn-978-0-00-000000-0")
    book.set_title("A Sea Story")
    book.set_language("en")
    book.add_author("Ann Writer")
    if cover:
        buf = io.BytesIO()
        from PIL import Image
        Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
        book.set_cover("cover.jpg", buf.getvalue())
    items = []
    for n, (title, body) in enumerate(chapters):
        item = epub.EpubHtml(title=title, file_name=f"ch{n}.xhtml", lang="en")
        item.content = f"<html><body><h1>{title}</h1>{body}</body></html>"
        book.add_item(item)
        items.append(item)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def test_an_epub_with_three_chapters_and_a_cover_gives_three_titled_chapters():
    data = _epub([("Departure", "<p>The boat left at dawn.</p><p>The sea was calm.</p>"),
                  ("Noon", "<p>The wind turned.</p>"), ("Night", "<p>Nobody spoke.</p>")])
    book = importing.from_file("sea.epub", data)
    kept = [c for c in book.chapters if not c.skip]
    assert [c.title for c in kept] == ["Departure", "Noon", "Night"]
    assert kept[0].text == "Departure\n\nThe boat left at dawn.\n\nThe sea was calm."
    assert (book.title, book.author, book.language) == ("A Sea Story", "Ann Writer", "en")
    assert book.cover is not None and book.cover[:2] == b"\xff\xd8" and book.cover_type == "image/jpeg"
    assert book.extra["identifier"] == "isbn-978-0-00-000000-0"


def _zip(members: dict[str, bytes]) -> bytes:
    """The members zipped with a fixed date: the bytes are the same in every test process (xdist's workers must
    collect the same tests)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return out.getvalue()


@pytest.mark.parametrize("data, message", [
    (b"not a zip at all", "not a valid EPUB"),
    (_zip({"mimetype": b"application/epub+zip"}), "no META-INF/container.xml"),
    (_zip({"mimetype": b"application/epub+zip", "META-INF/container.xml": b"<container><broken"}),
     "could not be read"),
    (_zip({"META-INF/container.xml": b"<x/>", "bomb.xhtml": b"a" * 5_000_000}), "ZIP bomb"),
    (_zip({"META-INF/container.xml": b"<x/>", "META-INF/encryption.xml":
           b'<encryption><CipherReference URI="OEBPS/ch1.xhtml"/></encryption>'}), "DRM"),
], ids=["not a zip", "no container", "broken container", "ZIP bomb", "DRM"])
def test_malformed_bombed_and_drm_epubs_are_refused_with_the_reason(data, message):
    with pytest.raises(ImportRefused, match=message):
        importing.from_file("book.epub", data)


def test_markup_nested_too_deep_is_refused():
    deep = "<div>" * 300 + "Deep." + "</div>" * 300
    with pytest.raises(ImportRefused, match="nests its markup over 200 levels"):
        importing.from_file("deep.epub", _epub([("One", f"<p>Fine.</p>{deep}")], cover=False))


def test_the_caps_are_flags():
    import app

    args = app.parse_args(["--project-max-chars", "900", "--project-max-chapters", "3", "--project-max-upload-mb", "2",
                           "--projects-dir", "/tmp/books"])
    assert (args.project_max_chars, args.project_max_chapters, args.project_max_upload_mb) == (900, 3, 2)
    assert args.projects_dir == "/tmp/books"


def test_size_caps_refuse_a_book_before_anything_is_stored(studio):
    projects, _ = studio
    with pytest.raises(ImportRefused, match="MB; the limit is 0 MB"):
        importing.from_file("big.epub", b"x" * 300_000, limits=projects.limits)
    with pytest.raises(ImportRefused, match="at most 5,000"):
        projects.create("owner", importing.Book("Long", [importing.Draft("A", "word " * 1200)]))
    with pytest.raises(ImportRefused, match="at most 8"):
        projects.create("owner", importing.Book("Many", [importing.Draft(f"{n}", "Hi.") for n in range(9)]))
    assert projects.store.projects() == []


# ------------------------------------------------------------------------------------------- rendering
def test_a_render_stores_every_segment_and_an_edited_paragraph_is_all_that_renders_again(studio, service):
    projects, runner = studio
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    counting = Counting(service.engine)
    service.engine = counting
    try:
        job = wait_job(runner, runner.render(project.id).id)
        assert job["state"] == "done" and job["done"] == job["total"] == 5 and job["rendered"] == 5
        assert job["rtf"] > 0 and job["error"] is None
        view = projects.view(project.id)
        assert [c["state"] for c in view["chapters"]] == ["done"] * 3 and view["disk_bytes"] > 0
        before = [projects.chapter_pcm(project.id, n) for n in range(3)]
        texts = len(counting.texts)

        edited = "The boat left at dawn.\n\nThe sea was grey and still."
        projects.patch(project.id, {"chapters": [{"index": 0, "text": edited}]})
        assert [c["state"] for c in projects.view(project.id)["chapters"]] == ["stale", "done", "done"]
        again = wait_job(runner, runner.render(project.id).id)
        assert again["rendered"] == 1 and again["done"] == again["total"] == 5
        new_prompts = counting.texts[texts:]
        assert 1 <= len(new_prompts) <= 2  # the edited paragraph's one segment (and its retry if cut short)
        chapter = projects.chapter_view(project.id, 0)
        assert [s["state"] != "waiting" for s in chapter["segments"]] == [True, True]
        after = [projects.chapter_pcm(project.id, n) for n in range(3)]
        assert np.array_equal(before[1], after[1]) and np.array_equal(before[2], after[2])
        assert not np.array_equal(before[0], after[0])
        # the same text again is a render that exists: nothing runs
        projects.patch(project.id, {"chapters": [{"index": 0, "text": "The boat left at dawn.\n\nThe sea was calm."}]})
        assert wait_job(runner, runner.render(project.id).id)["rendered"] == 0
        assert np.array_equal(projects.chapter_pcm(project.id, 0), before[0])
    finally:
        service.engine = counting.engine


def test_a_render_writes_each_segments_row_once(studio, monkeypatch):
    """A job's worker keeps the book's plan between steps; the rows it has keyed since are not written again
    at every step (a book of n segments made n²/2 transactions)."""
    projects, runner = studio
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    writes = []
    set_segment = projects.store.set_segment
    monkeypatch.setattr(projects.store, "set_segment",
                        lambda *a, **k: (writes.append((a, k.get("key"))), set_segment(*a, **k))[1])
    job = wait_job(runner, runner.render(project.id).id)
    assert job["state"] == "done" and job["rendered"] == 5
    keyed = [w for w in writes if w[1] is not None]
    assert len(keyed) == len(set(keyed)) == 5


def test_chapters_added_to_a_job_as_it_finishes_are_rendered_by_it(studio, monkeypatch):
    """A render request widens the unfinished job; one that lands just as the worker finds nothing left (after
    it read the job's chapters, before it marks the job done) is rendered by that job, not left waiting."""
    projects, runner = studio
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    update_job, widened = projects.store.update_job, []

    def update(job_id, **fields):  # the worker's count just before it decides: none of the chapters read is left
        if not widened and fields.get("total") and fields.get("done") == fields["total"]:
            widened.append(runner.render(project.id, [1]).id)
        return update_job(job_id, **fields)

    monkeypatch.setattr(projects.store, "update_job", update)
    job = runner.render(project.id, [0]).id
    view = wait_job(runner, job)
    assert widened == [job] and view["state"] == "done" and view["chapters"] == [0, 1]
    assert [c["state"] for c in projects.view(project.id)["chapters"]] == ["done", "done", "not started"]


def test_segment_files_are_complete_flac_and_codes(studio):
    projects, runner = studio
    book = importing.from_text("One line here. And one more line after it.")
    project = projects.create("owner", book, PROJECT_SETTINGS)
    wait_job(runner, runner.render(project.id).id)
    for p in projects.planned(project.id):
        flac, codes = projects.store.render_paths(p.key)
        audio, rate = sf.read(flac, dtype="float32")
        render = projects.store.render(p.key)
        assert rate == 24000 and len(audio) == render.samples
        assert np.load(codes)["codes"].shape == (render.frames, 8)


def test_pause_resume_and_cancel_with_the_time_left(studio):
    projects, runner = studio
    long_book = "\n\n".join(f"# {c}\n\n" + "\n\n".join(f"Line {c} {n}." for n in range(3)) for c in "ABC")
    project = projects.create("owner", importing.from_text(long_book, markdown=True), PROJECT_SETTINGS)
    job = runner.render(project.id)
    deadline = time.monotonic() + 60
    while runner.view(job.id)["rendered"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert runner.pause(job.id).state == "paused"
    time.sleep(0.3)
    view = runner.view(job.id)
    assert view["state"] == "paused" and 2 <= view["done"] < view["total"] == 9
    assert view["rtf"] > 0 and view["eta_s"] > 0  # from the measured RTF and the speech left
    assert projects.view(project.id)["job"] == job.id
    assert runner.resume(job.id).state == "queued"
    assert wait_job(runner, job.id)["state"] == "done" and runner.view(job.id)["eta_s"] is None
    with pytest.raises(ValueError, match="done already"):
        runner.cancel(job.id)
    projects.set_segment(project.id, 1, 0)  # the next seed
    job = runner.render(project.id, [1])
    assert runner.cancel(job.id).state == "cancelled"
    assert projects.view(project.id)["job"] is None
    assert wait_job(runner, runner.render(project.id, [1]).id)["rendered"] == 1


def test_a_restart_sweeps_half_written_files_and_resumes_the_job_that_was_running(studio, service):
    projects, runner = studio
    runner.stop()  # the server that was killed
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    job = projects.store.add_job(project.id, None, 5)
    projects.store.update_job(job.id, state="running")  # as a killed server left it
    stray = projects.store.renders_dir / "ab" / "abcd.flac.tmp-123-456"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"half a file")
    again = JobRunner(projects, service)  # a new server on the same folder
    again.start()
    try:
        assert not stray.exists()
        assert wait_job(again, job.id)["state"] == "done"
    finally:
        again.stop()


def test_chapters_are_renamed_reordered_merged_and_skipped(studio):
    projects, _ = studio
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    projects.patch(project.id, {"chapters": [{"index": 2, "title": "Coda", "skip": True}], "order": [2, 0, 1]})
    chapters = projects.view(project.id)["chapters"]
    assert [(c["title"], c["skip"]) for c in chapters] == [("Coda", True), ("One", False), ("Two", False)]
    projects.patch(project.id, {"merge": [1, 2]})
    chapters = projects.view(project.id)["chapters"]
    assert [c["title"] for c in chapters] == ["Coda", "One"] and chapters[1]["segments"] == 4
    with pytest.raises(ValueError, match="empty"):
        projects.patch(project.id, {"chapters": [{"index": 0, "text": "  "}]})
    with pytest.raises(ValueError, match="No chapter 5"):
        projects.patch(project.id, {"chapters": [{"index": 5, "title": "x"}]})
    assert [c["title"] for c in projects.view(project.id)["chapters"]] == ["Coda", "One"]


# ------------------------------------------------------------------------------------------- HTTP
def test_the_api_creates_renders_and_serves_a_project(service, studio):
    client = projects_client(service, studio)
    r = client.post("/v1/projects", json={"title": "Sea", "text": BOOK, "format": "markdown",
                                          "settings": PROJECT_SETTINGS})
    assert r.status_code == 201, r.text
    project = r.json()
    assert [c["title"] for c in project["chapters"]] == ["One", "Two", "Three"]
    r = client.post(f"/v1/projects/{project['id']}/render", json={"chapters": [2]})
    assert r.status_code == 202
    job = r.json()
    deadline = time.monotonic() + 60
    while (job := client.get(f"/v1/jobs/{job['id']}").json())["state"] != "done":
        assert time.monotonic() < deadline and job["state"] in ("queued", "running"), job
        time.sleep(0.05)
    wav = client.get(f"/v1/projects/{project['id']}/chapters/2/audio")
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    audio, rate = sf.read(io.BytesIO(wav.content), dtype="int16")
    assert rate == 24000 and len(audio) == studio[0].chapter_audio(project["id"], 2).samples > 0
    r = client.get(f"/v1/projects/{project['id']}/chapters/0/audio")
    assert r.status_code == 400 and "not rendered yet" in r.json()["error"]["message"]
    r = client.patch(f"/v1/projects/{project['id']}", json={"title": "The Sea", "chapters": [{"index": 0, "skip": True}]})
    assert r.status_code == 200 and r.json()["title"] == "The Sea" and r.json()["chapters"][0]["skip"]
    r = client.post(f"/v1/projects/{project['id']}/chapters/2/segments/0/regenerate", json={"seed": 5})
    assert r.status_code == 202
    assert client.get(f"/v1/projects/{project['id']}/chapters/2").json()["segments"][0]["seed"] in (5, 6)
    assert client.get("/v1/projects").json()["projects"][0]["id"] == project["id"]
    assert client.delete(f"/v1/projects/{project['id']}").status_code == 204
    assert client.get(f"/v1/projects/{project['id']}").status_code == 404


def test_bad_requests_get_a_sentence_and_store_nothing(service, studio):
    client = projects_client(service, studio)
    assert client.post("/v1/projects", content=b"{nope", headers={"content-type": "application/json"}).status_code == 400
    r = client.post("/v1/projects", json={"text": "   "})
    assert r.status_code == 400 and "empty" in r.json()["error"]["message"]
    r = client.post("/v1/projects", files={"file": ("book.epub", b"PK\x03\x04 broken", "application/epub+zip")})
    assert r.status_code == 400 and "EPUB" in r.json()["error"]["message"]
    r = client.post("/v1/projects", files={"file": ("book.epub", b"x" * 300_000, "application/epub+zip")})
    assert r.status_code == 413
    r = client.post("/v1/projects", json={"text": "Hi.", "settings": {"voice": "Nobody"}})
    assert r.status_code == 400
    r = client.post("/v1/projects", json={"text": "Hi.", "settings": {"temperature": -1}})
    assert r.status_code == 400
    assert client.get("/v1/projects").json() == {"projects": []}
    assert list((studio[0].store.renders_dir).rglob("*")) == [] and list(studio[0].store.covers_dir.iterdir()) == []
    assert client.get("/v1/jobs/nope").status_code == 404


def test_an_epub_upload_keeps_its_cover_and_unticks_front_matter(service, studio):
    client = projects_client(service, studio)
    data = _epub([("Copyright", "<p>All rights reserved.</p>"), ("One", "<p>Hello there.</p>"),
                  ("Two", "<p>Bye now.</p>")])
    r = client.post("/v1/projects", files={"file": ("sea.epub", data, "application/epub+zip")},
                    data={"settings": '{"seed": 1}'})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["has_cover"] and body["author"] == "Ann Writer"
    assert [(c["title"], c["skip"]) for c in body["chapters"]] == [("Copyright", True), ("One", False), ("Two", False)]
    assert any("front matter" in note for note in body["notes"])


def test_a_keyed_studio_keeps_projects_to_its_owner(service, studio):
    client = projects_client(service, studio, key="k")
    assert client.get("/v1/projects").status_code == 401
    assert client.post("/v1/projects", json={"text": "Hi."}).status_code == 401
    ok = client.post("/v1/projects", json={"text": "Hi."}, headers={"Authorization": "Bearer k"})
    assert ok.status_code == 201
    assert client.get(f"/v1/projects/{ok.json()['id']}").status_code == 401
