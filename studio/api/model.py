"""The HTTP API's wire model: the limits, the error body, the speech request's fields and the checks that
turn what a client sent into what the studio runs (studio/api/__init__.py has the routes' map).

* **No instruction slot** (SPEC D1): `instructions` may be a style preset name or a prefix of known inline
  tags; plain-language instructions are refused with a 400, because the model would read them aloud.
* **Auth before bodies**: with an API key set, every `/v1/*` route checks `Authorization: Bearer` from the
  headers alone and answers 401 before a byte of the body is read (so routes parse bodies themselves
  instead of through FastAPI's body parameters, which are read before any dependency runs): `Routes` holds
  that plumbing for the speech and the voice routes.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from typing import Literal

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.types import DEFAULT_REPEAT_GUARD
from studio.api.access import Access
from studio.takes.failure import Failure
from studio.takes.order import DEFAULT_VOICE  # noqa: F401  (the API's "default" voice is the studio's)
from studio.text.presets import check_style_prefix

log = logging.getLogger("higgs.api")

MODEL_IDS = ("higgs-audio-v3-tts", "higgs-tts-3")
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # reference clips: Boson's and SGLang-Omni's limit
# A JSON speech body may carry a base64 clip (4/3 of 10 MB) beside the text; anything larger is refused
# before it is parsed.
MAX_JSON_BYTES = 16 * 1024 * 1024
FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the small text fields around the clip
MB = 2 ** 20  # sizes are stated in MB of 2**20 bytes, as the docs state the limits
REQUEST_TIMEOUT_S = 600.0

# `speed` has no direct control in Higgs: it becomes one of the four prosody speed tags (engine/ssml.py
# rate_tag, the mapping SSML's <prosody rate> shares).
_TAGS_ONLY_RE = re.compile(r"^(\s*<\|[^<>|]{0,64}\|>)+\s*$")


class ApiError(Exception):
    """An error the client can act on, answered as OpenAI's `{"error": {...}}` body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 503: "server_busy",
                 504: "timeout"}
        kind = kinds.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


INTERNAL_ERROR = ("The server failed while answering this request; the details are in its log. Try again, and "
                  "report it if it keeps happening.")


def api_error(exc: BaseException, what: str) -> ApiError:
    """The one mapping from a failure to what the client is told (`what` names the request in the log). The
    errors written for people keep their sentence: ours (ApiError), the line's (busy, closed), a remote
    server's answer, a field's wrong type, and ValueError, the house's error for a bad input (STYLE.md). Any
    other failure is a bug or a fault: the client gets INTERNAL_ERROR, and only the log gets the exception."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        return ApiError(422, validation_message(exc))
    failure = Failure.of(exc, what)  # the studio's one mapping (studio/takes/failure.py), in the API's form
    param = PARAMS.get(getattr(exc, "field", None) or "") or ("voice" if failure.code == "voice_not_found" else None)
    return ApiError(failure.status, failure.message, param=param, code=failure.code if failure.kind == "user" else None,
                    headers={"Retry-After": "5"} if failure.retry else None)


# An order's fields (studio/takes/order.py) as the speech request names them.
PARAMS = {"text": "input", "voice": "voice", "style": "instructions", "speed": "speed", "clip": "ref_audio",
          "voices": "voices"}


class SpeechRequest(BaseModel):
    """The body of `POST /v1/audio/speech`: OpenAI's fields plus the Higgs extensions."""

    model_config = ConfigDict(extra="ignore")

    model: str = MODEL_IDS[0]
    input: str
    voice: str | dict | None = None
    instructions: str | None = Field(default=None, max_length=4096)
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool | None = None  # SGLang-Omni / vLLM-Omni / Boson spelling; False asks for one buffered body
    # Higgs extensions (SGLang-Omni names).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_frames: int | None = None
    max_new_tokens: int | None = None  # SGLang-Omni / vLLM-Omni name for max_frames
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD  # stop a take whose last N frames repeat; null disables it
    voices: dict[str, str | None] | None = None  # long form: a script's speakers → saved voices (docs/API.md)
    ref_audio: str | None = None
    ref_text: str | None = None
    clean: bool = False  # speak chat text: markdown, code, URLs and emoji removed first (studio/text/clean.py)
    clean_actions: Literal["speak", "skip"] = "speak"  # with `clean`: `*actions*` spoken as words, or skipped
    # A long input's segments checked by the studio's ASR and made again when heard wrong (studio/audio/listen.py).
    # Opt-in: a listening take makes its first segment whole before it streams, so its first audio comes later.
    listen: bool = False
    ssml: bool | None = None  # `input` is SSML: None decides by a leading <speak> (engine/ssml.py)
    timestamps: Literal["sentence", "word"] | None = None  # captions with the audio (studio/audio/captions.py)
    # Loudness (studio/audio/loudness.py): a target (podcast, audiobook, broadcast, off, or LUFS) under a true-peak
    # ceiling in dBTP. Normalising needs the whole take, so such a request is answered once it is complete.
    loudness: str | float | None = None
    true_peak: float = -1.0
    # Pronunciation rules to read `input` with instead of the studio's dictionary (GET /v1/dictionary's
    # shape, or a bare list): a take's recipe gives the rules that fired on it, `[]` for none.
    dictionary: list | dict | None = None

    @field_validator("response_format", "stream_format", "timestamps", mode="before")
    @classmethod
    def _lower(cls, v):
        return v.lower() if isinstance(v, str) else v


# What pydantic's type errors ask for, in JSON's words.
_KINDS = {"string_type": "a string", "dict_type": "an object", "list_type": "a list", "float_type": "a number",
          "float_parsing": "a number", "int_type": "a whole number", "int_parsing": "a whole number",
          "int_from_float": "a whole number", "bool_type": "true or false", "bool_parsing": "true or false"}
# pydantic names each branch of a union in an error's path (`voice.str`, `voice.dict[any,any]`).
_BRANCH_RE = re.compile(r"^(str|int|float|bool|bytes|none|[a-z-]+\[.*\])$")


def validation_message(exc: ValidationError) -> str:
    """pydantic's errors as one sentence per field: a field that takes several types is named once with what
    it takes (`voice` must be a string or an object), never with pydantic's names for the union's branches."""
    fields: dict[str, list[dict]] = {}
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        path = loc[:1] + [p for p in loc[1:] if not _BRANCH_RE.match(p)]
        fields.setdefault(".".join(path) or "body", []).append(err)
    parts = []
    for where, errors in fields.items():
        kinds = [_KINDS.get(e.get("type", "")) for e in errors]
        if all(kinds):
            parts.append(f"`{where}` must be {' or '.join(dict.fromkeys(kinds))}")
        else:
            parts.append(f"`{where}`: " + "; ".join(dict.fromkeys(str(e.get("msg", "invalid")) for e in errors)))
    return "Invalid request: " + "; ".join(parts) + "."


def check_instructions(instructions: str) -> str:
    """Accept `instructions` made only of known sentence-level tags (a style prefix); refuse anything the
    model would read aloud."""
    text = instructions.strip()
    if not _TAGS_ONLY_RE.match(text):
        raise ApiError(400, "Higgs Audio v3 has no instruction slot: plain-language `instructions` would be read "
                            "aloud as part of the speech. Send a style preset name (GET /v1/audio/styles lists "
                            "them) or inline tags such as <|emotion:contemplation|><|prosody:speed_slow|>.",
                       param="instructions", code="unsupported_instructions")
    try:
        return check_style_prefix(text)
    except ValueError as exc:
        raise ApiError(400, f"`instructions`: {exc}", param="instructions", code="invalid_style") from None


def decode_ref_audio(value: str) -> bytes:
    """`ref_audio` as base64 or a `data:audio/...;base64,` URL → the encoded clip's bytes."""
    value = value.strip()
    if value.startswith(("http://", "https://", "file:")):
        raise ApiError(400, "`ref_audio` must be base64 or a data URL; this server does not fetch URLs or files.",
                       param="ref_audio")
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if ";base64" not in head:
            raise ApiError(400, "`ref_audio` data URL must be base64-encoded (data:audio/wav;base64,...).",
                           param="ref_audio")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "`ref_audio` is not valid base64.", param="ref_audio") from None
    if len(data) > MAX_UPLOAD_BYTES:
        raise ApiError(413, f"`ref_audio` is {len(data) / MB:.1f} MB; the limit is {MAX_UPLOAD_BYTES // MB} MB.",
                       param="ref_audio")
    return data


MAX_HEADER_CHARS = 1000
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]+")


def header_value(value: object) -> str:
    """Any value as a safe HTTP header value: ASCII, no control characters (a `\\r` or NUL from a tag would
    make the server drop the response), at most MAX_HEADER_CHARS characters."""
    text = str(value).encode("ascii", "replace").decode()
    return _CONTROL_RE.sub(" ", text).strip()[:MAX_HEADER_CHARS]


class Routes:
    """What every route shares: the service, the access rule, and the API's own thread limiter (requests waiting
    for their turn on the GPU sit in threads; they must not starve Gradio's own thread pool)."""

    def __init__(self, service, access: Access, limiter: anyio.CapacityLimiter):
        self.service = service
        self.access = access
        self.limiter = limiter

    def check_auth(self, request: Request) -> None:
        if not self.access.bearer_ok(request.headers.get("authorization")):
            raise ApiError(401, "Missing or wrong API key: send `Authorization: Bearer <key>`.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_site(self, request: Request) -> None:
        """The cross-site rule for requests that write or generate (docs/SECURITY.md)."""
        refusal = self.access.cross_site_refusal(request.headers.get("origin"), request.headers.get("host"))
        if refusal is not None:
            raise ApiError(403, refusal, code="cross_site_request")

    async def read_body(self, request: Request, limit: int) -> bytes:
        """The body, refused with 413 as soon as it passes `limit` (never buffered beyond it)."""
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"Request body is {int(declared) / MB:.1f} MB; the limit is {limit // MB} MB.")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"Request body is over the {limit // MB} MB limit.")
            chunks.append(chunk)
        body = b"".join(chunks)
        request._body = body  # so request.form() parses what was already read
        return body

    async def in_thread(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    def instructions_style(self, instructions: str | None) -> str | None:
        """`instructions` → a style for the service: a preset name as is, or a validated tag prefix."""
        text = (instructions or "").strip()
        if not text:
            return None
        presets = self.service.presets
        if presets is not None and presets.get(text) is not None:
            return text
        return check_instructions(text)
