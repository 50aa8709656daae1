"""The Projects tab's outputs (studio/views/projects.py takes them from `ProjectOutputs`): a chapter or a
segment to hear, a chapter's ACX check, and the exports and captions as files to download, each written into
the page's folder a piece at a time. Which of them apply (a chapter rendered, anything rendered) is
project_rows.outputs."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import gradio as gr

from engine.config import SAMPLE_RATE
from studio.audio.formats import write_audio
from studio.projects.export import chapter_export, export, levelled
from studio.takes.admission import OWNER
from studio.views.render import acx_html

FORMAT_CHOICES = [("M4B book", "m4b"), ("ZIP of MP3s", "zip"), ("ACX (Audible)", "acx"), ("MP3", "mp3"),
                  ("WAV", "wav"), ("FLAC", "flac")]
CAPTION_FORMATS = [("SRT", "srt"), ("WebVTT", "vtt")]
MAKING = gr.update(value=None, interactive=False, label="Making the file…")
NOTHING = gr.update(value=None, interactive=False, label="Download")


class ProjectOutputs:
    """Mixed into `ProjectsView`, which holds `projects`, `out_dir`, `transcriber`, `chapter()`, `_id()` and
    `_index()`."""

    _files = itertools.count(1)

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
        """The export's download button: emptied at once (never the file an earlier export made), then the
        new file once it is written."""
        yield MAKING
        try:
            path = self.export_file(project_id, fmt, chapter, loudness)
        except ValueError:
            yield NOTHING
            raise
        yield gr.update(value=path, interactive=True, label=f"Download {Path(path).name}")

    def export_file(self, project_id: str, fmt: str, chapter, loudness: str = "off") -> str:
        """The book (m4b, zip, acx, or wav / flac / mp3 in one file) or one chapter (wav / flac / mp3 / acx) as
        a file, each chapter levelled to `loudness` when one is chosen (not for acx: it levels itself)."""
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
        return self._save(made)

    def captions(self, project_id: str, fmt: str, chapter):
        """The captions' download button, emptied at once, then the file: as `captions_file`."""
        yield MAKING
        try:
            path = self.captions_file(project_id, fmt, chapter)
        except ValueError:
            yield NOTHING
            raise
        yield gr.update(value=path, interactive=True, label=f"Download {Path(path).name}")

    def captions_file(self, project_id: str, fmt: str, chapter) -> str:
        """The captions as a file: one chapter's, or the book's (chapter 0) timed as the M4B is."""
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
        return str(path)

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
