"""Rendering is a job, not a request: one worker thread in the server renders the projects' segments through the
studio's service, in turn with every other caller.

    runner = JobRunner(projects, service)
    runner.start()                         # sweeps temporary files, resumes every unfinished job
    job = runner.render(project_id)        # queued; the worker picks it up
    runner.view(job.id)                    # state, done / total, measured RTF, ETA, error
    runner.pause(job.id); runner.resume(job.id); runner.cancel(job.id)

A job is a caller of its own in the fair admission (studio/takes/admission.py), counted in segments: each segment
is one turn (`job.turn()` between segments), so a book never holds a slot while others wait. Its state is
in the database and nothing it needs lives only in memory: after each segment the book's plan is read again
(studio/projects/recipes.py), the anchor and the loudness reference come from their files, so a job resumed
after a kill (or a closed tab: no browser holds it) renders exactly what it would have. A kill loses at most
the segment in flight: its files are complete on disk before its row exists (studio/projects/store.py).

Listen and retry (`listener`, studio/audio/listen.py, on when the studio's ASR is): each segment is transcribed and
scored by its word error rate; above the threshold it is generated again with the next seed, and the best
attempt kept, as a long take does (engine/longtake.py `again` / `best`). The render's recipe records every
attempt's seed and WER and the kept seed (`recipe["listen"]`); the render row's seed is the kept one, so
generating that seed again reproduces the audio with no retry. Off, `view()` says so in `listen.note`.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from engine.attempts import Attempt, again, best
from engine.config import SAMPLE_RATE
from engine.delay import default_max_frames
from engine.prompt import VoiceRef
from engine.tokenizer import estimate_seconds
from engine.types import SEED_LIMIT, SamplingParams
from studio.projects.library import Projects
from studio.projects.recipes import SAMPLING_FIELDS, Planned, anchor_identity, anchor_of_render
from studio.projects.store import UNFINISHED, ProjectNotFound, as_stored
from studio.projects.types import JobRow
from studio.takes.admission import Caller
from studio.takes.order import Order

log = logging.getLogger("higgs.projects")

CALLER = Caller("projects", owner=True)  # the owner's renders: one share of the line beside the owner's takes
IDLE_POLL_S = 1.0


class JobRunner:
    """The worker that renders the queued jobs one at a time, oldest first."""

    def __init__(self, projects: Projects, service, *, listener=None):
        self.projects, self.store, self.service = projects, projects.store, service
        self.listener = listener  # listen and retry (studio/audio/listen.py); None: segments are not checked
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: tuple[str, threading.Event] | None = None  # the running job and its cancel
        # One owner's control at a time: render's look-then-add is atomic (twelve requests at once get one
        # job, not eight), and a pause or cancel never interleaves with a render widening the same job.
        self._control = threading.Lock()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- life
    def start(self) -> None:
        """Remove what a kill left half-written, put the jobs that were running back in the queue, and start."""
        swept = self.store.sweep()
        if swept:
            log.info("removed %d file(s) a kill left behind", swept)
        for job in self.store.jobs(states=UNFINISHED):
            if job.state == "running":
                self.store.update_job(job.id, state="queued")
            self.projects.set_active(job.project, (job.id, job.chapters))
        self._thread = threading.Thread(target=self._loop, name="higgs-projects", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._lock:
            if self._current is not None:
                self._current[1].set()
        if self._thread is not None:
            self._thread.join(10)

    # ---------------------------------------------------------------- the owner's controls
    def render(self, project_id: str, chapters: list[int] | None = None) -> JobRow:
        """A job for `chapters` (positions; None: every chapter not skipped). A project has one unfinished job
        at a time: asked again, that job takes the new chapters too (and resumes if it was paused)."""
        count = len(self.store.chapters(project_id))
        if chapters is not None:
            bad = [n for n in chapters if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < count]
            if bad or not chapters:
                raise ValueError(f"`chapters` lists chapter indexes 0 … {count - 1}; got {chapters!r}.")
            chapters = sorted(set(chapters))
        with self._control:
            for job in self.store.jobs(project_id, UNFINISHED):
                wider = None if job.chapters is None or chapters is None else sorted(set(job.chapters) | set(chapters))
                if not self.store.update_job(job.id, chapters=wider, only_if=UNFINISHED):
                    continue  # it finished just now: a new job takes the chapters
                if job.state == "paused":
                    self.store.update_job(job.id, state="queued", only_if=["paused"])
                self.projects.set_active(project_id, (job.id, wider))
                self._wake.set()
                return self.store.job(job.id)
            selected = self._selected(self.projects.planned(project_id), chapters)
            job = self.store.add_job(project_id, chapters, len(selected))
            self.projects.set_active(project_id, (job.id, chapters))
        self._wake.set()
        return job

    def pause(self, job_id: str) -> JobRow:
        with self._control:
            return self._stop_job(job_id, "paused")

    def cancel(self, job_id: str) -> JobRow:
        with self._control:
            job = self._stop_job(job_id, "cancelled")
            self.projects.set_active(job.project, None)
        return job

    def resume(self, job_id: str) -> JobRow:
        with self._control:
            job = self.store.job(job_id)
            if job.state != "paused":
                raise ValueError(f"Job {job_id} is {job.state}; only a paused job resumes.")
            self.store.update_job(job_id, state="queued", only_if=["paused"])
        self._wake.set()
        return self.store.job(job_id)

    def _stop_job(self, job_id: str, state: str) -> JobRow:
        job = self.store.job(job_id)
        if job.state not in UNFINISHED:
            raise ValueError(f"Job {job_id} is {job.state} already.")
        if state == "paused" and job.state == "paused":
            return job
        self.store.update_job(job_id, state=state, only_if=UNFINISHED)
        with self._lock:
            if self._current is not None and self._current[0] == job_id:
                self._current[1].set()  # the segment in flight stops within a frame; it is not kept
        return self.store.job(job_id)

    def view(self, job_id: str) -> dict:
        """The job as the API answers it, with its measured RTF and the estimated time left."""
        job = self.store.job(job_id)
        rtf = job.wall_s / job.audio_s if job.audio_s > 0 else None
        eta = None
        if job.state in UNFINISHED:
            selected = self._selected(self.projects.planned(job.project), job.chapters)
            rendered = self.store.renders(p.key for p in selected if p.key)
            left = sum(estimate_seconds(p.text) for p in selected if p.key not in rendered)
            eta = round(left * rtf, 1) if rtf is not None else None
        return {"id": job.id, "project": job.project, "state": job.state, "chapters": job.chapters, "done": job.done,
                "total": job.total, "rendered": job.rendered, "rtf": None if rtf is None else round(rtf, 4),
                "eta_s": eta, "audio_s": round(job.audio_s, 2), "wall_s": round(job.wall_s, 2), "error": job.error,
                "created": job.created, "updated": job.updated, "listen": self._listening()}

    def _listening(self) -> dict:
        """Listen and retry as a job applies it: on (threshold, retries) or off, with the reason."""
        if self.listener is None:
            return {"on": False, "note": "Listen and retry is off: no transcriber is configured; segments are not "
                                         "checked."}
        return self.listener.describe()

    # ---------------------------------------------------------------- the worker
    def _loop(self) -> None:
        while not self._stop.is_set():
            queued = self.store.jobs(states=["queued"])
            if not queued:
                self._wake.wait(IDLE_POLL_S)
                self._wake.clear()
                continue
            try:
                self._run(queued[0])
            except ProjectNotFound:  # deleted while it rendered (the job's rows went with it)
                self.projects.set_active(queued[0].project, None)
            except Exception:  # the worker outlives any one job
                log.exception("render job %s", queued[0].id)

    def _run(self, job: JobRow) -> None:
        if not self.store.update_job(job.id, state="running", only_if=["queued"]):
            return
        request = Order(text=f"project {job.project}", caller=CALLER, door="project")
        handle = self.service.handle(request, SamplingParams(seed=0), [],
                                     lambda line_job, h: self._work(job.id, line_job, h))
        with self._lock:
            self._current = (job.id, handle.cancel)
        try:
            for _ in handle.stream():
                pass
        except ProjectNotFound:
            raise
        except Exception as exc:  # the job fails with the reason; the server and the other jobs go on
            log.exception("render job %s failed", job.id)
            self.store.update_job(job.id, state="failed", error=f"{type(exc).__name__}: {exc}"[:500],
                                  only_if=["running"])
        finally:
            with self._lock:
                self._current = None
        after = self.store.job(job.id)
        if after.state == "running" and self._stop.is_set():
            self.store.update_job(job.id, state="queued", only_if=["running"])  # shutting down: resumed at start
        elif after.state not in UNFINISHED:
            self.projects.set_active(after.project, None)

    def _work(self, job_id: str, line_job, handle) -> None:
        """On the GPU worker: render the job's next unrendered segment, take a new turn, until none is left."""
        plan: tuple | None = None  # (the project's `updated`, the plan): read again only after a change
        written: set[tuple] = set()  # (chapter, position, key) rows this worker set: the cached plan predates them
        try:
            while not handle.cancel.is_set():
                job = self.store.job(job_id)
                if job.state != "running":
                    return
                project = self.projects.project(job.project)
                stamp = self.projects.plan_stamp(project)
                if plan is None or plan[0] != stamp:  # an edit, a rule changed
                    plan, written = (stamp, self.projects.planned(job.project)), set()
                planned = plan[1]
                selected = self._selected(planned, job.chapters)
                renders = self.store.renders(p.key for p in selected if p.key)
                self._record(planned, renders, written)
                pending = [p for p in selected if p.key not in renders]
                self.store.update_job(job_id, done=len(selected) - len(pending), total=len(selected))
                if not pending:
                    # A render widening this job holds the control lock: the job ends only if its chapters are
                    # still those just read; widened meanwhile, it goes on with the new ones.
                    with self._control:
                        if self.store.job(job_id).chapters != job.chapters:
                            continue
                        self.store.update_job(job_id, state="done", only_if=["running"])
                    return
                target = next((p for p in pending if p.key is not None), None)
                if target is None:
                    raise RuntimeError("a segment's zero-shot anchor is not part of the job")
                started = time.perf_counter()
                made = self._render(target, project.settings, handle.cancel)
                if made is None:
                    return
                if target.anchor_of is not None:
                    plan = None  # the segments cloned from this anchor have keys now
                self.store.set_segment(target.chapter_id, target.position, key=target.key)
                written.add((target.chapter_id, target.position, target.key))
                job = self.store.job(job_id)
                self.store.update_job(job_id, done=job.done + 1, rendered=job.rendered + 1,
                                      audio_s=job.audio_s + made / SAMPLE_RATE,
                                      wall_s=job.wall_s + time.perf_counter() - started)
                line_job.turn()
        finally:
            handle.finish()

    def _record(self, planned: list[Planned], renders: dict, written: set[tuple]) -> None:
        """Rows name the key they are rendered under; a chapter with every segment rendered is finished.
        `written`: the rows set since `planned` was read (its `rendered_key` is older), added to here."""
        chapters: dict[int, bool] = {}
        for p in planned:
            row = (p.chapter_id, p.position, p.key)
            if p.key in renders and p.rendered_key != p.key and row not in written:
                self.store.set_segment(p.chapter_id, p.position, key=p.key)
                written.add(row)
            chapters[p.chapter_id] = chapters.get(p.chapter_id, True) and p.key in renders
        self.store.mark_finished(chapter_id for chapter_id, complete in chapters.items() if complete)

    @staticmethod
    def _selected(planned: list[Planned], chapters: list[int] | None) -> list[Planned]:
        """The job's segments in book order: its chapters' (every chapter not skipped when None), the anchors
        they are cloned from, and the book's loudness reference."""
        chosen = [p for p in planned if (p.chapter in chapters if chapters is not None else not p.skip)]
        needed = {p.anchored_on for p in chosen if p.anchored_on}
        wanted = set(map(id, chosen))
        return [p for p in planned if id(p) in wanted or p.reference or (p.anchor_of is not None and p.key in needed)]

    def _render(self, p: Planned, settings: dict, cancel: threading.Event) -> int | None:
        """Generate `p` (a cut-short take once more with the next seed, as a long take does; listening, a take
        heard wrong too, the best attempt kept) and store it; returns its samples, or None when cancelled
        (nothing is stored)."""
        engine = self.service.engine
        if p.voice_id is not None:
            voice = self.service.voices.voice_ref(p.voice_id, encode=self.service.encode_codes)
        elif p.anchored_on is not None:
            codes, transcript = anchor_of_render(self.store.read_audio(p.anchored_on),
                                                 self.store.read_codes(p.anchored_on), self._text_of(p.anchored_on))
            voice = VoiceRef(codes=torch.from_numpy(codes), transcript=transcript)
        else:
            voice = None
        prompt = engine.build_prompt(p.text, voice=voice)
        options = {k: settings[k] for k in SAMPLING_FIELDS if k != "max_frames"}  # the cap is per segment
        cap = settings.get("max_frames") or default_max_frames(p.text)
        listening = self.listener is not None and self.listener.off_note is None
        retries = self.listener.retries if listening else 0
        above = self.listener.above if listening else 0.0
        seed, started = p.seed, time.perf_counter()
        attempts: list[Attempt] = []
        made: list[tuple[np.ndarray, np.ndarray]] = []
        while True:
            chunks, last = [], None
            for chunk in engine.generate_stream(prompt=prompt, seed=seed, max_frames=cap, cancel=cancel, **options):
                chunks.append(np.asarray(chunk.audio, dtype=np.float32))
                last = chunk
            if cancel.is_set() or last is None or last.metrics.stop_reason == "cancelled":
                return None
            audio = np.concatenate(chunks)
            heard = self.listener.check(p.text, audio) if listening else None
            attempts.append(Attempt(seed, last.metrics.stop_reason, heard))
            made.append((audio, last.codes.cpu().numpy()))
            if not again(attempts, above=above, retries=retries):
                break
            seed = (seed + 1) % SEED_LIMIT
        kept = best(attempts)
        (audio, codes), seed = made[kept], attempts[kept].seed
        anchor = None
        if p.anchor_of is not None:
            anchor = anchor_identity(*anchor_of_render(as_stored(audio), codes, p.text))
        recipe = {"text": p.text, "voice": p.voice_id, "speaker": p.speaker, "planned_seed": p.seed, "seed": seed,
                  "settings": {k: settings.get(k) for k in SAMPLING_FIELDS},
                  "anchored_on": p.anchored_on, "checkpoint": self.projects.checkpoint}
        if listening:
            recipe["listen"] = {"wer": attempts[kept].as_dict()["wer"], "kept": kept, "above": above,
                                "retries": retries, "attempts": [a.as_dict() for a in attempts]}
        self.store.save_render(p.key, audio, codes, seed=seed, stop_reason=attempts[kept].stop_reason,
                               retried=seed != p.seed, anchor=anchor, wall_s=time.perf_counter() - started,
                               recipe=recipe)
        return len(audio)

    def _text_of(self, key: str) -> str:
        render = self.store.render(key)
        return render.recipe["text"] if render else ""

