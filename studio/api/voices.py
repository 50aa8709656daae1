"""The voice library over HTTP: `GET|POST /v1/audio/voices`, `GET|PATCH|DELETE /v1/audio/voices/{id}` and
`GET /v1/audio/styles` (docs/API.md has the fields). A saved voice needs the speaker's consent, stated in the
request and stored with the voice; the owner's preset voices are read-only here as on the page.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.formparsers import MultiPartException

from engine.audio import ReferenceAudioError, load_audio
from studio.api.model import DEFAULT_VOICE, FORM_OVERHEAD, MAX_UPLOAD_BYTES, MB, ApiError, Routes
from studio.takes.gpu_queue import ServiceBusy, ServiceClosed
from studio.voices import DEFAULT_CONSENT_STATEMENT, Consent, VoiceError, VoiceNotFound

log = logging.getLogger("higgs.api")

CONSENT_YES = ("true", "yes", "1", "on")
CONSENT_STATEMENT_WORDS = 3  # a statement is a sentence ("The speaker agreed."), not a word ("n", "ok")
_NEGATIONS = frozenset(["no", "not", "nope", "never", "none", "false", "deny", "denied", "refuse", "refused", "without", "don't", "dont", "isn't"])
# The fields PATCH /v1/audio/voices/{id} changes, as the API names them → the library's names.
VOICE_FIELDS = {"shared": "shared", "name": "name", "description": "description", "ref_text": "transcript",
                "style": "style"}


def voice_json(voice) -> dict[str, Any]:
    """One saved or preset voice (`studio.voices.Voice`) as the API shows it (the same fields in both list shapes)."""
    try:
        created = int(datetime.fromisoformat(voice.created).timestamp())
    except (TypeError, ValueError):
        created = None
    return {"id": voice.id, "object": "audio.voice", "name": voice.name, "ref_text": voice.transcript or None,
            "description": voice.description or None, "style": voice.style or None, "seed": voice.seed,
            "seconds": round(voice.seconds, 2), "created_at": created,
            "preset": voice.preset,  # one of the owner's preset voices: read-only
            "shared": voice.preset or voice.shared}  # visitors of a public page may see and use it


_DEFAULT_VOICE_JSON = {"id": DEFAULT_VOICE, "object": "audio.voice", "name": "Default (zero-shot)", "ref_text": None,
                       "description": "The model's own voice, no reference clip.", "style": None, "seed": None,
                       "seconds": None, "created_at": None, "preset": False, "shared": True}


def _form_bool(value: str, name: str) -> bool:
    """A multipart field that means true or false (empty: false)."""
    if value.lower() in ("", "false", "no", "0", "off"):
        return False
    if value.lower() in CONSENT_YES:
        return True
    raise ApiError(400, f"Field `{name}` must be true or false (got {value!r}).", param=name)


def check_consent(value: str) -> str:
    """The consent field → the statement stored with the voice; an ApiError unless it is an explicit yes."""
    value = value.strip()
    words = value.lower().replace(",", " ").replace(".", " ").split()
    if value.lower() in CONSENT_YES:
        return DEFAULT_CONSENT_STATEMENT
    if len(words) >= CONSENT_STATEMENT_WORDS and not _NEGATIONS.intersection(words):
        return value
    raise ApiError(400, "Field `consent` must confirm that the speaker agreed to have their voice cloned: send "
                        f"\"true\" (also \"yes\", \"1\", \"on\") or a statement of at least "
                        f"{CONSENT_STATEMENT_WORDS} words, such as \"Ann agreed by email on 2026-11-30\". It is "
                        "stored with the voice.", param="consent")


class VoiceRoutes(Routes):
    """The voice and style routes; `transcriber` (studio/audio/asr.py) fills a voice's missing ref_text, as the page
    does."""

    def __init__(self, service, access, limiter, *, transcriber=None):
        super().__init__(service, access, limiter)
        self.transcriber = transcriber

    def _library(self):
        if self.service.voices is None:
            raise ApiError(404, "This server has no voice library configured.")
        return self.service.voices

    def _get(self, key: str):
        try:
            return self._library().get(key)
        except VoiceNotFound:
            raise ApiError(404, f"No voice {key!r}; GET /v1/audio/voices lists them.", param="voice_id",
                           code="voice_not_found") from None

    async def list_voices(self, request: Request) -> JSONResponse:
        """Saved voices. Default shape `{"voices": [...]}` (what Open WebUI reads, with the zero-shot
        "default" first); `?format=openai` gives OpenAI's `{"object": "list", "data": [...]}`."""
        self.check_auth(request)
        voices = [voice_json(v) for v in await self.in_thread(self._library().list)]
        if request.query_params.get("format", "").lower() == "openai":
            return JSONResponse({"object": "list", "data": voices})
        return JSONResponse({"voices": [_DEFAULT_VOICE_JSON, *voices, *await self.in_thread(self._aliases)]})

    def _aliases(self) -> list[dict[str, Any]]:
        """The voice names chat clients send (`alloy`, …) as entries of the list, each with what it speaks with;
        a built-in one that a saved voice of the same name overrides is left out."""
        out = []
        for alias in self.service.aliases.list():
            try:
                if self.service.resolve_alias(alias.name) is None:
                    continue
                voice = self.service.resolve_voice(alias.voice_id)
            except VoiceNotFound:  # its voice was deleted: a request names it in its 404
                continue
            out.append({"id": alias.name, "object": "audio.voice", "name": f"{alias.name} ({alias.shown})",
                        "kind": "builtin", "alias": alias.as_json(), "preset": False,
                        "shared": voice is None or voice.preset or voice.shared})
        return out

    async def get_voice(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        return JSONResponse(voice_json(voice))

    async def create_voice(self, request: Request) -> JSONResponse:
        """Multipart `audio_sample` (≤ 10 MB), `name`, `consent` (required), `ref_text` (the clip's transcript;
        recommended: without it the studio's transcriber fills it, `ref_text_source: "asr"` in the answer, or
        the answer carries a `warning`), optional `description`, `style`, `asserted_by`."""
        self.check_auth(request)
        self.check_site(request)
        self._library()
        if "multipart/form-data" not in request.headers.get("content-type", ""):
            raise ApiError(400, "Send the voice as multipart/form-data with fields audio_sample (the clip), name, "
                                "ref_text (its transcript) and consent.")
        await self.read_body(request, MAX_UPLOAD_BYTES + FORM_OVERHEAD)
        try:
            form = await request.form(max_files=2, max_fields=16)
        except MultiPartException as exc:  # starlette's sentences: too many files or fields, a part too large
            raise ApiError(400, f"Could not parse the multipart form: {exc.message}") from None
        except Exception:
            raise ApiError(400, "Could not parse the multipart form; send the voice as multipart/form-data with "
                                "fields audio_sample, name, ref_text and consent.") from None
        upload = form.get("audio_sample")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "Field `audio_sample` (the reference clip, as a file) is required.",
                           param="audio_sample")
        data = await upload.read()
        if len(data) > MAX_UPLOAD_BYTES:
            raise ApiError(413, f"`audio_sample` is {len(data) / MB:.1f} MB; the limit is "
                                f"{MAX_UPLOAD_BYTES // MB} MB.", param="audio_sample")
        fields = {k: str(form.get(k) or "").strip() for k in
                  ("name", "consent", "ref_text", "transcript", "description", "style", "asserted_by", "shared")}
        if not fields["name"]:
            raise ApiError(400, "Field `name` is required.", param="name")
        statement = check_consent(fields["consent"])
        shared = _form_bool(fields["shared"], "shared")
        consent = Consent(asserted_by=fields["asserted_by"] or "API client", statement=statement)
        try:
            samples, rate = await self.in_thread(load_audio, data)
        except ValueError as exc:
            raise ApiError(400, f"`audio_sample` could not be read as audio: {exc}", param="audio_sample") from None
        style = self.instructions_style(fields["style"]) if fields["style"] else None
        transcript, note = fields["ref_text"] or fields["transcript"] or None, None
        if transcript is None and self.transcriber is not None:  # as the page does; never an error
            try:
                text, note = await self.in_thread(self.transcriber.transcribe, samples, rate)
            except Exception as exc:  # the clip is still a voice; the client can send ref_text next time
                log.warning("transcribing a voice clip failed: %r", exc)
                text, note = "", "Automatic transcription failed; send ref_text."
            transcript = text or None
        try:
            voice = await self.in_thread(lambda: self.service.save_voice(
                samples, rate, name=fields["name"], transcript=transcript, description=fields["description"],
                style=style, consent=consent))
            if shared:
                voice = await self.in_thread(lambda: self._library().update(voice.id, shared=True))
        except (ServiceBusy, ServiceClosed) as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from None
        except ValueError as exc:  # ReferenceAudioError, VoiceError: the message says what to fix
            raise ApiError(400, str(exc), param="audio_sample" if isinstance(exc, ReferenceAudioError) else None) \
                from None
        body = voice_json(voice)
        if transcript is not None and not (fields["ref_text"] or fields["transcript"]):
            body["ref_text_source"] = "asr"  # the client may want to check what was heard
        elif transcript is None:
            body["warning"] = ("No ref_text: the voice clones less faithfully without the clip's transcript. "
                               + (note or "Send ref_text."))
        return JSONResponse(body, status_code=201)

    async def update_voice(self, request: Request) -> JSONResponse:
        """JSON with any of `shared` (true: visitors of a public page may see and use the voice), `name`,
        `description`, `ref_text`, `style`; answers the voice as it is now."""
        self.check_auth(request)
        self.check_site(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        try:
            changes = json.loads(await self.read_body(request, FORM_OVERHEAD) or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            changes = None
        if not isinstance(changes, dict) or not changes:
            raise ApiError(400, f"Send a JSON object with any of {', '.join(VOICE_FIELDS)}, e.g. {{\"shared\": true}}.")
        unknown = sorted(set(changes) - set(VOICE_FIELDS))
        if unknown:
            raise ApiError(400, f"Unknown field(s) {', '.join(unknown)}; a voice's editable fields are "
                                f"{', '.join(VOICE_FIELDS)}.", param=unknown[0])
        if "shared" in changes and not isinstance(changes["shared"], bool):
            raise ApiError(400, "`shared` must be true or false.", param="shared")
        if voice.preset:
            raise ApiError(403, f"{voice.name!r} is one of the studio's preset voices, which are read-only and "
                                "shown to everyone.", param="voice_id")
        updates = {VOICE_FIELDS[k]: v for k, v in changes.items()}
        if updates.get("style"):
            updates["style"] = self.service.resolve_style(self.instructions_style(updates["style"]))
        try:
            updated = await self.in_thread(lambda: self._library().update(voice.id, **updates))
        except VoiceNotFound:
            raise ApiError(404, f"No voice {voice.id!r}; it was deleted meanwhile.", param="voice_id") from None
        except ValueError as exc:  # VoiceError: a name taken, a field too long
            raise ApiError(400, str(exc)) from None
        return JSONResponse(voice_json(updated))

    async def delete_voice(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        self.check_site(request)
        voice = await self.in_thread(self._get, request.path_params["voice_id"])
        try:
            await self.in_thread(self._library().delete, voice.id)
        except VoiceNotFound:  # deleted by someone else in between: the outcome the client asked for
            pass
        except VoiceError as exc:  # one of the owner's preset voices: read-only, also over the API
            raise ApiError(403, str(exc), param="voice_id") from None
        return JSONResponse({"id": voice.id, "object": "audio.voice.deleted", "deleted": True})

    async def styles(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        presets = self.service.presets
        items = [] if presets is None else [
            {"name": p.name, "description": p.description, "prefix": p.prefix, "temperature": p.temperature,
             "builtin": p.builtin} for p in presets.list()]
        return JSONResponse({"styles": items})
