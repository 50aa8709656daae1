"""The projects as the API, the MCP tool and the Projects tab use them: create, edit, read, and what an export
reads (`chapter_audio`, `book_meta`). Rendering is studio/projects/jobs.py; state is studio/projects/store.py.

    projects = Projects(store, service)
    project = projects.create(OWNER.key, importing.from_text(text, title="Book"), {"voice": "Narrator"})
    projects.view(project.id)                 # the JSON the API answers: chapters with their state, disk use
    projects.patch(project.id, {"chapters": [{"index": 0, "title": "Prologue"}], "order": [1, 0]})
    projects.chapter_audio(project.id, 0)     # ChapterAudio, read from the segment files with the take's joins
    projects.chapter_pcm(project.id, 0)       # the same samples as one array (tests)
    projects.captions(project.id, 0)          # studio.audio.captions.Captions of a chapter (None: the whole book)
    projects.acx(project.id, 0)               # the chapter's ACX report (studio/audio/acx.py), cached by its renders

A chapter is planned into segments when its text or the settings change (engine/longform.py, the long
form's planner); each segment's key (studio/projects/recipes.py) says whether it is rendered. What the model
reads of a segment is its planned text through the pronunciation dictionary (the owner's global one, then the
project's own rules, `patch({"dictionary": ...})`), applied when the book is planned, so a changed rule makes
exactly the segments holding its word stale.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace

from engine.attempts import CUT_SHORT
from engine.config import SAMPLE_RATE
from engine.longform import plan
from engine.normalize import AUTO
from engine.tokenizer import estimate_seconds
from engine.types import SEED_LIMIT, SamplingParams, new_seed
from studio.audio.acx import AcxReport
from studio.projects.casting import cast_of, cast_segments, checked_loudness, with_cast
from studio.projects.importing import MAX_TITLE_CHARS, Book, Draft, Limits, checked
from studio.projects.outputs import ChapterOutputs, chapter_index, pick
from studio.projects.recipes import SAMPLING_FIELDS, Planned, checkpoint_identity, plan_book
from studio.projects.store import Chapter, ProjectNotFound, SegmentRow, Store
from studio.takes.admission import OWNER
from studio.takes.prepare import lookup_voice
from studio.text.pronounce import Dictionary, digest, rules_json

SETTINGS = ("voice", "voices", "style", "seed", "normalize", "temperature", "top_k", "top_p", "repeat_guard",
            "max_frames", "loudness")
PROJECT_FIELDS = ("title", "author", "language", "settings", "dictionary", "chapters", "order", "merge")
SPOKEN_CACHE = 20_000  # (rules, text, voice, language) → what is read: the view is read every second
DICTIONARY_CACHE = 64  # projects' rule sets, checked


class Projects(ChapterOutputs):
    """Projects on `store`, planned and keyed for `service`'s engine and voices."""

    def __init__(self, store: Store, service, *, limits: Limits = Limits()):
        self.store, self.service, self.limits = store, service, limits
        self.checkpoint = checkpoint_identity(service.engine.info)
        self._active: dict[str, tuple[str, list[int] | None]] = {}  # project → its unfinished job (jobs.py)
        self._lengths: dict[tuple, int] = {}  # (key, trim_start, reference rms) → shaped samples
        self._rms: dict[str, float | None] = {}
        self._spoken: dict[tuple, tuple[str, str]] = {}
        self._dictionaries: dict[str, Dictionary] = {}
        self._acx: dict[tuple, AcxReport] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- settings and planning
    def settings(self, given: dict | None, base: dict | None = None) -> dict:
        """`given` over `base` (or the defaults), checked: a saved voice by id or name, a script's voices, a
        style preset or tag prefix, the sampling settings; a seed drawn when none is given, so the project
        renders the same every time."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(SETTINGS))
        if unknown:
            raise ValueError(f"Unknown setting(s) {', '.join(unknown)}; a project's settings are {', '.join(SETTINGS)}.")
        out = {"voice": None, "voices": None, "style": None, "seed": None, "normalize": True, "loudness": None,
               **SamplingParams().as_dict(), **(base or {}), **given}
        params = SamplingParams.of(**{k: out.get(k) for k in SAMPLING_FIELDS}, seed=out.get("seed"))  # ValueError
        out.update({k: getattr(params, k) for k in SAMPLING_FIELDS})
        out["seed"] = params.seed if params.seed is not None else new_seed()
        if not isinstance(out["normalize"], bool):
            raise ValueError("`normalize` must be true or false.")
        out["voice"] = self._voice_id(out["voice"])
        out["loudness"] = checked_loudness(out["loudness"])
        if out["voices"] is not None:
            if not isinstance(out["voices"], dict) or not out["voices"]:
                raise ValueError("`voices` maps a script's speakers to saved voices, e.g. {\"Alice\": \"Narrator\", "
                                 "\"Bob\": null}; null is zero-shot.")
            out["voices"] = {str(k): self._voice_id(v) for k, v in out["voices"].items()}
        if out["style"]:
            self.service.resolve_style(out["style"])  # ValueError for an unknown preset or a bad prefix
        else:
            out["style"] = None
        return out

    def _voice_id(self, voice) -> str | None:
        """A voice as written → the saved voice's id the project keeps, looked up as every take's voice is
        (studio/takes/prepare.py: an alias, a saved voice, an OpenAI name nothing stands for: zero-shot)."""
        record = lookup_voice(self.service, str(voice), OWNER)[0] if voice else None
        return record.id if record is not None else None

    def plan_chapter(self, text: str, settings: dict, language: str, cast: dict | None = None) -> list[SegmentRow]:
        """The chapter's segments, in its own voice and style where it is cast (studio/projects/casting.py)."""
        settings = with_cast(settings, cast)
        try:
            segments = plan(text, style=self.service.resolve_style(settings.get("style")),
                            normalize=settings.get("normalize", True), language=language or AUTO,
                            voices=settings.get("voices"))
        except ValueError as exc:
            raise ValueError(f"{str(exc)[:1].upper()}{str(exc)[1:]}.") from None
        return cast_segments([SegmentRow(s.index, s.text, s.source, s.pause_after, s.speaker, s.voice)
                              for s in segments], cast)

    # ---------------------------------------------------------------- create, edit, delete
    def create(self, owner: str, book: Book, settings: dict | None = None):
        """Store `book` as a new project (all of it, or nothing when a chapter cannot be planned)."""
        book = checked(book, self.limits)
        settings = self.settings(settings)
        language = book.language
        chapters = []
        for draft in book.chapters:
            if not draft.text.strip():
                continue
            try:
                chapters.append((draft.title, draft.text, draft.skip, self.plan_chapter(draft.text, settings, language)))
            except ValueError as exc:
                raise ValueError(f"Chapter {draft.title!r}: {exc}") from None
        return self.store.create_project(owner, title=_title(book.title), author=book.author, language=language,
                                         settings=settings, chapters=chapters, extra=book.extra, cover=book.cover,
                                         cover_type=book.cover_type if book.cover else None)

    def project(self, project_id: str, owner: str | None = None):
        return self.store.project(project_id, owner)

    def patch(self, project_id: str, changes: dict, owner: str | None = None) -> None:
        """Apply `changes` (docs/PROJECTS.md, PATCH): metadata, settings (every chapter is planned again), the
        project's pronunciation rules (`dictionary`: `{"rules": [...]}` or a list, the whole set; the segments
        whose rules change are stale), chapter edits, then `merge` [i, j] (j's text appended to i's, j
        removed), then `order`."""
        project = self.store.project(project_id, owner)
        unknown = sorted(set(changes) - set(PROJECT_FIELDS))
        if unknown:
            raise ValueError(f"Unknown field(s) {', '.join(unknown)}; send any of {', '.join(PROJECT_FIELDS)}.")
        meta = {}
        for name in ("title", "author", "language"):
            if name in changes:
                if not isinstance(changes[name], str):
                    raise ValueError(f"`{name}` must be a string.")
                meta[name] = _title(changes[name]) if name == "title" else changes[name].strip()
        settings = self.settings(changes["settings"], project.settings) if "settings" in changes else project.settings
        if "dictionary" in changes:  # PronunciationError (a ValueError) names the rule that cannot be used
            meta["dictionary"] = rules_json(Dictionary.from_json(changes["dictionary"] or []))["rules"]
        language = meta.get("language", project.language)
        # the export's loudness is no part of a plan: changing it renders nothing again
        replan = _planned(settings) != _planned(project.settings) or language != project.language
        chapters = self.store.chapters(project_id)
        rows = [[c.id, c.title, c.text, c.skip, False, c.cast] for c in chapters]  # [4]: to plan again
        for edit in _list(changes.get("chapters"), "chapters"):
            if not isinstance(edit, dict) or not isinstance(edit.get("index"), int):
                raise ValueError("Each entry of `chapters` is {\"index\": n, \"title\"?, \"skip\"?, \"text\"?, "
                                 "\"voice\"?, \"style\"?}.")
            row = rows[chapter_index(edit["index"], len(rows))]
            cast = cast_of(edit, row[5], self._voice_id, self.service.resolve_style)
            if cast != row[5]:
                row[4], row[5] = True, cast
            if "title" in edit:
                row[1] = _title(_string(edit["title"], "title"))
            if "skip" in edit:
                if not isinstance(edit["skip"], bool):
                    raise ValueError("`skip` must be true or false.")
                row[3] = edit["skip"]
            if "text" in edit:
                text = _string(edit["text"], "text")
                if not text.strip():
                    raise ValueError(f"Chapter {edit['index']}'s new text is empty; type its text, or skip the "
                                     "chapter instead.")
                row[2], row[4] = text, True
        if changes.get("merge") is not None:
            pair = changes["merge"]
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(i, int) for i in pair)):
                raise ValueError("`merge` is [i, j]: chapter j's text is appended to chapter i's.")
            i, j = (chapter_index(n, len(rows)) for n in pair)
            if i == j:
                raise ValueError("`merge` needs two different chapters.")
            rows[i][2], rows[i][4] = rows[i][2].rstrip() + "\n\n" + rows[j][2].lstrip(), True
            del rows[j]
        if changes.get("order") is not None:
            order = changes["order"]
            if not (isinstance(order, list) and sorted(order) == list(range(len(rows)))):
                raise ValueError(f"`order` lists every chapter's index once in the new order (0 … {len(rows) - 1}).")
            rows = [rows[i] for i in order]
        planned = []
        for cid, title, text, skip, edited, cast in rows:
            segments = None
            if edited or replan:
                try:
                    segments = self._keep_seeds(cid, self.plan_chapter(text, settings, language, cast))
                except ValueError as exc:
                    raise ValueError(f"Chapter {title!r}: {exc}") from None
            planned.append((cid, title, text, skip, segments, cast))
        checked(Book(project.title, [Draft(p[1], p[2]) for p in planned]), self.limits)
        if meta or settings != project.settings:
            self.store.update_project(project_id, **meta, settings=settings)
        self.store.replace_chapters(project_id, planned)

    def _keep_seeds(self, chapter_id: int | None, segments: list[SegmentRow]) -> list[SegmentRow]:
        """Seeds chosen by hand (regenerate) stay with their text through a new plan."""
        if chapter_id is None:
            return segments
        chosen = {s.text: s.seed for s in self.store.segments(chapter_id) if s.seed is not None}
        return [replace(s, seed=chosen.get(s.text)) for s in segments]

    def set_segment(self, project_id: str, chapter: int, segment: int, *, seed: int | None = None,
                    text: str | None = None, owner: str | None = None) -> None:
        """A segment to be made again: a new seed (the next one when `seed` is None), or new text (the chapter's
        text is edited where the segment's text stands, and the chapter planned again)."""
        self.store.project(project_id, owner)
        row = self._chapter(project_id, chapter)
        segments = self.store.segments(row.id)
        if not 0 <= segment < len(segments):
            raise ValueError(f"Chapter {chapter} has {len(segments)} segments (0 … {len(segments) - 1}).")
        target = segments[segment]
        if text is not None:
            text = _string(text, "text")
            if not text.strip():
                raise ValueError("The segment's new text is empty; type what it should say.")
            if target.source not in row.text:
                raise ValueError("This segment's text spans lines of the chapter; edit the chapter's text instead.")
            self.patch(project_id, {"chapters": [{"index": chapter, "text": row.text.replace(target.source, text, 1)}]})
            if seed is None:
                return
            segments = self.store.segments(row.id)
            target = next((s for s in segments if text.strip() in s.source), None)
            if target is None:
                return
        if seed is None:
            planned = next(p for p in self.planned(project_id) if p.chapter_id == row.id and p.position == target.position)
            render = self.store.render(planned.key)
            tried = (render.recipe.get("listen") or {}).get("attempts") if render else None  # listen and retry
            seed = ((tried[-1]["seed"] if tried else render.seed if render else planned.seed) + 1) % SEED_LIMIT
        self.store.set_segment(row.id, target.position, seed=SamplingParams(seed=seed).seed)

    def delete(self, project_id: str, owner: str | None = None) -> None:
        self.store.project(project_id, owner)
        self.store.delete_project(project_id)

    # ---------------------------------------------------------------- the plan with keys
    def planned(self, project_id: str) -> list[Planned]:
        return self._plan(self.store.project(project_id), self.store.chapters(project_id))

    def _plan(self, project, chapters: list[Chapter]) -> list[Planned]:
        def anchors(key: str) -> str | None:
            render = self.store.render(key)
            return render.anchor if render else None

        return plan_book(chapters, self.store.segments, project.settings, self.checkpoint, self._voice_identity,
                         anchors, self._speller(project))

    def dictionary(self, project) -> Dictionary:
        """The project's own pronunciation rules (they win over the owner's global ones), checked once per set
        (a regex rule's check probes it, and the plan is read every second while the tab is open)."""
        text = json.dumps(list(project.dictionary), sort_keys=True)
        found = self._dictionaries.get(text)
        if found is None:
            found = Dictionary.from_json(list(project.dictionary))
            with self._lock:
                if len(self._dictionaries) >= DICTIONARY_CACHE:
                    self._dictionaries.clear()
                self._dictionaries[text] = found
        return found

    def plan_stamp(self, project) -> tuple:
        """What the plan depends on beside the store's rows: when it changes, a job reads the plan again."""
        return project.updated, self.service.rules(self.dictionary(project)).version

    def _speller(self, project) -> Callable[[str, str | None], tuple[str, str]] | None:
        """`spoken(text, voice_id)` for the plan: (`text` as the model reads it, the fingerprint of the rules that
        fired), from one pass of the service's `pronounce` (studio/takes/service.py) with the owner's rules and
        the project's, scoped to the voice's id and name and the project's language. None without rules."""
        own = self.dictionary(project)
        version = self.service.rules(own).version
        if not version:
            return None
        language = project.language or None

        def spoken(text: str, voice_id: str | None) -> tuple[str, str]:
            voice = ()
            if voice_id is not None:
                record = self.service.voices.get(voice_id)
                voice = (record.id, record.name)
            cache = (version, text, voice, language)
            found = self._spoken.get(cache)
            if found is None:  # one pass of the rules: the text as spoken, and the key of the rules that fired
                said, fired = self.service.pronounce(text, voice, language, project=own)
                found = (said, digest(fired))
                with self._lock:
                    if len(self._spoken) >= SPOKEN_CACHE:
                        self._spoken.clear()
                    self._spoken[cache] = found
            return found
        return spoken

    def _voice_identity(self, voice_id: str) -> str:
        return self.service.voices.get(voice_id).content_hash

    def _chapter(self, project_id: str, index: int) -> Chapter:
        return pick(self.store.chapters(project_id), index)

    def _read(self, project_id: str, owner: str | None) -> tuple:
        """(the project, its chapters, its plan): what a view or a read of the audio starts from, read once."""
        project = self.store.project(project_id, owner)
        chapters = self.store.chapters(project_id)
        return project, chapters, self._plan(project, chapters)

    # ---------------------------------------------------------------- views
    def summary(self, project) -> dict:
        return {"id": project.id, "title": project.title, "author": project.author, "language": project.language,
                "created": project.created, "updated": project.updated}

    def view(self, project_id: str, owner: str | None = None) -> dict:
        project, chapters, planned = self._read(project_id, owner)
        renders = self.store.renders(p.key for p in planned if p.key)
        active = self.active_job(project_id)
        by_chapter: dict[int, list[Planned]] = {}
        for p in planned:
            by_chapter.setdefault(p.chapter_id, []).append(p)
        rows = [self._chapter_row(c, by_chapter.get(c.id, []), planned, renders, active) for c in chapters]
        return {**self.summary(project), "has_cover": project.cover_type is not None, "cover_type": project.cover_type,
                "extra": project.extra, "settings": project.settings,
                "dictionary": {"rules": list(project.dictionary)}, "disk_bytes": self.store.disk_bytes(project_id),
                "job": active[0] if active else None, "chapters": rows}

    def _chapter_row(self, chapter: Chapter, mine: list[Planned], planned: list[Planned], renders: dict,
                     active: tuple | None) -> dict:
        """A chapter as the project's view lists it: its state, how much is rendered, a cached ACX report."""
        done = [p for p in mine if p.key in renders]
        covered = active is not None and (active[1] is None or chapter.position in active[1])
        if mine and len(done) == len(mine):
            state = "done"
        elif covered and not chapter.skip:
            state = "rendering"
        elif chapter.finished:
            state = "stale"
        else:
            state = "not started"
        seconds = sum(renders[p.key].samples for p in done) / SAMPLE_RATE
        return {"index": chapter.position, "title": chapter.title, "skip": chapter.skip, "state": state,
                "voice": chapter.cast.get("voice"), "style": chapter.cast.get("style"),
                "segments": len(mine), "rendered": len(done), "seconds": round(seconds, 2),
                "characters": len(chapter.text), "acx": self._cached_acx(planned, mine) if state == "done" else None}

    def chapter_view(self, project_id: str, index: int, owner: str | None = None, *, acx: bool = True) -> dict:
        """The chapter with its segments; once it is rendered, its ACX report (`acx`: computed now when it is not
        cached; False: only a cached one, for a page's poll)."""
        project, chapters, planned = self._read(project_id, owner)
        chapter = pick(chapters, index)
        mine = [p for p in planned if p.chapter_id == chapter.id]
        renders = self.store.renders(p.key for p in mine if p.key)
        rows = []
        for p in mine:
            render = renders.get(p.key)
            if render is None:  # rendered once under another key (a rule, a seed changed): stale
                state = "stale" if p.rendered_key and p.rendered_key != p.key else "waiting"
            else:
                state = f"cut short ({render.stop_reason})" if render.stop_reason in CUT_SHORT else "done"
            # `voice`: the saved voice it was rendered in (its render's recipe), else the one it is planned in
            voice = render.recipe.get("voice") if render else p.voice_id
            rows.append({"index": p.position, "text": p.source, "spoken": p.text, "speaker": p.speaker, "voice": voice,
                         "seed": render.seed if render else p.seed, "retried": bool(render and render.retried),
                         "seconds": round(render.samples / SAMPLE_RATE, 2) if render else None,
                         "estimated_seconds": round(estimate_seconds(p.text), 1), "state": state, "key": p.key,
                         **_heard(render)})
        view = self._chapter_row(chapter, mine, planned, renders, self.active_job(project_id))
        if acx and view["state"] == "done":
            view["acx"] = self._acx_report(project, planned, chapter).as_dict()
        return {**view, "text": chapter.text, "segments": rows}

    # ---------------------------------------------------------------- jobs' bookkeeping (jobs.py sets it)
    def active_job(self, project_id: str) -> tuple[str, list[int] | None] | None:
        with self._lock:
            return self._active.get(project_id)

    def set_active(self, project_id: str, job: tuple[str, list[int] | None] | None) -> None:
        with self._lock:
            if job is None:
                self._active.pop(project_id, None)
            else:
                self._active[project_id] = job

    # ---------------------------------------------------------------- what an export reads


def _heard(render) -> dict:
    """A segment row's listen-and-retry fields (studio/projects/jobs.py): the kept WER and every attempt, or
    None when it was not listened to."""
    listen = render.recipe.get("listen") if render is not None else None
    return {"wer": listen["wer"] if listen else None, "attempts": listen["attempts"] if listen else None}


def _planned(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != "loudness"}


def _title(text: str) -> str:
    text = " ".join(str(text).split())[:MAX_TITLE_CHARS]
    if not text:
        raise ValueError("A title cannot be empty.")
    return text


def _string(value, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"`{name}` must be a string.")
    return value


def _list(value, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"`{name}` must be a list.")
    return value


__all__ = ["ProjectNotFound", "Projects"]
