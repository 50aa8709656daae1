"""Books as people write them (studio/projects/headings.py, importing.py), the Projects tab's words
(studio/views/project_rows.py), and casting a chapter to a saved voice (studio/projects/casting.py) rendered by
the job runner on the demo engine, checked in the store's render records."""
from __future__ import annotations

import pytest

from studio.projects import importing
from studio.views.project_rows import controls, job_line, outputs, project_choices, segment_state
from tests.helpers import store_released_without

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

BOOK_TXT = """The Quiet Sea
by Ann Writer

Chapter 1

The boat left at dawn.

CHAPTER TWO

The wind turned at noon.

Part II

Chapter 3: The Storm

Nobody spoke that night.
"""


def test_a_txt_with_chapter_headings_becomes_those_chapters():
    book = importing.from_file("book.txt", BOOK_TXT.encode())
    assert (book.title, book.author) == ("The Quiet Sea", "Ann Writer")  # not the file's name
    assert [(c.title, c.text) for c in book.chapters] == [
        ("Chapter 1", "The boat left at dawn."), ("CHAPTER TWO", "The wind turned at noon."),
        ("Part II · Chapter 3: The Storm", "Nobody spoke that night.")]
    # A sentence that starts with "Chapter" is not a heading; no heading: one chapter named after the file.
    plain = importing.from_file("notes.txt", b"Chapter one of my life was quiet, and I liked it.\nThe end.")
    assert (plain.title, [c.title for c in plain.chapters]) == ("notes", ["notes"])
    # The title typed on the page wins over the book's.
    assert importing.from_file("book.txt", BOOK_TXT.encode(), title="Mine").title == "Mine"


def test_a_markdown_files_first_heading_is_its_title():
    book = importing.from_file("book.md", b"# The Sea\n\nA calm sea. It was late.\n")
    assert (book.title, [c.text for c in book.chapters]) == ("The Sea", ["A calm sea. It was late."])
    book = importing.from_file("book.md", b"# The Sea\n\n# One\n\nA.\n\n# Two\n\nB.\n")
    assert (book.title, [c.title for c in book.chapters], book.notes) == ("The Sea", ["One", "Two"], [])
    book = importing.from_file("book.md", b"# The Sea\n\n## One\n\nA.\n\n## Two\n\nB.\n")
    assert (book.title, [c.title for c in book.chapters]) == ("The Sea", ["One", "Two"])
    # Chapters as plain "Chapter n" lines in a .md are found as in a .txt.
    book = importing.from_file("book.md", b"The Sea\n\nChapter 1\n\nA calm sea.\n\nChapter 2\n\nLate.\n")
    assert (book.title, [c.title for c in book.chapters]) == ("The Sea", ["Chapter 1", "Chapter 2"])
    # `# One` and `# Two`, each with its text, are chapters; the title is then the file's name.
    book = importing.from_file("Two Doors.md", b"# One\n\nA red door.\n\n# Two\n\nA blue door.\n")
    assert (book.title, [c.title for c in book.chapters]) == ("Two Doors", ["One", "Two"])


def test_projects_of_one_title_are_told_apart_in_the_picker():
    summaries = [{"id": "a1", "title": "book"}, {"id": "b2", "title": "Sea"}, {"id": "c3", "title": "book"}]
    assert project_choices(summaries) == [("book", "a1"), ("Sea", "b2"), ("book (2)", "c3")]


def test_the_tab_says_states_in_whole_plain_words():
    assert segment_state("cut short (repeat_guard)") == "cut short: repeating"
    assert segment_state("cut short (max_frames)") == "cut short: too long"
    assert (segment_state("waiting"), segment_state("stale")) == ("not rendered", "out of date")
    job = {"done": 0, "total": 2, "eta_s": 30, "rtf": None, "error": None}
    assert job_line({**job, "state": "paused"}) == "paused at 0 of 2 segments"
    assert job_line({**job, "state": "running"}) == "rendering 0 of 2 segments · about 30 s left"


def test_render_pause_resume_and_cancel_apply_only_to_the_jobs_state():
    # (render, pause, resume, cancel)
    assert controls(None) == (True, False, False, False)
    assert controls({"state": "running"}) == (False, True, False, True)
    assert controls({"state": "queued"}) == (False, True, False, True)
    assert controls({"state": "paused"}) == (False, False, True, True)
    for ended in ("done", "cancelled", "failed"):
        assert controls({"state": ended}) == (True, False, False, False)
    assert controls(None, has_project=False) == (False, False, False, False)


def test_play_acx_export_and_captions_apply_once_something_is_rendered():
    # (play chapter, ACX check, export, captions)
    book = {"chapters": [{"state": "done"}, {"state": "rendering"}, {"state": "stale"}]}
    assert outputs(book, 1) == (True, True, True, True)
    assert outputs(book, 2) == outputs(book, 3) == (False, False, True, True)  # another chapter is rendered
    assert outputs(book, 4) == outputs(book, None) == (False, False, True, True)
    assert outputs({"chapters": [{"state": "not started"}, {"state": "stale"}]}, 1) == (False,) * 4
    assert outputs(None, 1) == (False,) * 4


def test_a_new_export_first_empties_the_download(tmp_path):
    """The download never offers the earlier export's file while a new one is made."""
    from unittest import mock

    from studio.views.projects import ProjectsView

    view = ProjectsView(mock.MagicMock(), mock.MagicMock(), tmp_path)
    made = tmp_path / "book.m4b"
    view.export_file = mock.MagicMock(return_value=str(made))
    view.captions_file = mock.MagicMock(return_value=str(tmp_path / "book.srt"))
    for steps in (view.export("p1", "m4b", 0), view.captions("p1", "srt", 0)):
        first = next(steps)
        assert first["value"] is None and first["interactive"] is False  # nothing to download meanwhile
        last = next(steps)
        assert last["value"].startswith(str(tmp_path)) and last["interactive"] is True


# ------------------------------------------------------------------------------------------ casting
@pytest.fixture(scope="module")
def studio(tmp_path_factory, shared_engine):
    """A service with two saved voices, and a projects library with its job runner."""
    from studio.takes.service import StudioService
    from studio.voices import VoiceLibrary
    from tests.fakes import add_voices
    from tests.helpers import running_projects

    tmp = tmp_path_factory.mktemp("casting")
    library = VoiceLibrary(tmp / "voices")
    service = StudioService(shared_engine(max_batch=2), library)
    add_voices(library, service, (("Narrator", 140.0), ("Bella", 220.0)))
    with running_projects(service, tmp / "projects") as (projects, runner):
        yield service, projects, runner
    service.close()


def test_a_chapter_cast_to_a_saved_voice_is_rendered_in_it(studio):
    from tests.helpers import wait_job

    service, projects, runner = studio
    voices = {v.name: v.id for v in service.list_voices()}
    text = "Chapter 1\n\nA red door.\n\nChapter 2\n\nA blue door.\n"
    project = projects.create("owner", importing.from_text(text, title="Cast"), {"voice": "Narrator", "max_frames": 25})
    wait_job(runner, runner.render(project.id).id)
    before = {s["key"] for s in projects.chapter_view(project.id, 0)["segments"]}

    projects.patch(project.id, {"chapters": [{"index": 1, "voice": "bella", "style": None}]})
    view = projects.view(project.id)
    assert [c["voice"] for c in view["chapters"]] == [None, voices["Bella"]]
    assert [c["state"] for c in view["chapters"]] == ["done", "stale"]  # only the cast chapter is made again
    assert wait_job(runner, runner.render(project.id).id)["state"] == "done"

    cast = projects.chapter_view(project.id, 1)["segments"]
    assert [(s["text"], s["voice"]) for s in cast] == [("A blue door.", voices["Bella"])]
    assert cast[0]["state"] not in ("waiting", "stale")  # rendered (the demo's takes may be cut short)
    assert projects.store.render(cast[0]["key"]).recipe["voice"] == voices["Bella"]  # what made the audio
    assert {s["key"] for s in projects.chapter_view(project.id, 0)["segments"]} == before  # chapter 1 untouched
    assert projects.chapter_view(project.id, 0)["segments"][0]["voice"] == voices["Narrator"]

    with pytest.raises(ValueError, match="No voice called 'Nobody At All'"):
        projects.patch(project.id, {"chapters": [{"index": 0, "voice": "Nobody At All"}]})
    with pytest.raises(ValueError, match="not a saved voice"):  # the model's own voice is the narrator's null
        projects.patch(project.id, {"chapters": [{"index": 0, "voice": "default"}]})
    projects.patch(project.id, {"chapters": [{"index": 1, "voice": None}]})  # back to the project's narrator
    assert projects.view(project.id)["chapters"][1]["voice"] is None


def test_script_lines_take_the_voices_the_map_gives(studio):
    _, projects, _ = studio
    voices = {v.name: v.id for v in studio[0].list_voices()}
    script = importing.from_text("Ann: Hello there.\nBob: And welcome back.")
    project = projects.create("owner", script, {"voices": {"Ann": "Narrator", "Bob": "bella"}})
    assert [(p.speaker, p.voice_id) for p in projects.planned(project.id)] == [("Ann", voices["Narrator"]),
                                                                               ("Bob", voices["Bella"])]


def test_a_projects_loudness_is_kept_renders_nothing_again_and_levels_its_exports(studio):
    import io

    import pyloudnorm
    import soundfile as sf

    from tests.helpers import projects_client, wait_job

    service, projects, runner = studio
    project = projects.create("owner", importing.from_text("A calm sea. The gulls cried."), {"max_frames": 25})
    wait_job(runner, runner.render(project.id).id)
    keys = [p.key for p in projects.planned(project.id)]
    projects.patch(project.id, {"settings": {"loudness": "audiobook"}})
    assert projects.project(project.id).settings["loudness"] == "audiobook"
    assert [p.key for p in projects.planned(project.id)] == keys
    with pytest.raises(ValueError, match="loudness"):
        projects.patch(project.id, {"settings": {"loudness": "very loud"}})

    client = projects_client(service, (projects, runner))
    url = f"/v1/projects/{project.id}/export?format=wav&chapter=0"
    loudness = {}
    for name, query in (("project's", ""), ("as rendered", "&loudness=off")):
        audio, rate = sf.read(io.BytesIO(client.get(url + query).content))
        loudness[name] = pyloudnorm.Meter(rate).integrated_loudness(audio)
    assert loudness["project's"] == pytest.approx(-18, abs=0.5)  # no loudness asked: the project's
    assert abs(loudness["as rendered"] - -18) > 0.5


def test_a_store_made_before_casting_gains_the_column(tmp_path):
    store = store_released_without(tmp_path, "chapters", "cast")
    project = store.create_project("owner", title="Old", settings={"seed": 1}, chapters=[("One", "Hi.", False, [])])
    assert [c.cast for c in store.chapters(project.id)] == [{}]
    store.close()


def test_the_tabs_voice_and_style_boxes_set_the_projects_narrator_seed_and_script_voices(studio, tmp_path):
    from studio.views.projects import ProjectsView

    service, projects, runner = studio
    voices = {v.name: v.id for v in service.list_voices()}
    view = ProjectsView(projects, runner, tmp_path)
    project = projects.create("owner", importing.from_text("Ann: Hello there.\nBob: And welcome back."),
                              {"voices": {"Ann": None, "Bob": None}})
    with pytest.raises(ValueError, match="whole number"):
        view.save_settings(project.id, "", "", "4x", "", 1)
    with pytest.raises(ValueError, match="Speaker = voice name"):
        view.save_settings(project.id, "", "", "", "Ann Narrator", 1)
    view.save_settings(project.id, voices["Narrator"], "", "42", "Ann = Narrator\nBob = Bella", 1)
    settings = projects.project(project.id).settings
    assert (settings["voice"], settings["seed"]) == (voices["Narrator"], 42)
    assert settings["voices"] == {"Ann": voices["Narrator"], "Bob": voices["Bella"]}
    assert [p.voice_id for p in projects.planned(project.id)] == [voices["Narrator"], voices["Bella"]]
    narrator, _, seed, script, loudness, name, *_ = view.form(project.id)  # the boxes as the project has them
    assert (narrator["value"], seed, script, loudness, name) == (
        voices["Narrator"], "42", "Ann = Narrator\nBob = Bella", "off", project.title)

    view.rename(project.id, "Greetings")
    assert projects.project(project.id).title == "Greetings"
    with pytest.raises(ValueError, match="cannot be empty"):
        view.rename(project.id, "  ")
    projects.set_active(project.id, ("job", None))  # a render not finished: deleting waits for a cancel
    with pytest.raises(ValueError, match="cancel it first"):
        view.delete(project.id)
    projects.set_active(project.id, None)
    view.delete(project.id)
    assert project.id not in [p.id for p in projects.store.projects()]
