"""The studio's documented Gradio endpoints, which are also its MCP tools: `synthesize`, `list_voices`, `add_voice`,
and with projects (studio/projects/) `render_project` and `project_status`.

    studio.api.mcp.register(blocks, service, access=Access(key, public_page=...))   # before blocks.launch()

Each tool is a `gr.api` endpoint, so it runs through the same `StudioService` as the page and the HTTP API.
They are registered whatever `--mcp` says, so the page's "Use via API" link and `gradio_client` find them
(`Client(url).predict(..., api_name="/synthesize")`); `launch(mcp_server=True)` also serves them over MCP at
`/gradio_api/mcp/` (schema at `/gradio_api/mcp/schema`). The docstrings below are what an agent reads as the
tool descriptions, so they say what the model can and cannot do (no instruction slot: style is a preset or
inline tags, SPEC D1).
Rights: the header `Authorization: Bearer <key>` (or a studio without a key) is the owner. Without it, on a
public page, `synthesize` and `list_voices` answer as to any visitor of the page: the public limits, the
visitor's fair share of the GPU, the voices shared with visitors; `add_voice` and the project tools are the
owner's. On a keyed page that is not public every tool needs the key, like the `/v1/*` routes, and the key
(`Client(url, headers={"Authorization": "Bearer <key>"})`) passes the page's login, so it also fetches the WAV
URL `synthesize` returns (`Access.bearer_login`). These are the only tools: the page's own events are built
with `api_visibility` other than "public", which keeps them out of the MCP schema (docs/SECURITY.md).

No `from __future__ import annotations` here: `gr.api` reads the tools' type hints at run time, and string
annotations would hide `gr.Header` and the return type from it.
"""

import collections
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from gradio.data_classes import FileData

from engine.audio import load_audio
from engine.types import SamplingParams
from studio.api.access import Access
from studio.audio.formats import write_audio
from studio.takes.admission import OWNER, Caller
from studio.takes.failure import Failure
from studio.takes.order import Order
from studio.voices import Consent

KEEP_FILES = 64  # synthesized files kept on disk for clients to fetch; older ones are removed


class _Outputs:
    """A small ring of output files: each take gets a file Gradio can serve; the oldest are deleted."""

    def __init__(self, keep: int = KEEP_FILES):
        self.dir = Path(tempfile.mkdtemp(prefix="higgs-mcp-"))
        self._paths: collections.deque[Path] = collections.deque()
        self.keep = keep

    def new(self, name: str) -> Path:
        path = self.dir / name
        self._paths.append(path)
        while len(self._paths) > self.keep:
            self._paths.popleft().unlink(missing_ok=True)
        return path


def _file_path(audio: Any) -> str:
    """The local path of a Gradio file argument (a FileData, its dict form, or a plain path string)."""
    if isinstance(audio, dict):
        audio = audio.get("path")
    else:
        audio = getattr(audio, "path", audio)
    if not isinstance(audio, str) or not audio:
        raise gr.Error("`audio` must be an audio file (upload it first, or pass a URL or base64 data).")
    return audio


def register(blocks: gr.Blocks, service, *, api_key: str | None = None, access: Access | None = None,
             projects=None, runner=None) -> None:
    """Add the tools to `blocks`. Call it before `launch`. `access` (or just the key) says who is the owner
    and whether visitors may call them; with `projects` and its `runner` (studio/projects/), the project tools
    too."""
    outputs = _Outputs()
    roots = [Path(tempfile.gettempdir()).resolve()]

    access = access or Access(api_key)

    def caller(authorization: str | None, request: gr.Request | None, *, visitors: bool = True) -> Caller:
        if access.bearer_ok(authorization) or access.is_owner(request):  # the key, or the page's login with it
            return OWNER
        if not (visitors and access.public_page):
            raise gr.Error("Missing or wrong API key: send the header `Authorization: Bearer <key>`.")
        return access.page_caller(request)

    def synthesize(text: str, voice: str = "", style: str = "", seed: int | None = None,
                   authorization: gr.Header = None, request: gr.Request = None) -> FileData:
        """Speak `text` with Higgs Audio v3. Returns the URL of a 24 kHz WAV file whose name carries the seed
        used (speech-seed<N>-<take>.wav), so a take can be reproduced.

        The model has no instruction slot: delivery is controlled only by a style preset or by inline tags
        inside the text, e.g. "<|emotion:contemplation|>Well. <|prosody:pause|> Let me think." Emotion,
        style and speed/pitch tags lead their sentence; pause and sfx tags sit where the effect happens, and
        an sfx tag is followed by its sound written out with no space ("<|sfx:laughter|>Haha"). Plain-language
        directions in the text are read aloud. Takes are reproducible: the same text, voice, style and seed
        give the same audio.

        Args:
            text: What to say (a long text is voiced whole, as one long take); may contain inline control tags such as <|emotion:elation|>.
            voice: A saved voice's id or name from list_voices; empty for the default (zero-shot) voice.
            style: A style preset name from list_voices (e.g. "Calm narrator") or tags like "<|emotion:awe|>"; may be empty.
            seed: Seed for sampling; empty for a random one (the one used is reported so it can be reused).
        """
        who = caller(authorization, request)
        try:
            take = service.synthesize(Order(text=text, voice=(voice or "").strip() or None,
                                            style=(style or "").strip() or None, params=SamplingParams.of(seed=seed),
                                            caller=who, door="mcp"))
        except Exception as exc:  # the one sentence for it, as an MCP tool error
            raise gr.Error(Failure.of(exc, "MCP synthesize").message) from None
        # One output: Gradio's MCP bridge serves a returned file by URL only when it is the whole output.
        path = write_audio(outputs.new(f"speech-seed{take.seed}-{take.id}.wav"), take.audio, take.sample_rate)
        return FileData(path=path, mime_type="audio/wav", orig_name=Path(path).name)

    def list_voices(authorization: gr.Header = None, request: gr.Request = None) -> dict:
        """List the saved voices and the style presets that synthesize accepts.

        Returns {"voices": [{"id", "name", "transcript", "style", "seconds"}], "styles": [{"name", "prefix"}]}.
        Pass a voice's id or name as synthesize's `voice`, and a style's name as its `style`.
        """
        voices = [{"id": v.id, "name": v.name, "transcript": v.transcript or None, "style": v.style or None,
                   "seconds": round(v.seconds, 2)} for v in service.list_voices(caller(authorization, request))]
        styles = [{"name": name, "prefix": prefix} for name, prefix in service.list_styles()]
        return {"voices": voices, "styles": styles}

    def add_voice(audio: FileData, transcript: str, name: str, consent: bool,
                  authorization: gr.Header = None) -> dict:
        """Save a voice from a short reference clip so synthesize can speak with it (voice cloning).

        Use 3-15 s of one person speaking clearly (1-30 s accepted, up to 10 MB; wav, flac, mp3, ogg, m4a).
        Cloning someone's voice needs their permission: `consent` must be true, confirming the speaker agreed.
        Returns the saved voice's id and name; adding the same clip and transcript again returns the same voice.

        Args:
            audio: The reference clip: an uploaded file, a URL, or base64 audio data.
            transcript: The exact words spoken in the clip; it makes the cloned voice markedly better.
            name: A name for the voice (unique in the library).
            consent: True only if the speaker has agreed to have their voice cloned.
        """
        caller(authorization, None, visitors=False)  # the library is the owner's
        if consent is not True:
            raise gr.Error("Saving a voice needs the speaker's consent: call again with consent=true only if the "
                           "speaker agreed to have their voice cloned.")
        path = Path(_file_path(audio)).resolve()
        if not any(path.is_relative_to(root) for root in roots):  # only files Gradio received, never any path
            raise gr.Error("`audio` must be a file uploaded to this app, a URL, or base64 data.")
        try:
            samples, rate = load_audio(str(path))
            voice = service.save_voice(np.asarray(samples, dtype=np.float32), rate, name=name,
                                       transcript=transcript.strip() or None,
                                       consent=Consent(asserted_by="MCP client"))
        except (ValueError, TimeoutError, RuntimeError) as exc:
            raise gr.Error(str(exc)) from None
        return {"id": voice.id, "name": voice.name, "seconds": round(voice.seconds, 2),
                "transcript": voice.transcript or None}

    def render_project(project: str, chapters: str = "", authorization: gr.Header = None) -> dict:
        """Start rendering a project (a book made on the studio's Projects tab or with POST /v1/projects) into
        audio, in the background, and return its job: {"id", "state", "done", "total", "eta_s", ...}.

        Rendering takes a while (minutes to hours for a book); call project_status with the project's id to
        follow it. Segments already rendered with the same text, voice, settings and seed are never rendered
        again, so rendering a finished project again returns at once.

        Args:
            project: The project's id (project_status with no id lists the projects).
            chapters: Chapter indexes to render, comma-separated (e.g. "0,2"); empty for every chapter not skipped.
        """
        caller(authorization, None, visitors=False)
        try:
            wanted = [int(n) for n in chapters.replace(" ", "").split(",") if n] or None
            projects.project(project.strip(), OWNER.key)
            return runner.view(runner.render(project.strip(), wanted).id)
        except ValueError as exc:  # a bad index, an unknown project (ProjectNotFound is one)
            raise gr.Error(str(exc)) from None

    def project_status(project: str = "", authorization: gr.Header = None) -> dict:
        """A project's state: its chapters (each "not started", "rendering", "done" or "stale" after an edit,
        with segments rendered of total and seconds of audio) and its render job (state, done, total, eta_s,
        error). With no `project`, the list of projects: {"projects": [{"id", "title", ...}]}.

        Args:
            project: The project's id; empty to list the projects.
        """
        caller(authorization, None, visitors=False)
        try:
            if not project.strip():
                return {"projects": [projects.summary(p) for p in projects.store.projects(OWNER.key)]}
            view = projects.view(project.strip(), OWNER.key)
            jobs = projects.store.jobs(view["id"])  # oldest first: the latest is the one to report
            job = runner.view(jobs[-1].id) if jobs else None
            return {**{k: view[k] for k in ("id", "title", "author", "disk_bytes", "chapters")}, "job": job}
        except ValueError as exc:
            raise gr.Error(str(exc)) from None

    # queue=False: Gradio's MCP server then calls the tool in-process with the MCP request (its Authorization
    # header reaches `caller`) instead of calling itself back over HTTP through the queue. The service's
    # admission still gives each take its turn.
    with blocks:
        gr.api(synthesize, api_name="synthesize", queue=False)
        gr.api(list_voices, api_name="list_voices", queue=False)
        gr.api(add_voice, api_name="add_voice", queue=False)
        if projects is not None:
            gr.api(render_project, api_name="render_project", queue=False)
            gr.api(project_status, api_name="project_status", queue=False)

