"""OpenAI-compatible HTTP routes on the studio's own FastAPI app: same process, same engine, same line.

    studio.api.register(app, service, api_key=None)

adds `POST /v1/audio/speech`, its text-streaming WebSocket `/v1/audio/speech/stream` (studio/api/stream.py), the
voice routes `GET|POST /v1/audio/voices`, `GET|PATCH|DELETE
/v1/audio/voices/{id}`, `GET /v1/audio/styles`, the pronunciation dictionary's `GET|PUT /v1/dictionary`,
`GET /v1/models` and `GET /health` (docs/API.md has the
fields and examples). Routes only: they validate, translate the request into an `Order` (studio/takes/order.py), and format
what `StudioService` yields. Generation, queueing and voice storage happen in the service and the library.

| module | what it holds |
|---|---|
| `model.py` | the limits, the error body and `api_error` (failures → it), `SpeechRequest`, the routes' plumbing |
| `speech.py` | `POST /v1/audio/speech`: the request resolved, the take streamed (audio, SSE, buffered) |
| `run.py` | one take driven for one request: the timeout, and the take stopped when its client goes |
| `stream.py` | `WS /v1/audio/speech/stream`: text in as it is written, the open long take's audio out |
| `voices.py` | the voice library's and the style presets' routes |
| `projects.py` | `/v1/projects…` and `/v1/jobs…`: books, render jobs, chapter audio (docs/PROJECTS.md) |
| `dictionary.py` | the pronunciation dictionary's routes (`GET|PUT /v1/dictionary`, `POST /v1/dictionary/apply`) |
"""

from __future__ import annotations

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Mount

from studio.api.access import Access
from studio.api.dictionary import DictionaryRoutes
from studio.api.model import MAX_UPLOAD_BYTES, MODEL_IDS, REQUEST_TIMEOUT_S, Routes, api_error
from studio.api.projects import ProjectRoutes
from studio.api.speech import SpeechRoutes
from studio.api.stream import ROUTE as STREAM_ROUTE
from studio.api.stream import SpeechStream
from studio.api.voices import VoiceRoutes
from studio.audio.formats import available_formats
from studio.audio.listen import Listener
from studio.takes.limits import MAX_INPUT_CHARS


class _InfoRoutes(Routes):
    """`GET /v1/models` and the open `GET /health`."""

    async def models(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "bosonai"}
                                                        for m in MODEL_IDS]})

    async def health(self, request: Request) -> JSONResponse:
        status = dict(self.service.status())
        return JSONResponse({"status": "ok", "engine_loaded": self.service.engine is not None, "model": MODEL_IDS[0],
                             "device": status.get("device"), "precision": status.get("precision"),
                             "precision_reason": status.get("precision_reason"),
                             "backend": status.get("backend"), "backend_reason": status.get("backend_reason"),
                             "queue_depth": status.get("queue_depth"),
                             "batch_size": status.get("batch_size"), "max_batch": status.get("max_batch"),
                             "memory_plan": status.get("memory_plan"),
                             "demo": status.get("demo"), "formats": list(available_formats()),
                             "auth": self.access.api_key is not None,
                             **{k: status[k] for k in ("remote_kind", "sampling_note") if status.get(k)}})


def register(app: FastAPI, service, *, api_key: str | None = None, access: Access | None = None,
             request_timeout: float = REQUEST_TIMEOUT_S, max_input_chars: int = MAX_INPUT_CHARS,
             transcriber=None, projects=None, runner=None, page_tokens=None, listener=None) -> None:
    """Add the HTTP API to `app` (the FastAPI app that serves the Gradio studio). With `api_key` (or an
    `access` that holds it), every `/v1/*` route needs `Authorization: Bearer <api_key>`; `/health` stays
    open for load balancers. Without a key, writes from other sites are refused (`Access.cross_site_refusal`).
    With `projects` (studio/projects/library.py) and its `runner` (jobs.py), the projects' routes too.
    `page_tokens(token) -> bool` (studio/views/live.py `LivePlayer.check_token`) lets the page's own script open the
    speech WebSocket, which browsers cannot give an Authorization header."""
    access = access or Access(api_key)
    listener = listener if listener is not None else Listener(None)  # off, and says why, to a take that asks
    limiter = anyio.CapacityLimiter(max(8, service.max_queue + 4))  # a thread for every request the line holds
    speech = SpeechRoutes(service, access, limiter, request_timeout=request_timeout, max_input_chars=max_input_chars,
                          transcriber=transcriber, listener=listener)
    voices = VoiceRoutes(service, access, limiter, transcriber=transcriber)
    info = _InfoRoutes(service, access, limiter)
    dictionary = DictionaryRoutes(service, access, limiter)

    def guarded(handler):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except Exception as exc:  # one bad request never takes the server down, nor shows its internals
                return api_error(exc, f"{request.method} {request.url.path}").response()
        endpoint.__name__ = handler.__name__
        endpoint.__doc__ = handler.__doc__
        return endpoint

    routes = [
        ("/v1/audio/speech", speech.speech, ["POST"]),
        ("/v1/audio/voices", voices.list_voices, ["GET"]),
        ("/v1/audio/voices", voices.create_voice, ["POST"]),
        ("/v1/audio/voices/{voice_id}", voices.get_voice, ["GET"]),
        ("/v1/audio/voices/{voice_id}", voices.update_voice, ["PATCH"]),
        ("/v1/audio/voices/{voice_id}", voices.delete_voice, ["DELETE"]),
        ("/v1/audio/styles", voices.styles, ["GET"]),
        ("/v1/dictionary", dictionary.get_dictionary, ["GET"]),
        ("/v1/dictionary", dictionary.put_dictionary, ["PUT"]),
        ("/v1/dictionary/apply", dictionary.apply, ["POST"]),
        ("/v1/models", info.models, ["GET"]),
        ("/health", info.health, ["GET"]),
    ]
    if projects is not None:
        routes += ProjectRoutes(service, access, limiter, projects=projects, runner=runner,  # the owner's
                                transcriber=service.transcriber_for(transcriber)).routes()
    for path, handler, methods in routes:
        app.add_api_route(path, guarded(handler), methods=methods, include_in_schema=True)
    app.add_api_websocket_route(STREAM_ROUTE, SpeechStream(service, access, page_tokens=page_tokens,
                                                           max_chars=max_input_chars, transcriber=transcriber,
                                                           listener=listener))
    # Gradio's app may already hold routes; ours are specific paths, so order only matters against a
    # catch-all mount at "/" (mount_gradio_app): move ours in front of anything mounted.
    _routes_first(app, len(routes) + 1)


def _routes_first(app: FastAPI, n: int) -> None:
    routes = app.router.routes
    ours, rest = routes[-n:], routes[:-n]
    mounts = [r for r in rest if isinstance(r, Mount)]
    if mounts:
        app.router.routes[:] = [r for r in rest if not isinstance(r, Mount)] + ours + mounts


# The limit a client's upload must respect, for the app's own upload cap (app.py).
__all__ = ["MAX_UPLOAD_BYTES", "register"]
