"""Projects over HTTP: a book in, render jobs, chapter audio (docs/PROJECTS.md and docs/API.md have the fields).

Every route is the owner's: on a keyed studio it needs the key (`Authorization: Bearer`), as the voice
library's routes do, and without a key the cross-site rule guards the writes. Routes validate and format;
studio/projects/ does the work.
"""

from __future__ import annotations

import json
from dataclasses import replace

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.formparsers import MultiPartException

from studio.api.model import FORM_OVERHEAD, ApiError, Routes
from studio.projects import importing
from studio.projects.export import Export, chapter_export, export, levelled, wav
from studio.projects.store import ProjectNotFound
from studio.takes.admission import OWNER

CREATE_FIELDS = ("title", "author", "language", "text", "format", "settings")
CAPTION_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}


class ProjectRoutes(Routes):
    """`/v1/projects…` and `/v1/jobs…` over a `Projects` library and its `JobRunner`."""

    def __init__(self, service, access, limiter, *, projects, runner, transcriber=None):
        super().__init__(service, access, limiter)
        self.projects, self.runner = projects, runner
        self.transcriber = transcriber  # word times inside a segment for captions (studio/audio/asr.py); None: estimated

    async def _call(self, fn, *args):
        """`fn(*args)` in a thread, its ValueErrors as 400s and a missing project or job as a 404."""
        try:
            return await self.in_thread(fn, *args)
        except ProjectNotFound as exc:
            raise ApiError(404, str(exc), code="not_found") from None
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None

    async def _json(self, request: Request, limit: int = FORM_OVERHEAD) -> dict:
        body = await self.read_body(request, limit)
        try:
            data = json.loads(body or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, "The body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise ApiError(400, "Send a JSON object.")
        return data

    def _owned(self, project_id: str):
        return self.projects.project(project_id, OWNER.key)

    # ---------------------------------------------------------------- projects
    async def create(self, request: Request) -> JSONResponse:
        """JSON `{title, author?, language?, text, format?: "text"|"markdown", settings?}`, or multipart with a
        `file` (.txt, .md, .epub) and the same fields (`settings` as a JSON string)."""
        self.check_auth(request)
        self.check_site(request)
        limits = self.projects.limits
        kind = request.headers.get("content-type", "")
        if "multipart/form-data" in kind:
            await self.read_body(request, limits.max_bytes + FORM_OVERHEAD)
            try:
                form = await request.form(max_files=1, max_fields=16, max_part_size=limits.max_bytes + 1)
            except MultiPartException as exc:  # starlette's sentences: too many files, a part too large
                raise ApiError(400, f"Could not parse the multipart form: {exc.message}") from None
            except Exception:
                raise ApiError(400, "Could not parse the multipart form; send the book as multipart/form-data "
                                    "with one `file` field.") from None
            upload = form.get("file")
            fields = {k: str(form.get(k) or "") for k in CREATE_FIELDS}
            try:
                fields["settings"] = json.loads(fields["settings"]) if fields["settings"].strip() else None
            except json.JSONDecodeError:
                raise ApiError(400, "Field `settings` must be a JSON object.", param="settings") from None
            if upload is None or isinstance(upload, str):
                if not fields["text"].strip():
                    raise ApiError(400, "Send the book as a `file` (.txt, .md, .epub) or as `text`.", param="file")
                data, name = None, None
            else:
                data, name = await upload.read(), upload.filename or "book.txt"
        else:
            fields = await self._json(request, limits.max_chars * 4 + FORM_OVERHEAD)
            unknown = sorted(set(fields) - set(CREATE_FIELDS))
            if unknown:
                raise ApiError(400, f"Unknown field(s) {', '.join(unknown)}; send any of {', '.join(CREATE_FIELDS)}.")
            data = name = None
        for key in ("title", "author", "language", "text", "format"):
            if fields.get(key) is not None and not isinstance(fields[key], str):
                raise ApiError(400, f"`{key}` must be a string.", param=key)
        if fields.get("settings") is not None and not isinstance(fields["settings"], dict):
            raise ApiError(400, "`settings` must be an object.", param="settings")
        fmt = (fields.get("format") or "text").strip().lower()
        if fmt not in ("text", "markdown"):
            raise ApiError(400, "`format` is \"text\" or \"markdown\".", param="format")

        def build():
            title = (fields.get("title") or "").strip()
            if data is not None:
                book = importing.from_file(name, data, title=title, limits=limits)
            else:
                book = importing.from_text(fields.get("text") or "", title=title, markdown=fmt == "markdown",
                                           limits=limits)
            for key in ("author", "language"):
                if (fields.get(key) or "").strip():
                    book = replace(book, **{key: fields[key].strip()})
            project = self.projects.create(OWNER.key, book, fields.get("settings"))
            return {**self.projects.view(project.id), "notes": book.notes}

        try:
            body = await self._call(build)
        except ApiError as exc:
            if "MB; the limit is" in exc.message or "a project holds at most" in exc.message:
                exc.status = 413
            raise
        return JSONResponse(body, status_code=201)

    async def list_projects(self, request: Request) -> JSONResponse:
        self.check_auth(request)

        def listing():
            return [{**self.projects.summary(p), "job": (self.projects.active_job(p.id) or (None,))[0]}
                    for p in self.projects.store.projects(OWNER.key)]
        return JSONResponse({"projects": await self._call(listing)})

    async def get_project(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        return JSONResponse(await self._call(self.projects.view, request.path_params["project_id"], OWNER.key))

    async def patch_project(self, request: Request) -> JSONResponse:
        """Any of `title`, `author`, `language`, `settings`, `chapters: [{index, title?, skip?, text?}]`,
        `merge: [i, j]`, `order: [old indexes]`; answers the project as it is now."""
        self.check_auth(request)
        self.check_site(request)
        project_id = request.path_params["project_id"]
        changes = await self._json(request, self.projects.limits.max_chars * 4 + FORM_OVERHEAD)
        if not changes:
            raise ApiError(400, "Send a JSON object with the changes, e.g. {\"title\": \"…\"}.")

        def patch():
            self._owned(project_id)
            if self.projects.active_job(project_id) is not None and any(
                    k in changes for k in ("chapters", "merge", "order", "settings", "language", "dictionary")):
                job = self.projects.active_job(project_id)[0]
                state = self.projects.store.job(job).state
                if state == "running":
                    raise ValueError(f"The project is rendering (job {job}); pause or cancel the job before "
                                     "changing its chapters or settings.")
            self.projects.patch(project_id, changes, OWNER.key)
            return self.projects.view(project_id)
        return JSONResponse(await self._call(patch))

    async def delete_project(self, request: Request) -> Response:
        self.check_auth(request)
        self.check_site(request)
        project_id = request.path_params["project_id"]

        def delete():
            self._owned(project_id)
            active = self.projects.active_job(project_id)
            if active is not None:
                self.runner.cancel(active[0])
            self.projects.delete(project_id, OWNER.key)
        await self._call(delete)
        return Response(status_code=204)

    async def get_chapter(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        return JSONResponse(await self._call(self.projects.chapter_view, request.path_params["project_id"],
                                             _int(request.path_params["chapter"], "chapter"), OWNER.key))

    async def chapter_audio(self, request: Request) -> StreamingResponse:
        """The chapter as a 16-bit WAV, streamed a segment at a time (the page's player)."""
        self.check_auth(request)
        project_id, index = request.path_params["project_id"], _int(request.path_params["chapter"], "chapter")

        def chapter_wav():
            audio = self.projects.chapter_audio(project_id, index, OWNER.key)
            return audio.samples, wav([audio])
        samples, body = await self._call(chapter_wav)
        return StreamingResponse(body, media_type="audio/wav", headers={"Content-Length": str(44 + 2 * samples)})

    async def export(self, request: Request) -> StreamingResponse:
        """`?format=m4b|zip|mp3|wav|flac|acx` (m4b by default), `&chapter=N` for one chapter (wav, flac, mp3, acx),
        `&loudness=<target>` (and `&true_peak=`) to level each chapter (none: the project's `loudness`, or as
        rendered): the file, streamed as it is made
        (studio/projects/export.py); the skipped chapters are not in the book."""
        self.check_auth(request)
        project_id = request.path_params["project_id"]
        fmt = request.query_params.get("format", "m4b")
        chapter = request.query_params.get("chapter")
        index = None if chapter is None else _int(chapter, "chapter")
        loudness = request.query_params.get("loudness")
        true_peak = _float(request.query_params.get("true_peak", "-1"), "true_peak")

        def build():
            level = loudness
            if level is None and fmt != "acx":  # none asked: the project's own (acx sets its levels itself)
                level = self.projects.project(project_id, OWNER.key).settings.get("loudness")
            if index is not None:
                meta = self.projects.book_meta(project_id, OWNER.key)
                audio = self.projects.chapter_audio(project_id, index, OWNER.key)
                return chapter_export(levelled([audio], fmt, level, true_peak)[0], meta, fmt, index,
                                      len(self.projects.store.chapters(project_id)))
            chapters, meta = self.projects.book(project_id, OWNER.key)
            return export(chapters, meta, fmt, loudness=level, true_peak=true_peak)
        made = await self._call(build)
        return StreamingResponse(made.body, media_type=made.media_type, headers=made.headers())

    async def captions(self, request: Request) -> Response:
        """`?format=srt|vtt|json` (srt by default), `&chapter=N` for one chapter (the book without it, its times
        from the book's first sample), `&level=sentence|segment|word`: cues whose segment starts are exact."""
        self.check_auth(request)
        project_id = request.path_params["project_id"]
        fmt = request.query_params.get("format", "srt").lower()
        level = request.query_params.get("level", "sentence").lower()
        chapter = request.query_params.get("chapter")
        index = None if chapter is None else _int(chapter, "chapter")
        if fmt not in (*CAPTION_TYPES, "json"):
            raise ApiError(400, f"Unknown caption format {fmt!r}; choose srt, vtt or json.", param="format")

        def build():
            found = self.projects.captions(project_id, index, OWNER.key, level=level, transcriber=self.transcriber)
            title = self.projects.project(project_id).title
            return found, title
        found, title = await self._call(build)
        headers = {"X-Captions-Estimated": "true" if found.estimated else "false"}
        if fmt == "json":
            return JSONResponse({"cues": found.as_list(), "estimated": found.estimated, "note": found.note},
                                headers=headers)
        name = f"{title}{'' if index is None else f' - {index + 1:02d}'}.{fmt}"
        headers.update(Export(name, CAPTION_TYPES[fmt], iter(())).headers())
        return Response(found.srt() if fmt == "srt" else found.vtt(), media_type=CAPTION_TYPES[fmt], headers=headers)

    # ---------------------------------------------------------------- jobs
    async def render(self, request: Request) -> JSONResponse:
        """`{chapters?: [n, ...]}`: 202 and the job (a project's unfinished job takes the chapters asked)."""
        self.check_auth(request)
        self.check_site(request)
        project_id = request.path_params["project_id"]
        body = await self._json(request)
        chapters = body.get("chapters")

        def start():
            self._owned(project_id)
            return self.runner.view(self.runner.render(project_id, chapters).id)
        return JSONResponse(await self._call(start), status_code=202)

    async def regenerate(self, request: Request) -> JSONResponse:
        """`{seed?, text?}`: the segment made again (the next seed when none is given), as a job; 202."""
        self.check_auth(request)
        self.check_site(request)
        project_id = request.path_params["project_id"]
        chapter = _int(request.path_params["chapter"], "chapter")
        segment = _int(request.path_params["segment"], "segment")
        body = await self._json(request, self.projects.limits.max_chars * 4 + FORM_OVERHEAD)
        unknown = sorted(set(body) - {"seed", "text"})
        if unknown:
            raise ApiError(400, f"Unknown field(s) {', '.join(unknown)}; send `seed` and/or `text`.")
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ApiError(400, "`seed` must be a whole number.", param="seed")

        def regenerate():
            self._owned(project_id)
            self.projects.set_segment(project_id, chapter, segment, seed=seed, text=body.get("text"))
            return self.runner.view(self.runner.render(project_id, [chapter]).id)
        return JSONResponse(await self._call(regenerate), status_code=202)

    async def get_job(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        return JSONResponse(await self._call(self._job_view, request.path_params["job_id"]))

    def _job_view(self, job_id: str) -> dict:
        view = self.runner.view(job_id)
        self._owned(view["project"])
        return view

    async def job_action(self, request: Request) -> JSONResponse:
        """`POST /v1/jobs/{id}/pause|resume|cancel`: the job as it is after."""
        self.check_auth(request)
        self.check_site(request)
        job_id, action = request.path_params["job_id"], request.path_params["action"]
        if action not in ("pause", "resume", "cancel"):
            raise ApiError(404, f"No action {action!r}; a job can pause, resume or cancel.")

        def act():
            self._job_view(job_id)
            getattr(self.runner, action)(job_id)
            return self.runner.view(job_id)
        try:
            return JSONResponse(await self._call(act))
        except ApiError as exc:
            if exc.status == 400:
                exc.status = 409  # the job is not in a state that allows it
            raise

    def routes(self) -> list[tuple[str, object, list[str]]]:
        return [
            ("/v1/projects", self.create, ["POST"]),
            ("/v1/projects", self.list_projects, ["GET"]),
            ("/v1/projects/{project_id}", self.get_project, ["GET"]),
            ("/v1/projects/{project_id}", self.patch_project, ["PATCH"]),
            ("/v1/projects/{project_id}", self.delete_project, ["DELETE"]),
            ("/v1/projects/{project_id}/render", self.render, ["POST"]),
            ("/v1/projects/{project_id}/export", self.export, ["GET"]),
            ("/v1/projects/{project_id}/captions", self.captions, ["GET"]),
            ("/v1/projects/{project_id}/chapters/{chapter}", self.get_chapter, ["GET"]),
            ("/v1/projects/{project_id}/chapters/{chapter}/audio", self.chapter_audio, ["GET"]),
            ("/v1/projects/{project_id}/chapters/{chapter}/segments/{segment}/regenerate", self.regenerate, ["POST"]),
            ("/v1/jobs/{job_id}", self.get_job, ["GET"]),
            ("/v1/jobs/{job_id}/{action}", self.job_action, ["POST"]),
        ]


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ApiError(404, f"`{name}` must be a number (got {value!r}).", param=name) from None


def _float(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ApiError(400, f"`{name}` must be a number (got {value!r}).", param=name) from None


__all__ = ["ProjectRoutes"]
