"""The "Projects" tab: a book on the server, its chapters and segments, its render job and its exports.

Everything shown comes from the project store on the server (docs/PROJECTS.md), read again by a timer while
the tab is open, so a closed tab, a reload or another browser shows the same state and the same progress; the
page only remembers (in the browser) which project was open. Rendering is the store's job, never this
page's: Render, Pause, Resume and Cancel only ask the job runner. Captions (SRT / WebVTT) and a chapter's ACX
check are made when asked, never by the timer. Thin over studio/projects/.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import gradio as gr

from studio.api.access import Access
from studio.audio.loudness import TARGETS
from studio.projects import importing
from studio.takes.admission import OWNER
from studio.text.pronounce import from_tsv, rules_json, to_tsv
from studio.views.project_cast import PROJECTS, ZERO_SHOT, ProjectEdits
from studio.views.project_outputs import CAPTION_FORMATS, FORMAT_CHOICES, NOTHING, ProjectOutputs
from studio.views.project_rows import (
    CHAPTER_HEADERS,
    CHAPTER_WIDTHS,
    SEGMENT_HEADERS,
    SEGMENT_WIDTHS,
    chapter_rows,
    chapter_state,
    controls,
    job_line,
    outputs,
    project_choices,
    segment_rows,
    summary_md,
)
from studio.views.toasts import warns

POLL_SECONDS = 1.0
OWNER_ONLY_PROJECTS = ("Projects are the studio's owner's: log in with the studio's key, or use /v1/projects with "
                       "`Authorization: Bearer <key>`.")
UPLOAD_TYPES = [".txt", ".md", ".markdown", ".epub"]
# Short labels that fit their boxes whole: the targets' levels are in the box's label.
LOUDNESS_CHOICES = [("as rendered", "off"), *((f"{name} {lufs:g}", name) for name, lufs in TARGETS.items())]
VIEWS = 12  # what `_views` fills: summary, the two tables, the four job buttons, the four outputs', `shown`


class ProjectsView(ProjectEdits, ProjectOutputs):
    """Builds the tab and handles its events over the projects library (`Projects`) and its `JobRunner`."""

    def __init__(self, projects, runner, out_dir: str | Path, access: Access | None = None, *, transcriber=None):
        self.projects, self.runner = projects, runner
        self.out_dir = Path(out_dir)
        self.access = access or Access()
        self.transcriber = transcriber  # word times inside a segment for the captions (studio/audio/asr.py)

    # ------------------------------------------------------------------ reading the server's state

    def choices(self) -> list[tuple[str, str]]:
        return project_choices([self.projects.summary(p) for p in self.projects.store.projects(OWNER.key)])

    def project(self, project_id: str) -> dict | None:
        """The project as the API shows it, with its latest job's progress (the unfinished one, else the last
        one that ended: done, cancelled or failed, and how far it got)."""
        if not project_id:
            return None
        project = self.projects.view(project_id, OWNER.key)
        jobs = self.projects.store.jobs(project_id)
        job = project.get("job") or (jobs[-1].id if jobs else None)
        project["job"] = self.runner.view(job) if job else None
        return project

    def chapter(self, project_id: str, chapter: int | None) -> dict | None:
        if not project_id or chapter is None or chapter < 1:
            return None
        count = len(self.projects.store.chapters(project_id))
        if chapter > count:
            return None  # the timer reads this every second: a cached ACX report only, never a measurement
        return self.projects.chapter_view(project_id, int(chapter) - 1, OWNER.key, acx=False)

    def show(self, project_id: str, chapter: int | None) -> tuple[str, list, list]:
        """(summary, chapter rows, the chosen chapter's segment rows)."""
        return self._views(project_id, chapter)[:3]

    def _views(self, project_id: str | None, chapter: int | None) -> tuple:
        """(summary, chapter rows, segment rows, Render / Pause / Resume / Cancel and Play chapter / ACX check /
        Export / Captions enabled where they apply, what they show: the `shown` state the timer compares)."""
        project = self.project(project_id)
        view = (summary_md(project), chapter_rows(project, self.voice_names()),
                segment_rows(self.chapter(project_id, chapter)))
        buttons = controls((project or {}).get("job"), project is not None) + outputs(project, chapter)
        return (*view, *(gr.update(interactive=on) for on in buttons), [project_id, chapter, *view, buttons])

    # ------------------------------------------------------------------ handlers (plain functions)

    def reattach(self, remembered: str):
        """Page load: the list of projects, the one this browser had open (else the newest) and its state."""
        choices = self.choices()
        ids = [value for _, value in choices]
        project_id = remembered if remembered in ids else (ids[-1] if ids else None)
        return (gr.update(choices=choices, value=project_id), project_id or "", *self.form(project_id),
                *self._views(project_id, 1))

    def open(self, project_id: str):
        """Another project picked: its state from the first chapter, remembered by the browser; the downloads
        of the one before are gone."""
        return project_id or "", 1, NOTHING, NOTHING, *self.form(project_id), *self._views(project_id, 1)

    def tick(self, project_id: str, chapter: int | None, shown):
        """The timer: the state again, and nothing sent when nothing changed (the tables keep their scroll)."""
        if not project_id:
            return (gr.skip(),) * VIEWS
        views = self._views(project_id, chapter)
        if shown == views[-1]:
            return (gr.skip(),) * VIEWS
        return views

    def create(self, title, author, text, upload, markdown):
        """A new project from the pasted text or the uploaded file; it opens at once."""
        limits = self.projects.limits
        title = (title or "").strip()
        if upload:
            path = Path(upload)
            book = importing.from_file(path.name, path.read_bytes(), title=title, limits=limits)
        else:
            book = importing.from_text(text or "", title=title, markdown=bool(markdown), limits=limits)
        if (author or "").strip():
            book = dataclasses.replace(book, author=author.strip())
        project = self.projects.create(OWNER.key, book)
        for note in book.notes:
            gr.Info(note)
        return (gr.update(choices=self.choices(), value=project.id), project.id, 1, *self.form(project.id),
                *self._views(project.id, 1))

    def render(self, project_id: str, chapter=1):
        self.runner.render(self._id(project_id))
        return self._views(project_id, chapter)

    def pause(self, project_id: str, chapter=1):
        return self._job_action("pause", project_id, chapter)

    def resume(self, project_id: str, chapter=1):
        return self._job_action("resume", project_id, chapter)

    def cancel(self, project_id: str, chapter=1):
        return self._job_action("cancel", project_id, chapter)

    def _job_action(self, action: str, project_id: str, chapter):
        """Pause, resume or cancel the project's unfinished job."""
        job = self.projects.active_job(self._id(project_id))
        if job is None:
            raise ValueError("This project has no render in progress; press Render to start one.")
        getattr(self.runner, action)(job[0])
        return self._views(project_id, chapter)

    def pick_chapter(self, project_id: str, evt: gr.SelectData):
        """A click on a chapter's row: its segments below, its number in the chapter box, its cast in the
        chapter's voice and style boxes."""
        chapter = int(evt.index[0]) + 1
        view = self.chapter(project_id, chapter) or {}
        return chapter, segment_rows(view or None), view.get("voice") or "", view.get("style") or ""

    @staticmethod
    def pick_segment(evt: gr.SelectData):
        """A click on a segment's row: its number and text in the edit boxes."""
        row = evt.row_value or []
        return int(evt.index[0]) + 1, row[1] if len(row) > 1 else ""

    def regenerate(self, project_id: str, chapter, segment, seed, text):
        """The segment again: a new seed (the next one when the box is empty) or edited text; a job renders it."""
        project_id = self._id(project_id)
        chapter, segment = self._index(project_id, chapter), int(segment or 0) - 1
        seed = (seed or "").strip()
        if seed and not seed.isdigit():
            raise ValueError(f"A seed is a whole number, not {seed!r}; leave the box empty for the next seed.")
        self.projects.set_segment(project_id, chapter, segment, seed=int(seed) if seed else None,
                                  text=(text or "").strip() or None)
        self.runner.render(project_id, [chapter])
        return self._views(project_id, chapter + 1)

    def load_rules(self, project_id: str) -> str:
        """The project's own pronunciation rules as TSV (the owner's global ones are in the Studio tab)."""
        project = self.projects.project(self._id(project_id), OWNER.key)
        return to_tsv(self.projects.dictionary(project))

    def save_rules(self, project_id: str, text: str, chapter):
        """Replace the project's rules with the TSV typed; the segments whose rules change turn stale."""
        project_id = self._id(project_id)
        active = self.projects.active_job(project_id)
        if active is not None and self.projects.store.job(active[0]).state == "running":
            raise ValueError("The project is rendering; pause or cancel it before changing its pronunciation rules.")
        self.projects.patch(project_id, {"dictionary": rules_json(from_tsv(text or ""))["rules"]}, OWNER.key)
        return self._views(project_id, chapter)

    def _index(self, project_id: str, chapter) -> int:
        """The page's chapter number (from 1) as the library's index (from 0), or a sentence saying the range."""
        count = len(self.projects.store.chapters(project_id))
        number = int(chapter or 0)
        if not 1 <= number <= count:
            raise ValueError(f"Pick a chapter between 1 and {count} (click its row).")
        return number - 1

    @staticmethod
    def _id(project_id: str) -> str:
        if not project_id:
            raise ValueError("Open a project first (or create one below).")
        return project_id

    # ------------------------------------------------------------------ layout

    def build(self) -> None:
        """The tab's components and events, inside an open `gr.Tab`."""
        remembered = gr.BrowserState("", storage_key="higgs-studio-project")  # which project this browser had open
        shown = gr.State(None)  # what the tables show, so the timer sends only changes
        self.picker = gr.Dropdown([], label="Project", elem_id="proj-picker")
        summary = gr.Markdown(summary_md(None), elem_id="proj-summary")
        with gr.Row():  # enabled where they apply to the project's latest render (project_rows.controls)
            render = gr.Button("Render", variant="primary", interactive=False, elem_id="proj-render")
            pause = gr.Button("Pause", interactive=False, elem_id="proj-pause")
            resume = gr.Button("Resume", interactive=False, elem_id="proj-resume")
            cancel = gr.Button("Cancel", variant="stop", interactive=False, elem_id="proj-cancel")
        chapters = gr.Dataframe(headers=CHAPTER_HEADERS, interactive=False, wrap=True, column_widths=CHAPTER_WIDTHS,
                                elem_id="proj-chapters")
        with gr.Row():
            chapter = gr.Number(1, label="Chapter (click its row)", precision=0, minimum=1, elem_id="proj-chapter")
            play = gr.Button("Play chapter", interactive=False, elem_id="proj-play")  # project_rows.outputs
            check = gr.Button("ACX check", interactive=False, elem_id="proj-acx-check")
        with gr.Accordion("Voices and style", open=True):
            with gr.Row():
                narrator = gr.Dropdown([ZERO_SHOT], value="", label="Narrator voice", elem_id="proj-narrator")
                style = gr.Dropdown([("none", "")], value="", label="Style", allow_custom_value=True,
                                    elem_id="proj-style")
                seed = gr.Textbox("", label="Seed", elem_id="proj-book-seed")
            script = gr.Textbox(label="Script voices: lines `Name: …` are spoken by the voice set here, one "
                                      "`Name = voice name` a line (as in Long form)", lines=2, elem_id="proj-script")
            save = gr.Button("Save voices and style", elem_id="proj-save-settings")
            with gr.Row():
                chapter_voice = gr.Dropdown([PROJECTS], value="", label="This chapter's voice",
                                            elem_id="proj-chapter-voice")
                chapter_style = gr.Dropdown([PROJECTS], value="", label="This chapter's style",
                                            allow_custom_value=True, elem_id="proj-chapter-style")
                cast = gr.Button("Cast the chapter", elem_id="proj-cast")
        player = gr.Audio(label="Chapter", type="filepath", interactive=False, elem_id="proj-player")
        acx_report = gr.HTML("", elem_id="proj-acx")
        segments = gr.Dataframe(headers=SEGMENT_HEADERS, interactive=False, wrap=True, column_widths=SEGMENT_WIDTHS,
                                elem_id="proj-segments")
        with gr.Row():
            segment = gr.Number(1, label="Segment (click its row)", precision=0, minimum=1, elem_id="proj-segment")
            new_seed = gr.Textbox("", label="New seed (empty: the next one)", elem_id="proj-seed")
            edited = gr.Textbox(label="Edited text (unchanged: a new seed only)", elem_id="proj-edited")
        with gr.Row():
            play_segment = gr.Button("Play segment", elem_id="proj-play-segment")
            redo = gr.Button("Regenerate segment", elem_id="proj-regenerate")
        segment_audio = gr.Audio(label="Segment", type="filepath", interactive=False, elem_id="proj-segment-audio")
        with gr.Row():
            fmt = gr.Dropdown(FORMAT_CHOICES, value="m4b", label="Export as", min_width=160, elem_id="proj-format")
            loudness = gr.Dropdown(LOUDNESS_CHOICES, value="off", label="Loudness (LUFS)", min_width=160,
                                   elem_id="proj-loudness")
            which = gr.Number(0, label="Chapter (0: the book)", precision=0, minimum=0, min_width=160,
                              elem_id="proj-export-chapter")
        with gr.Row():
            make = gr.Button("Export", interactive=False, elem_id="proj-export")
            download = gr.DownloadButton("Download", interactive=False, elem_id="proj-download")
            caption_fmt = gr.Dropdown(CAPTION_FORMATS, value="srt", label="Captions", min_width=120,
                                      elem_id="proj-caption-format")
            make_captions = gr.Button("Captions", interactive=False, elem_id="proj-captions")
            captions = gr.DownloadButton("Download", interactive=False, elem_id="proj-captions-download")
        with gr.Accordion("Pronunciation rules of this project", open=False):
            rules = gr.Textbox(label="word<TAB>respelling[<TAB>regex<TAB>case_sensitive<TAB>voice<TAB>language], one a "
                                     "line; they win over the Studio tab's dictionary", lines=4, elem_id="proj-rules")
            with gr.Row():
                load_rules = gr.Button("Load", elem_id="proj-rules-load")
                save_rules = gr.Button("Save (changed words turn stale)", elem_id="proj-rules-save")
        with gr.Accordion("Rename or delete this project", open=False):
            with gr.Row():
                name = gr.Textbox(label="Name", elem_id="proj-name")
                rename = gr.Button("Rename", elem_id="proj-rename")
                delete = gr.Button("Delete…", variant="stop", elem_id="proj-delete")
            with gr.Group(visible=False, elem_id="proj-confirm") as confirm:
                question = gr.Markdown("", elem_id="proj-confirm-question")
                with gr.Row():
                    yes = gr.Button("Yes, delete it", variant="stop", elem_id="proj-delete-yes")
                    keep = gr.Button("No, keep it", elem_id="proj-delete-no")
        with gr.Accordion("New project", open=False):
            with gr.Row():
                title = gr.Textbox(label="Title (empty: from the book)", elem_id="proj-title")
                author = gr.Textbox(label="Author", elem_id="proj-author")
            text = gr.Textbox(label="Text (or upload a book below)", lines=8, elem_id="proj-text")
            markdown = gr.Checkbox(False, label="The text is Markdown: its headings start chapters")
            upload = gr.File(label="Book (.txt, .md, .epub): chapter headings (\"Chapter 1\", \"Part II\") start "
                                   "chapters", file_types=UPLOAD_TYPES, type="filepath", elem_id="proj-upload")
            create = gr.Button("Create project", variant="primary", elem_id="proj-create")
        timer = gr.Timer(POLL_SECONDS)

        owner = functools.partial(self.access.owner_only, message=OWNER_ONLY_PROJECTS)
        private = {"api_visibility": "private"}
        views = [summary, chapters, segments, render, pause, resume, cancel, play, check, make, make_captions, shown]
        form = [narrator, style, seed, script, loudness, name, chapter_voice, chapter_style]
        n = len(views)
        # The page load's event (page.py adds it to demo.load): the project this browser had open, as it is now.
        self.load = (owner(warns(2 + len(form) + n)(self.reattach)), [remembered],
                     [self.picker, remembered, *form, *views])
        self.picker.input(owner(warns(4 + len(form) + n)(self.open)), [self.picker],
                          [remembered, chapter, download, captions, *form, *views], **private)
        create.click(owner(warns(3 + len(form) + n)(self.create)), [title, author, text, upload, markdown],
                     [self.picker, remembered, chapter, *form, *views], **private)
        # Outside the queue and without a spinner: a second's read of the database, not work to wait for.
        timer.tick(owner(self.tick), [self.picker, chapter, shown], views, queue=False, show_progress="hidden",
                   **private)
        for button, handler in ((render, self.render), (pause, self.pause), (resume, self.resume),
                                (cancel, self.cancel)):
            button.click(owner(warns(n)(handler)), [self.picker, chapter], views, **private)
        chapters.select(owner(warns(4)(self.pick_chapter)), [self.picker], [chapter, segments, chapter_voice,
                                                                             chapter_style], **private)
        segments.select(owner(self.pick_segment), None, [segment, edited], **private)
        play.click(owner(warns(1)(self.play_chapter)), [self.picker, chapter], player, **private)
        check.click(owner(warns(1)(self.acx_check)), [self.picker, chapter], acx_report, **private)
        save.click(owner(warns(n)(self.save_settings)), [self.picker, narrator, style, seed, script, chapter], views,
                   **private)
        cast.click(owner(warns(n)(self.cast_chapter)), [self.picker, chapter, chapter_voice, chapter_style], views,
                   **private)
        loudness.input(owner(warns(0)(self.save_loudness)), [self.picker, loudness], None, **private)
        rename.click(owner(warns(1 + n)(self.rename)), [self.picker, name], [self.picker, *views], **private)
        delete.click(owner(warns(2)(self.ask_delete)), [self.picker], [confirm, question], **private)
        keep.click(self.keep, None, confirm, **private)
        yes.click(owner(warns(3 + len(form) + n)(self.delete)), [self.picker],
                  [confirm, self.picker, remembered, *form, *views], **private)
        load_rules.click(owner(warns(1)(self.load_rules)), [self.picker], rules, **private)
        save_rules.click(owner(warns(n)(self.save_rules)), [self.picker, rules, chapter], views, **private)
        play_segment.click(owner(warns(1)(self.play_segment)), [self.picker, chapter, segment], segment_audio,
                           **private)
        redo.click(owner(warns(n)(self.regenerate)), [self.picker, chapter, segment, new_seed, edited], views,
                   **private)
        make.click(owner(warns(1)(self.export)), [self.picker, fmt, which, loudness], download, **private)
        make_captions.click(owner(warns(1)(self.captions)), [self.picker, caption_fmt, which], captions, **private)


__all__ = ["ProjectsView", "chapter_rows", "chapter_state", "controls", "job_line", "project_choices", "segment_rows",
           "summary_md"]
