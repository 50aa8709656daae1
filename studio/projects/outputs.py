"""What a project's rendered chapters make: a chapter's audio as an export reads it (each segment's stored
audio shaped and joined as engine/longtake.py joins a long take, pauses as bounded silence blocks), the
book's metadata, captions and the ACX report. `Projects` (studio/projects/library.py) takes these methods from
`ChapterOutputs`; they read the project through its `_read` and keep their caches on it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from engine.config import SAMPLE_RATE
from engine.joins import pause_samples, shape_segment, silence_blocks, speech_rms
from studio.audio.acx import AcxReport, acx_check
from studio.audio.captions import Captions, captions, shown_texts
from studio.projects.recipes import Planned
from studio.projects.store import Chapter
from studio.projects.types import BookMeta, ChapterAudio

ACX_CACHE = 64  # chapters' ACX reports kept, each under the keys its audio is made of


class ChapterOutputs:
    """The outputs of a project's chapters; mixed into `Projects`, which holds `store`, `checkpoint`, the
    caches (`_rms`, `_lengths`, `_acx`, `_lock`) and `_read(project_id, owner)`."""

    def book_meta(self, project_id: str, owner: str | None = None) -> BookMeta:
        return book_metadata(self.store.project(project_id, owner), self.store.cover(project_id))

    def chapter_audio(self, project_id: str, index: int, owner: str | None = None) -> ChapterAudio:
        """Chapter `index` as the export reads it: each segment's stored audio shaped for the take (silence
        trimmed, loudness matched to the book's first segment, faded) and followed by its pause, as
        engine/longtake.py joins a long take. ValueError while a segment is not rendered."""
        project, chapters, planned = self._read(project_id, owner)
        return self._chapter_audio(project, planned, pick(chapters, index))

    def _chapter_audio(self, project, planned: list[Planned], chapter: Chapter) -> ChapterAudio:
        mine = [p for p in planned if p.chapter_id == chapter.id]
        renders = self.store.renders(p.key for p in mine if p.key)
        missing = [p for p in mine if p.key not in renders]
        if missing:
            raise ValueError(f"Chapter {chapter.position} ({chapter.title!r}) is not rendered yet: "
                             f"{len(mine) - len(missing)} of {len(mine)} segments. Render it first "
                             f"(POST /v1/projects/{project.id}/render).")
        reference = next((p for p in planned if p.reference), None)
        rms = self._reference_rms(reference.key) if reference is not None else None
        parts = [(p.key, p.position > 0, None if p.reference else rms, pause_samples(p.pause_after)) for p in mine]
        spans, samples = [], 0
        for key, trim, ref, pause in parts:
            length = self._shaped_length(key, trim, ref)
            spans.append((samples, samples + length))
            samples += length + pause

        def blocks() -> Iterator[np.ndarray]:
            for key, trim, ref, pause in parts:
                yield shape_segment(self.store.read_audio(key), trim_start=trim, reference_rms=ref)
                if pause:
                    yield from silence_blocks(pause)

        recipe = {"chapter": chapter.title, "settings": project.settings, "checkpoint": self.checkpoint,
                  "segments": [{"text": p.text, "source": p.source, "speaker": p.speaker, "voice": p.voice_id,
                                "pause_after": p.pause_after, "seed": renders[p.key].seed, "planned_seed": p.seed,
                                "stop_reason": renders[p.key].stop_reason, "key": p.key} for p in mine]}
        return ChapterAudio(title=chapter.title, samples=samples, blocks=blocks, recipe=recipe, spans=tuple(spans))

    def book(self, project_id: str, owner: str | None = None) -> tuple[list[ChapterAudio], BookMeta]:
        """Every chapter not skipped, in order, and the book's metadata: what a whole-book export reads."""
        project, chapters, planned = self._read(project_id, owner)
        return ([self._chapter_audio(project, planned, c) for c in chapters if not c.skip],
                book_metadata(project, self.store.cover(project_id)))

    def chapter_pcm(self, project_id: str, index: int) -> np.ndarray:
        """The chapter's samples in one array (what the tests compare; an export streams `blocks`)."""
        audio = self.chapter_audio(project_id, index)
        pcm = audio.whole()
        assert len(pcm) == audio.samples
        return pcm

    # ---------------------------------------------------------------- captions and the ACX check
    def captions(self, project_id: str, index: int | None = None, owner: str | None = None, *,
                 level: str = "sentence", transcriber=None) -> Captions:
        """Chapter `index`'s captions (None: the whole book, every chapter not skipped, its times counted from the
        book's first sample as the M4B's chapters are). Each segment's cue starts at its first sample in the
        chapter as `chapter_audio` joins it; times inside a segment are the `transcriber`'s (studio/audio/asr.py)
        when it is on, else estimated and marked (studio/audio/captions.py). ValueError while a chapter is unrendered."""
        project, chapters, planned = self._read(project_id, owner)
        if index is not None:
            return self._chapter_captions(project, planned, pick(chapters, index), level, transcriber)[0]
        found, offset, segments, notes = [], 0, 0, []
        for chapter in chapters:
            if chapter.skip:
                continue
            part, samples, count = self._chapter_captions(project, planned, chapter, level, transcriber)
            shift = offset / SAMPLE_RATE
            found += [replace(c, start=c.start + shift, end=c.end + shift, segment=c.segment + segments)
                      for c in part.cues]
            notes += [part.note] if part.note and part.note not in notes else []
            offset += samples
            segments += count
        if not segments:
            raise ValueError(f"Project {project.title!r} has no chapters to caption (every chapter is skipped).")
        return Captions(found, "; ".join(notes) or None)

    def _chapter_captions(self, project, planned: list[Planned], chapter: Chapter, level: str, transcriber
                          ) -> tuple[Captions, int, int]:
        """(the chapter's captions, its samples, its segments)."""
        audio = self._chapter_audio(project, planned, chapter)
        mine = [p for p in planned if p.chapter_id == chapter.id]
        pcm = None
        if level != "segment" and transcriber is not None and transcriber.off_note is None:
            pcm = audio.whole()  # heard only with ASR on
        made = captions(shown_texts(mine), list(audio.spans), audio.samples, level=level, audio=pcm,
                        transcriber=transcriber)
        return made, audio.samples, len(mine)

    def acx(self, project_id: str, index: int, owner: str | None = None) -> AcxReport:
        """Chapter `index`'s ACX report (studio/audio/acx.py `acx_check` of its samples as exported), kept under the
        keys its audio is made of, so it is measured once per render, not on every read."""
        project, chapters, planned = self._read(project_id, owner)
        return self._acx_report(project, planned, pick(chapters, index))

    def _acx_report(self, project, planned: list[Planned], chapter: Chapter) -> AcxReport:
        cache = _acx_key(planned, [p for p in planned if p.chapter_id == chapter.id])
        found = self._acx.get(cache)
        if found is None:
            found = acx_check(self._chapter_audio(project, planned, chapter).whole(), SAMPLE_RATE)
            with self._lock:
                if len(self._acx) >= ACX_CACHE:
                    self._acx.pop(next(iter(self._acx)))
                self._acx[cache] = found
        return found

    def _cached_acx(self, planned: list[Planned], mine: list[Planned]) -> dict | None:
        found = self._acx.get(_acx_key(planned, mine))
        return found.as_dict() if found is not None else None

    def _reference_rms(self, key: str) -> float | None:
        if key not in self._rms:
            self._rms[key] = speech_rms(shape_segment(self.store.read_audio(key), trim_start=False,
                                                      reference_rms=None)) or None
        return self._rms[key]

    def _shaped_length(self, key: str, trim: bool, ref: float | None) -> int:
        cache = (key, trim, ref)
        if cache not in self._lengths:
            self._lengths[cache] = len(shape_segment(self.store.read_audio(key), trim_start=trim, reference_rms=ref))
        return self._lengths[cache]


def _acx_key(planned: list[Planned], mine: list[Planned]) -> tuple:
    """What a chapter's audio is made of: its segments' keys and pauses, and the book's loudness reference."""
    reference = next((p.key for p in planned if p.reference), None)
    return reference, tuple((p.key, p.position > 0, p.pause_after) for p in mine)


def book_metadata(project, cover: bytes | None) -> BookMeta:
    return BookMeta(title=project.title, author=project.author, language=project.language, cover=cover,
                    cover_type=project.cover_type or "image/jpeg", extra=dict(project.extra))


def pick(chapters: list[Chapter], index: int) -> Chapter:
    return chapters[chapter_index(index, len(chapters))]


def chapter_index(n: int, count: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < count:
        raise ValueError(f"No chapter {n}: the project has {count} (0 … {count - 1}).")
    return n


__all__ = ["ACX_CACHE", "ChapterOutputs", "book_metadata", "chapter_index", "pick"]
