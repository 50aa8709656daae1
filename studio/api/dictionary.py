"""The owner's pronunciation dictionary over HTTP (studio/text/pronounce.py; docs/API.md has the fields):

* `GET /v1/dictionary`: the rules as JSON (`?format=tsv` as a TSV file);
* `PUT /v1/dictionary`: the whole dictionary replaced, sent as JSON (`{"rules": [...]}`), TSV
  (`text/tab-separated-values`) or a PLS lexicon (`application/pls+xml`, its `<alias>` entries);
* `POST /v1/dictionary/apply`: `{"input", "voice"?, "language"?}` → the text as it will be spoken and the
  rules that fired (the long form normalises first: send what it planned).
"""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from studio.api.model import ApiError, Routes
from studio.takes.limits import MAX_TEXT_CHARS
from studio.text.pronounce import MAX_FILE_BYTES, Dictionary, PronunciationError, from_pls, from_tsv, rules_json, to_tsv

TSV_TYPES = ("text/tab-separated-values", "text/tsv", "text/plain")
PLS_TYPES = ("application/pls+xml", "application/xml", "text/xml")


class DictionaryRoutes(Routes):
    """Reads and replaces the global dictionary the service applies to every take."""

    def _store(self):
        if self.service.dictionary is None:
            raise ApiError(404, "This studio keeps no pronunciation dictionary (it has no studio folder).")
        return self.service.dictionary

    async def get_dictionary(self, request: Request) -> Response:
        self.check_auth(request)
        try:
            dictionary = await self.in_thread(lambda: self._store().dictionary)
        except PronunciationError as exc:
            raise ApiError(500, str(exc)) from None
        if request.query_params.get("format", "json").lower() == "tsv":
            return Response(to_tsv(dictionary), media_type="text/tab-separated-values; charset=utf-8",
                            headers={"Content-Disposition": 'attachment; filename="dictionary.tsv"'})
        return JSONResponse(rules_json(dictionary))

    async def put_dictionary(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        self.check_site(request)
        store = self._store()
        body = await self.read_body(request, MAX_FILE_BYTES)
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        dictionary, notes = await self.in_thread(_parsed, kind, body)  # compiles every rule: off the event loop
        await self.in_thread(store.replace, dictionary)
        return JSONResponse({**rules_json(dictionary), "notes": notes})

    async def apply(self, request: Request) -> JSONResponse:
        self.check_auth(request)
        body = await self.read_body(request, 4 * MAX_TEXT_CHARS + 4096)
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise ApiError(400, 'Send JSON such as {"input": "Nguyen said hi.", "voice": "Narrator"}.') from None
        text = payload.get("input") if isinstance(payload, dict) else None
        if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
            raise ApiError(400, f"`input` must be text of at most {MAX_TEXT_CHARS} characters.", param="input")
        voice, language = payload.get("voice"), payload.get("language")
        if not isinstance(voice, (str, type(None))) or not isinstance(language, (str, type(None))):
            raise ApiError(400, "`voice` and `language` must be text.")
        return JSONResponse(await self.in_thread(self._applied, text, voice, language))

    def _applied(self, text: str, voice: str | None, language: str | None) -> dict:
        """`apply`'s answer, worked out in a thread: it reads the voice library and the dictionary's file,
        compiles the rules of a new scope and runs them."""
        names: tuple[str, ...] = ()
        if voice:
            try:
                record = self.service.resolve_voice(voice)
                names = (record.id, record.name)
            except ValueError:
                names = (voice,)  # not a saved voice: its rules still apply by that name
        try:
            spoken, fired = self.service.pronounce(text, names, language)
        except PronunciationError as exc:
            raise ApiError(400, str(exc)) from None
        return {"input": text, "spoken": spoken, "rules": [r.to_json() for r in fired],
                "version": self.service.rules().version}


def _parsed(kind: str, body: bytes) -> tuple[Dictionary, list[str]]:
    """A PUT's body as a checked dictionary and the notes on what was skipped, or ApiError(400) saying why not."""
    try:
        if kind in PLS_TYPES:
            return from_pls(body)
        text = body.decode("utf-8-sig")
        return (from_tsv(text) if kind in TSV_TYPES else Dictionary.from_json(json.loads(text))), []
    except UnicodeDecodeError:
        raise ApiError(400, "The dictionary must be UTF-8 text.") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"The body is not valid JSON ({exc}); send {{\"rules\": [...]}}, or TSV with "
                            "`Content-Type: text/tab-separated-values`.") from None
    except RecursionError:
        raise ApiError(400, "The body is nested too deeply to be a dictionary.") from None
    except PronunciationError as exc:
        raise ApiError(400, str(exc)) from None
