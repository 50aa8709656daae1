"""The page's live player transport: a same-origin route that streams a take's 16-bit PCM to the browser as the
engine makes it, so the page plays it through WebAudio (render.LIVE_JS) instead of Gradio's ffmpeg → HLS path,
which buffered about a second before the first sound (docs/PERFORMANCE.md, "Heard latency").

    POST /studio/live     header X-Studio-Token (issued in the page at load) or Authorization: Bearer <api key>
                          multipart form: `request` (JSON: text, style, voice, clip_text, temperature, top_p,
                          top_k, seed, max_frames, repeat_guard, clean, clean_actions, live_id) and, for a
                          one-off clone, `clip`
    → application/x-ndjson, one JSON object a line:
        {"type": "queued", "position": 2}                     while the take waits for the GPU
        {"type": "audio", "pcm": "<base64 int16 LE>", "metrics": {...}}     the first one also has "timeline"
        {"type": "done", "take_id": 7, "seconds": 4.1, "stop_reason": "eoc", "metrics": {...}, "warnings": [...],
         "timeline": {...}}
        {"type": "error", "message": "a sentence"}
      and empty lines as a heartbeat while nothing else is due (a client that left is noticed by the next write).

The page's Gradio `generate` event runs beside the stream with the same `live_id`: it claims the take's handle
this route registered and, once the take ends, fills the history, take player, downloads and recipe as for a
take played by Gradio's own player; Stop cancels it through the same registry.

The timeline: server-side stamps of the take's way to its first audio, in ms since the request arrived
(`Timeline`), so the page and bench/heard.py can tell the engine's share of Heard from the route's and the
browser's (docs/PERFORMANCE.md, "Where Heard goes"). The first audio line carries those known by then, the
done line all of them.

Why not WebRTC (the `fastrtc` library): a Space would need TURN credentials and another dependency, while a
streamed `fetch` is plain HTTP that passes the Spaces proxy; PCM at 24 kHz is 48 kB/s (64 kB/s as base64).

Auth: the page token is an HMAC of its expiry time under a per-process secret, issued each time the page
loads. It proves a request comes from a page this server served, so with `--api-key` the route is not an
open door to the engine for scripts: they get 401 unless they send the key, as on `/v1/*`. On a public page
a token is any visitor's, so its takes are a visitor's: the public limits, and one fair share per client
address however many tokens it holds (studio/api/access.py `visitor`, studio/takes/admission.py).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine.audio import load_audio
from engine.types import SamplingParams
from studio.api.access import Access, visitor
from studio.api.model import FORM_OVERHEAD, MAX_UPLOAD_BYTES, MB
from studio.audio.formats import to_pcm16
from studio.takes.failure import Failure
from studio.takes.gpu_queue import Queued, ServiceBusy, ServiceClosed
from studio.takes.order import Order
from studio.takes.service import StudioService
from studio.takes.take import TakeHandle

ROUTE = "/studio/live"
TOKEN_HEADER = "X-Studio-Token"
TOKEN_TTL_S = 12 * 3600  # a page left open over a working day keeps working; then a reload issues a new one
NO_VOICE, CLIP_VOICE = "", "__clip__"  # the page's Voice dropdown values besides saved voice ids
HEARTBEAT_S = 1.0
CLAIM_TIMEOUT_S = 60.0  # how long the page's Gradio event waits for its stream to arrive (a slow upload)
# Before a live id, what the page's event gets when this route refused the stream (a stale session token after a
# restart, a clip over the limit, an empty text): the event fails at once, with the route's sentence where it
# recorded one, rather than waiting for a stream that will never come. LIVE_ID has no ':'.
REFUSED_PREFIX = "refused:"
FORGET_AFTER_S = 300.0  # entries nobody claimed (the Gradio event never came) are dropped after this
LIVE_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")


def page_order(*, text, style, voice, clip, clip_text, temperature, top_p, top_k, seed, max_frames,
               repeat_guard, clean=False, clean_actions="speak") -> Order:
    """The page's form values → an order (the same for the Gradio event and the live route). `clip` is
    (samples, sample_rate) or None; seed < 0 means random, 0 frames means automatic, 0 guard means off;
    `clean` speaks chat text (studio/text/clean.py), and the take records the text as cleaned."""
    if voice == CLIP_VOICE and clip is None:
        raise ValueError("Voice is set to the reference clip, but no clip is loaded. Upload or record one.")
    params = SamplingParams.of(
        temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
        seed=None if seed is None or int(seed) < 0 else int(seed), max_frames=int(max_frames or 0) or None,
        repeat_guard=int(repeat_guard or 0) or None)
    return Order(text=text or "", voice=voice if voice not in (NO_VOICE, CLIP_VOICE) else None, style=style or None,
                 params=params, clip=clip if voice == CLIP_VOICE else None, clip_text=clip_text or None,
                 clean=bool(clean), clean_actions=clean_actions or "speak", door="ui")


class Timeline:
    """Monotonic stamps of one live take on the server, each the first time it happens, in ms since the route
    got the request: `parsed` (form read and checked), `ready` (voice and style resolved: `service.start`),
    `asked` (a thread started the take's stream: the line's hand-off and the engine follow), `chunk` (the first
    audio came out of the line), `line` (its NDJSON line is encoded), `written` (the server took the line:
    the send returned). With the engine's own TTFA (from its start) they split the server's share."""

    def __init__(self):
        self.start = time.perf_counter()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        if name not in self.marks:
            self.marks[name] = round(1e3 * (time.perf_counter() - self.start), 2)


def _next(stream: Iterator, end: object, timeline: Timeline):
    """The stream's next item, run on a worker thread; the timeline notes when the take was first asked for
    and when its first audio came out (on that thread, before the hop back to the event loop)."""
    timeline.mark("asked")
    item = next(stream, end)
    if getattr(item, "audio", None) is not None and len(item.audio):
        timeline.mark("chunk")
    return item


class BodyTooLarge(ValueError):
    """The request body is over the route's limit (answered 413)."""


@dataclasses.dataclass
class _Entry:
    handle: TakeHandle | None = None
    error: str | None = None
    closed: threading.Event = dataclasses.field(default_factory=threading.Event)
    created: float = dataclasses.field(default_factory=time.monotonic)


class LivePlayer:
    """Page tokens, the streaming route, and the registry that pairs each live stream with the page's
    Gradio event (by `live_id`)."""

    def __init__(self, service: StudioService, *, secret: bytes | None = None):
        self.service = service
        self._secret = secret or secrets.token_bytes(32)
        self._entries: dict[str, _Entry] = {}
        self._cond = threading.Condition()

    # ------------------------------------------------------------------ tokens

    def issue_token(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + TOKEN_TTL_S)
        return f"{expires}.{self._sign(str(expires))}"

    def check_token(self, token: str | None, now: float | None = None) -> bool:
        expires, _, mac = (token or "").partition(".")
        if not expires.isdigit() or not hmac.compare_digest(mac.encode(), self._sign(expires).encode()):
            return False
        return int(expires) > (time.time() if now is None else now)

    def _sign(self, message: str) -> str:
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------ pairing with the Gradio event

    def _register(self, live_id: str) -> _Entry:
        with self._cond:
            cutoff = time.monotonic() - FORGET_AFTER_S
            for key in [k for k, e in self._entries.items() if e.closed.is_set() and e.created < cutoff]:
                del self._entries[key]
            if live_id in self._entries:
                raise ValueError("This live id is already in use; reload the page.")
            entry = self._entries[live_id] = _Entry()
            return entry

    def _update(self, entry: _Entry, **values) -> None:
        with self._cond:
            for key, value in values.items():
                setattr(entry, key, value)
            self._cond.notify_all()

    def claim(self, live_id: str, timeout: float = CLAIM_TIMEOUT_S) -> TakeHandle | None:
        """The take the page's stream `live_id` is playing, once the route has it; None when the take failed
        before it started (the stream told the page why). Raises ValueError with the route's sentence when the
        stream was refused, or when it never arrived."""
        refused = live_id.startswith(REFUSED_PREFIX)
        live_id = live_id.removeprefix(REFUSED_PREFIX)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                entry = self._entries.get(live_id)
                if refused and (entry is None or entry.error is None):
                    raise ValueError("The live player's stream was refused; the player says why.")
                if entry is not None and entry.error is not None:
                    del self._entries[live_id]
                    raise ValueError(entry.error)
                if entry is not None and entry.handle is not None:
                    return entry.handle
                if entry is not None and entry.closed.is_set():
                    del self._entries[live_id]
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ValueError("The live player's stream did not reach the server; reload the page, or "
                                     "add ?player=gradio to its address to use the basic player.")
                self._cond.wait(left)

    def handle(self, live_id: str) -> TakeHandle | None:
        """The take of stream `live_id` while the registry holds it (until the page's event has shown it),
        without claiming it."""
        with self._cond:
            entry = self._entries.get(live_id)
            return entry.handle if entry is not None else None

    def wait(self, live_id: str) -> str | None:
        """Block until stream `live_id` has ended and its take (if any) is recorded, then forget it; the
        sentence the stream failed with, if it failed."""
        with self._cond:
            entry = self._entries.get(live_id)
        if entry is None:
            return None
        entry.closed.wait()
        handle = entry.handle
        if handle is not None and handle.cancel.is_set():
            handle.finished.wait(10.0)  # the worker records a stopped take within a frame
        with self._cond:
            self._entries.pop(live_id, None)
        return entry.error

    # ------------------------------------------------------------------ the route

    def mount(self, app: FastAPI, *, access: Access | None = None) -> None:
        """Add the route to Gradio's running FastAPI app (beside the HTTP API). `access` (studio/api/access.py)
        decides who is the owner: everyone else's takes are held to the public page's limits."""
        access = access or Access()

        async def live(request: Request):
            timeline = Timeline()
            owner = access.api_key is not None and access.bearer_ok(request.headers.get("authorization"))
            token = request.headers.get(TOKEN_HEADER)
            page = self.check_token(token)
            if not (owner or page):
                return JSONResponse({"error": "This stream is for the studio page: reload the page to get a new "
                                              "session token, or call /v1/audio/speech with your API key."},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            try:
                fields, clip = await self._read_form(request)
                live_id = str(fields.get("live_id") or "")
                if not LIVE_ID.match(live_id):
                    raise ValueError("Send a live_id of 8-64 letters, digits, '-' or '_'.")
            except BodyTooLarge as exc:
                return JSONResponse({"error": str(exc)}, status_code=413)
            except ValueError as exc:
                return JSONResponse({"error": str(exc)}, status_code=400)
            try:
                entry = self._register(live_id)
            except ValueError as exc:
                return JSONResponse({"error": str(exc)}, status_code=409)
            try:
                order = page_order(clip=clip, **{k: fields.get(k) for k in (
                    "text", "style", "voice", "clip_text", "temperature", "top_p", "top_k", "seed", "max_frames",
                    "repeat_guard", "clean", "clean_actions")})
                order.check()
                # A page token proves the page was loaded, not who loaded it: on a public page that is any
                # visitor, so only the key (or a page behind the owner's login) lifts the public limits.
                if access.api_key is not None and access.public_page and not owner:
                    order = dataclasses.replace(order, caller=visitor(
                        request.headers, request.client.host if request.client else None, fallback=token))
            except (ValueError, TypeError) as exc:
                message = str(exc) if isinstance(exc, ValueError) else "A setting is missing or not a number."
                self._update(entry, error=message)
                entry.closed.set()
                return JSONResponse({"error": message}, status_code=400)
            timeline.mark("parsed")
            try:
                # prepared now (its limits, voice and style; a long text is one long take, recorded whole)
                handle = await run_in_threadpool(lambda: self.service.start(order, record=True))
            except ValueError as exc:  # a bad order: the take fails in the stream and the page's event says why
                message = Failure.of(exc).message
                self._update(entry, error=message)
                entry.closed.set()
                return StreamingResponse(iter([_line({"type": "error", "message": message})]),
                                         media_type="application/x-ndjson", headers={"Cache-Control": "no-store"})
            timeline.mark("ready")
            self._update(entry, handle=handle)
            return StreamingResponse(self._lines(handle, entry, timeline), media_type="application/x-ndjson",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

        app.add_api_route(ROUTE, live, methods=["POST"], include_in_schema=False)

    @staticmethod
    async def _read_form(request: Request) -> tuple[dict[str, Any], tuple[np.ndarray, int] | None]:
        """The form, read with a cap (a clip and its settings, never more), and the clip through the bounded
        decoder (engine/audio.py)."""
        limit = MAX_UPLOAD_BYTES + FORM_OVERHEAD
        declared = request.headers.get("content-length", "")
        size, chunks = int(declared) if declared.isdigit() else 0, []
        if size <= limit:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    break
                chunks.append(chunk)
        if size > limit:
            raise BodyTooLarge(f"The request is over the {limit / MB:.0f} MB limit (a reference clip may be up "
                               f"to {MAX_UPLOAD_BYTES // MB} MB).")
        request._body = b"".join(chunks)  # so request.form() parses what was already read
        form = await request.form(max_files=1, max_fields=8)
        try:
            fields = json.loads(form.get("request") or "")
        except json.JSONDecodeError:
            raise ValueError("Send the settings as JSON in the form field `request`.") from None
        if not isinstance(fields, dict):
            raise ValueError("Send the settings as a JSON object in the form field `request`.")
        upload = form.get("clip")
        clip = None
        if upload is not None and not isinstance(upload, str):
            clip = load_audio(await upload.read())  # (samples, sample_rate); ReferenceAudioError is a ValueError
        return fields, clip

    async def _lines(self, handle: TakeHandle, entry: _Entry, timeline: Timeline) -> AsyncIterator[bytes]:
        """The take as NDJSON lines. However the stream ends (the take ends, Stop, the tab closes), the take is
        cancelled unless finished, and the entry is closed so the page's Gradio event can show the take."""
        stream = handle.stream(positions=True)
        end = object()
        pending: asyncio.Future | None = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(run_in_threadpool(_next, stream, end, timeline))
                done, _ = await asyncio.wait({pending}, timeout=HEARTBEAT_S)
                if not done:
                    yield b"\n"
                    continue
                try:
                    item = pending.result()
                except (ValueError, ServiceBusy, ServiceClosed) as exc:
                    self._update(entry, error=Failure.of(exc).message)  # for the page's event too
                    yield _line({"type": "error", "message": entry.error})
                    return
                pending = None
                if item is end:
                    break
                if isinstance(item, Queued):
                    yield _line({"type": "queued", "position": item.position})
                    continue
                if len(item.audio):
                    message = {"type": "audio", "pcm": base64.b64encode(to_pcm16(item.audio).tobytes()).decode(),
                               "metrics": dataclasses.asdict(item.metrics)}
                    if "line" not in timeline.marks:
                        timeline.mark("line")
                        message["timeline"] = dict(timeline.marks)
                    yield _line(message)
                    timeline.mark("written")
            take = handle.take
            if take is not None:
                yield _line({"type": "done", "take_id": take.id, "seconds": round(take.seconds, 3),
                             "stop_reason": take.stop_reason, "metrics": dataclasses.asdict(take.metrics),
                             "warnings": list(handle.warnings), "timeline": timeline.marks})
        except Exception as exc:  # an engine failure: tell the page in-band, the status line is long gone
            self._update(entry, error=Failure.of(exc, "live take").message)
            yield _line({"type": "error", "message": entry.error})
        finally:
            if not handle.finished.is_set():
                handle.cancel.set()
            entry.closed.set()


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"
