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
import itertools
import shutil
from pathlib import Path

import gradio as gr

from engine.config import SAMPLE_RATE
from studio.api.access import Access
from studio.audio.formats import write_audio
from studio.audio.loudness import TARGETS
from studio.projects import importing
from studio.projects.export import EXPORT_FORMATS, chapter_export, export, levelled
from studio.takes.admission import OWNER
from studio.text.pronounce import from_tsv, rules_json, to_tsv
from studio.views.render import acx_html
from studio.views.toasts import warns

CHAPTER_HEADERS = ["#", "chapter", "state", "segments", "seconds"]
SEGMENT_HEADERS = ["#", "text", "seed", "seconds", "state", "WER"]
POLL_SECONDS = 1.0
OWNER_ONLY_PROJECTS = ("Projects are the studio's owner's: log in with the studio's key, or use /v1/projects with "
                       "`Authorization: Bearer <key>`.")
UPLOAD_TYPES = [".txt", ".md", ".markdown", ".epub"]
LOUDNESS_CHOICES = [("as rendered", "off"), *((f"{name} ({lufs:g} LUFS)", name) for name, lufs in TARGETS.items())]
CAPTION_FORMATS = ["srt", "vtt"]


def chapter_state(chapter: dict) -> str:
    """A chapter's state as the table says it: not started, rendering x of n, done, stale."""
    if chapter.get("skip"):
        return "skipped"
    if chapter["state"] == "rendering":
        return f"rendering {chapter['rendered']} of {chapter['segments']}"
    return chapter["state"]


def chapter_rows(project: dict | None) -> list[list]:
    if not project:
        return []
    return [[c["index"] + 1, c["title"], chapter_state(c), c["segments"], round(c.get("seconds") or 0, 1)]
            for c in project["chapters"]]


def segment_rows(chapter: dict | None) -> list[list]:
    if not chapter:
        return []
    # Seeds as text: they are 63-bit, more than a JavaScript number holds exactly. WER: what listen and retry
    # heard (studio/audio/listen.py), with the tries it took; "" when the segment was not listened to.
    return [[s["index"] + 1, s["text"], "" if s.get("seed") is None else str(s["seed"]),
             round(s.get("seconds") or 0, 1), s["state"], _wer(s)] for s in chapter["segments"]]


def _wer(segment: dict) -> str:
    wer, attempts = segment.get("wer"), segment.get("attempts") or []
    if wer is None:
        return ""
    return f"{wer:.2f}" + (f" ({len(attempts)} tries)" if len(attempts) > 1 else "")


def job_line(job: dict | None) -> str:
    """The render job in one line: state, segments done of total, time left, RTF, the error if any."""
    if not job:
        return "not rendered yet"
    parts = [job["state"], f"{job['done']} of {job['total']} segments"]
    if job["state"] in ("queued", "running") and job.get("eta_s") is not None:
        parts.append(f"about {_duration(job['eta_s'])} left")
    if job.get("rtf"):
        parts.append(f"RTF {job['rtf']:.2f}")
    if job.get("error"):
        parts.append(f"error: {job['error']}")
    return " · ".join(parts)


def summary_md(project: dict | None) -> str:
    if not project:
        return "No project open: create one below, or pick one."
    by = f" by {project['author']}" if project.get("author") else ""
    disk = project.get("disk_bytes") or 0
    return (f"**{project['title']}**{by} · {len(project['chapters'])} chapters · {disk / 1e6:.1f} MB on disk\n\n"
            f"Render: {job_line(project.get('job'))}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def project_choices(summaries: list[dict]) -> list[tuple[str, str]]:
    return [(f"{p['title']} ({p['id']})", p["id"]) for p in summaries]


class ProjectsView:
    """Builds the tab and handles its events over the projects library (`Projects`) and its `JobRunner`."""

    _files = itertools.count(1)

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
        project = self.project(project_id)
        return summary_md(project), chapter_rows(project), segment_rows(self.chapter(project_id, chapter))

    def _views(self, project_id: str | None, chapter: int | None) -> tuple:
        """(summary, chapter rows, segment rows, what they are: the `shown` state the timer compares)."""
        view = self.show(project_id, chapter)
        return (*view, [project_id, chapter, *view])

    # ------------------------------------------------------------------ handlers (plain functions)

    def reattach(self, remembered: str):
        """Page load: the list of projects, the one this browser had open (else the newest) and its state."""
        choices = self.choices()
        ids = [value for _, value in choices]
        project_id = remembered if remembered in ids else (ids[-1] if ids else None)
        return gr.update(choices=choices, value=project_id), project_id or "", *self._views(project_id, 1)

    def open(self, project_id: str):
        """Another project picked: its state from the first chapter, remembered by the browser."""
        return project_id or "", 1, *self._views(project_id, 1)

    def tick(self, project_id: str, chapter: int | None, shown):
        """The timer: the state again, and nothing sent when nothing changed (the tables keep their scroll)."""
        if not project_id:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        views = self._views(project_id, chapter)
        if shown == views[-1]:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
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
        return gr.update(choices=self.choices(), value=project.id), project.id, 1, *self._views(project.id, 1)

    def render(self, project_id: str):
        self.runner.render(self._id(project_id))
        return summary_md(self.project(project_id))

    def pause(self, project_id: str):
        return self._job_action("pause", project_id)

    def resume(self, project_id: str):
        return self._job_action("resume", project_id)

    def cancel(self, project_id: str):
        return self._job_action("cancel", project_id)

    def _job_action(self, action: str, project_id: str):
        """Pause, resume or cancel the project's unfinished job."""
        job = self.projects.active_job(self._id(project_id))
        if job is None:
            raise ValueError("This project has no render in progress; press Render to start one.")
        getattr(self.runner, action)(job[0])
        return summary_md(self.project(project_id))

    def pick_chapter(self, project_id: str, evt: gr.SelectData):
        """A click on a chapter's row: its segments below, its number in the chapter box."""
        chapter = int(evt.index[0]) + 1
        return chapter, segment_rows(self.chapter(project_id, chapter))

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
        return self.show(project_id, chapter + 1)

    def play_chapter(self, project_id: str, chapter) -> str:
        """The chapter as a WAV for the player (streamed to the file a block at a time)."""
        project_id = self._id(project_id)
        index, count = self._index(project_id, chapter), len(self.projects.store.chapters(project_id))
        audio = self.projects.chapter_audio(project_id, index, OWNER.key)
        return self._save(chapter_export(audio, self.projects.book_meta(project_id), "wav", index, count))

    def play_segment(self, project_id: str, chapter, segment) -> str:
        view = self.chapter(self._id(project_id), int(chapter or 0))
        if view is None:
            raise ValueError("Pick a chapter first (click its row).")
        index = int(segment or 0) - 1
        if not 0 <= index < len(view["segments"]):
            raise ValueError(f"Pick a segment between 1 and {len(view['segments'])}.")
        row = view["segments"][index]
        if row["state"] in ("waiting", "stale"):
            raise ValueError(f"Segment {index + 1} is not rendered yet.")
        path = self.out_dir / f"segment-{next(self._files)}-seed{row['seed']}.wav"
        return write_audio(path, self.projects.store.read_audio(row["key"]), SAMPLE_RATE)

    def export(self, project_id: str, fmt: str, chapter, loudness: str = "off"):
        """The download: the book (m4b, zip, acx, or wav / flac / mp3 in one file) or one chapter (wav / flac /
        mp3 / acx), each chapter levelled to `loudness` when one is chosen (not for acx: it levels itself)."""
        project_id = self._id(project_id)
        loudness = None if fmt == "acx" else loudness
        if chapter and fmt not in ("m4b", "zip"):
            meta = self.projects.book_meta(project_id, OWNER.key)
            index = self._index(project_id, chapter)
            audio = levelled([self.projects.chapter_audio(project_id, index, OWNER.key)], fmt, loudness)[0]
            made = chapter_export(audio, meta, fmt, index, len(self.projects.store.chapters(project_id)))
        else:
            chapters, meta = self.projects.book(project_id, OWNER.key)
            made = export(chapters, meta, fmt, loudness=loudness)
        path = self._save(made)
        return gr.update(value=path, label=f"Download {Path(path).name}")

    def captions(self, project_id: str, fmt: str, chapter):
        """The captions as a download: one chapter's, or the book's (chapter 0) timed as the M4B is."""
        project_id = self._id(project_id)
        index = self._index(project_id, chapter) if chapter else None
        found = self.projects.captions(project_id, index, OWNER.key, transcriber=self.transcriber)
        title = self.projects.project(project_id).title
        folder = self.out_dir / f"captions-{next(self._files)}"
        folder.mkdir()
        stem = "".join(ch for ch in title if ch.isalnum() or ch in " -_").strip() or "book"
        path = folder / f"{stem}{'' if index is None else f' - {index + 1:02d}'}.{fmt}"
        path.write_text(found.srt() if fmt == "srt" else found.vtt(), encoding="utf-8")
        if found.note:
            gr.Info(f"Captions: {found.note}.")
        return gr.update(value=str(path), label=f"Download {path.name}")

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
        return self.show(project_id, chapter)

    def acx_check(self, project_id: str, chapter) -> str:
        """The chosen chapter's ACX report (measured once per render of it) as a small table."""
        project_id = self._id(project_id)
        return acx_html(self.projects.acx(project_id, self._index(project_id, chapter), OWNER.key))

    def _save(self, made) -> str:
        """Write an export's body to a file in the page's folder, a piece at a time."""
        folder = self.out_dir / f"export-{next(self._files)}"
        folder.mkdir()
        path = folder / made.filename
        try:
            with open(path, "wb") as f:
                f.writelines(made.body)
        except BaseException:  # a failed export leaves no half file behind
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return str(path)

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
        with gr.Row():
            render = gr.Button("Render", variant="primary", elem_id="proj-render")
            pause = gr.Button("Pause", elem_id="proj-pause")
            resume = gr.Button("Resume", elem_id="proj-resume")
            cancel = gr.Button("Cancel", variant="stop", elem_id="proj-cancel")
        chapters = gr.Dataframe(headers=CHAPTER_HEADERS, interactive=False, wrap=True, elem_id="proj-chapters")
        with gr.Row():
            chapter = gr.Number(1, label="Chapter (click its row)", precision=0, minimum=1, elem_id="proj-chapter")
            play = gr.Button("Play chapter", elem_id="proj-play")
            check = gr.Button("ACX check", elem_id="proj-acx-check")
        player = gr.Audio(label="Chapter", type="filepath", interactive=False, elem_id="proj-player")
        acx_report = gr.HTML("", elem_id="proj-acx")
        segments = gr.Dataframe(headers=SEGMENT_HEADERS, interactive=False, wrap=True, elem_id="proj-segments")
        with gr.Row():
            segment = gr.Number(1, label="Segment (click its row)", precision=0, minimum=1, elem_id="proj-segment")
            seed = gr.Textbox("", label="New seed (empty: the next one)", elem_id="proj-seed")
            edited = gr.Textbox(label="Edited text (unchanged: a new seed only)", elem_id="proj-edited")
        with gr.Row():
            play_segment = gr.Button("Play segment", elem_id="proj-play-segment")
            redo = gr.Button("Regenerate segment", elem_id="proj-regenerate")
        segment_audio = gr.Audio(label="Segment", type="filepath", interactive=False, elem_id="proj-segment-audio")
        with gr.Row():
            fmt = gr.Dropdown(list(EXPORT_FORMATS), value="m4b", label="Export as (acx: Audible's MP3s in a ZIP)",
                              elem_id="proj-format")
            loudness = gr.Dropdown(LOUDNESS_CHOICES, value="off", label="Loudness", elem_id="proj-loudness")
            which = gr.Number(0, label="Chapter (0: the book; m4b and zip are always the book)", precision=0,
                              minimum=0, elem_id="proj-export-chapter")
            make = gr.Button("Export", elem_id="proj-export")
            caption_fmt = gr.Dropdown(CAPTION_FORMATS, value="srt", label="Captions", elem_id="proj-caption-format")
            make_captions = gr.Button("Captions", elem_id="proj-captions")
            download = gr.DownloadButton("Download", elem_id="proj-download")
        with gr.Accordion("Pronunciation rules of this project", open=False):
            rules = gr.Textbox(label="word<TAB>respelling[<TAB>regex<TAB>case_sensitive<TAB>voice<TAB>language], one a "
                                     "line; they win over the Studio tab's dictionary", lines=4, elem_id="proj-rules")
            with gr.Row():
                load_rules = gr.Button("Load", elem_id="proj-rules-load")
                save_rules = gr.Button("Save (changed words turn stale)", elem_id="proj-rules-save")
        with gr.Accordion("New project", open=False):
            with gr.Row():
                title = gr.Textbox(label="Title (empty: from the book)", elem_id="proj-title")
                author = gr.Textbox(label="Author", elem_id="proj-author")
            text = gr.Textbox(label="Text (or upload a book below)", lines=8, elem_id="proj-text")
            markdown = gr.Checkbox(False, label="The text is Markdown: its headings start chapters")
            upload = gr.File(label="Book (.txt, .md, .epub)", file_types=UPLOAD_TYPES, type="filepath")
            create = gr.Button("Create project", variant="primary", elem_id="proj-create")
        timer = gr.Timer(POLL_SECONDS)

        owner = functools.partial(self.access.owner_only, message=OWNER_ONLY_PROJECTS)
        private = {"api_visibility": "private"}
        views = [summary, chapters, segments, shown]
        # The page load's event (page.py adds it to demo.load): the project this browser had open, as it is now.
        self.load = (owner(warns(6)(self.reattach)), [remembered], [self.picker, remembered, *views])
        self.picker.input(owner(warns(6)(self.open)), [self.picker], [remembered, chapter, *views], **private)
        create.click(owner(warns(7)(self.create)), [title, author, text, upload, markdown],
                     [self.picker, remembered, chapter, *views], **private)
        # Outside the queue and without a spinner: a second's read of the database, not work to wait for.
        timer.tick(owner(self.tick), [self.picker, chapter, shown], views, queue=False, show_progress="hidden",
                   **private)
        render.click(owner(warns(1)(self.render)), [self.picker], summary, **private)
        for button, handler in ((pause, self.pause), (resume, self.resume), (cancel, self.cancel)):
            button.click(owner(warns(1)(handler)), [self.picker], summary, **private)
        chapters.select(owner(warns(2)(self.pick_chapter)), [self.picker], [chapter, segments], **private)
        segments.select(owner(self.pick_segment), None, [segment, edited], **private)
        play.click(owner(warns(1)(self.play_chapter)), [self.picker, chapter], player, **private)
        check.click(owner(warns(1)(self.acx_check)), [self.picker, chapter], acx_report, **private)
        load_rules.click(owner(warns(1)(self.load_rules)), [self.picker], rules, **private)
        save_rules.click(owner(warns(3)(self.save_rules)), [self.picker, rules, chapter], [summary, chapters, segments],
                         **private)
        play_segment.click(owner(warns(1)(self.play_segment)), [self.picker, chapter, segment], segment_audio,
                           **private)
        redo.click(owner(warns(3)(self.regenerate)), [self.picker, chapter, segment, seed, edited],
                   [summary, chapters, segments], **private)
        make.click(owner(warns(1)(self.export)), [self.picker, fmt, which, loudness], download, **private)
        make_captions.click(owner(warns(1)(self.captions)), [self.picker, caption_fmt, which], download, **private)


__all__ = ["ProjectsView", "chapter_rows", "chapter_state", "job_line", "segment_rows", "summary_md"]
