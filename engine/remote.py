"""`RemoteEngine`: the engine's streaming interface over HTTP, for a studio that drives a speech server
instead of a local checkpoint (another Higgs Studio, vLLM-Omni, SGLang-Omni, or any OpenAI-style server).

    engine = RemoteEngine("http://gpu-box:8000", api_key=None)
    for chunk in engine.generate_stream("Hello.", temperature=0, seed=7):   # engine.types.Chunk
        play(chunk.audio)                                                    # float32 mono 24 kHz
    chunk.metrics.ttfa_ms, chunk.metrics.rtf                                 # measured here, at the client
    engine.info.remote_kind, engine.info.max_batch                           # "vLLM-Omni", takes sent at once

The servers accept different requests, so the client first learns which kind it talks to (`Dialect`, from
`GET /health`, `GET /v1/models`' `owned_by` and the voices listing) and then sends each what it takes:
* the voice: SGLang-Omni requires `voice` and reads `"default"` as zero-shot; vLLM-Omni refuses any `voice`
  that is not an uploaded one, so zero-shot and one-off clones send none; a clip travels as `ref_audio` (a
  base64 data URL) + `ref_text`, the fields all of them read;
* streaming: vLLM-Omni and SGLang-Omni answer `stream: true` with SSE unless `stream_format: "audio"` asks
  for raw PCM. Whatever a server sends, raw 16-bit PCM or SSE audio events, is read as what it is;
* length: vLLM-/SGLang-Omni count `max_new_tokens` in model steps, our frames + the 7-step delay tail;
* sampling: vLLM-Omni's request schema has no temperature / top-k / top-p (its deploy config sets them), so
  `info.sampling_note` says so and the studio shows those controls as not honoured;
* style: the Higgs paths of every server ignore `instructions`, so a style leads `input` as inline tags.
The dialects live in engine/dialects.py, what travels on the wire (clips, voice lists, PCM, SSE) in
engine/wire.py. No studio imports: the studio's service drives this exactly as it drives a local `Engine`, with as many
takes at once as `info.max_batch` (`concurrency`, or what the server reports, or 16).
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from .config import SAMPLE_RATE, SAMPLES_PER_FRAME
from .dialects import OPENAI, STUDIO, Dialect, detect_dialect, server_voice_name
from .types import DEFAULT_REPEAT_GUARD, Chunk, EngineInfo, Metrics, SamplingParams
from .wire import (
    MAX_CLIP_BYTES,
    RemoteError,
    RemoteVoice,
    RemoteVoiceInfo,
    clip_bytes,
    error_message,
    from_pcm16,
    parse_voices,
    redact_url,
    sse_events,
    strip_wav_header,
    wav_bytes,
)

DEFAULT_MODEL = "bosonai/higgs-audio-v3-tts-4b"  # when the server lists no model (vLLM-Omni's default name)
DEFAULT_CONCURRENCY = 16  # takes sent at once when the server does not say how many it batches
# A server that did not answer is asked again at most this often, so a page load or a take does not wait on
# a dead host's timeouts each time it reads `info`.
RECONTACT_S = 30.0
# A take streams in pieces of at least this many samples (one codec frame, 40 ms): small enough to keep
# time-to-first-audio honest, large enough not to hand the player one network read at a time.
MIN_CHUNK_SAMPLES = SAMPLES_PER_FRAME


class RemoteEngine:
    """The `Engine` interface the studio uses (`generate_stream`, `generate`, `encode_voice`, `info`), plus
    the server's voice routes, over HTTP. Thread-safe: one `httpx.Client` whose pool holds a connection for
    each take that may run at once."""

    is_remote = True  # no local codec: a saved voice travels as its clip (`encode_voice`), never as codes

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None, *,
                 concurrency: int | None = None, timeout: float = 600.0, connect_timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None):
        base = base_url.strip().rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"remote server URL must start with http:// or https:// (got {redact_url(base_url)!r})")
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"remote concurrency must be a whole number ≥ 1 (got {concurrency!r})")
        if base.endswith("/v1"):
            base = base[:-3]
        self.base_url = base
        self.shown_url = redact_url(base)  # what status panels, /health and error messages may show
        self._model = model
        self._concurrency = concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        pool = max(concurrency or DEFAULT_CONCURRENCY, DEFAULT_CONCURRENCY) + 4  # + voice and status calls
        self._http = httpx.Client(base_url=base, headers=headers, transport=transport,
                                  limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._lock = threading.Lock()
        self._facts: dict[str, Any] | None = None
        self._unreached: tuple[float, dict[str, Any]] | None = None  # (when, the facts) of the last failed contact

    # ---------------------------------------------------------------- facts
    def _learn(self) -> dict[str, Any]:
        """Ask the server once what it is (kept after the first answer; while it is down, asked again every
        RECONTACT_S)."""
        with self._lock:
            if self._facts is not None:
                return self._facts
            if self._unreached is not None and time.monotonic() - self._unreached[0] < RECONTACT_S:
                return self._unreached[1]
            health, reached = self._get_json("/health")
            models, reached_models = self._get_json("/v1/models")
            dialect = detect_dialect(health, models, None)
            if dialect is OPENAI and (reached or reached_models):
                dialect = detect_dialect(health, models, self._get_json("/v1/audio/voices")[0])
            cards = models.get("data") if isinstance(models, dict) else None
            served = [str(c["id"]) for c in cards or [] if isinstance(c, dict) and c.get("id")]
            facts = {"dialect": dialect, "health": health if isinstance(health, dict) else {}, "models": served,
                     "reached": reached or reached_models}
            if facts["reached"]:
                self._facts = facts
            else:
                self._unreached = (time.monotonic(), facts)
            return facts

    def _get_json(self, path: str) -> tuple[Any, bool]:
        """(the JSON at `path` or None, whether the server answered at all)."""
        try:
            r = self._http.get(path, timeout=5.0)
        except httpx.HTTPError:
            return None, False
        try:
            return (r.json() if r.status_code == 200 else None), True
        except ValueError:
            return None, True

    @property
    def dialect(self) -> Dialect:
        return self._learn()["dialect"]

    @property
    def model(self) -> str:
        """`model=` if given, else the first model the server lists (vLLM-Omni refuses names it does not
        serve), else vLLM-Omni's default name."""
        if self._model:
            return self._model
        return (self._learn()["models"] or [DEFAULT_MODEL])[0]

    def health(self) -> dict[str, Any]:
        """The server's `/health` JSON ({} when it has none, answers something else, or is down)."""
        return self._learn()["health"]

    @property
    def info(self) -> EngineInfo:
        """What the studio's status panel shows. `max_batch`: how many takes the studio sends at once (the
        server batches them); `sampling_note`: set when the server ignores temperature / top-k / top-p."""
        facts = self._learn()
        dialect, server = facts["dialect"], facts["health"]
        reported = server.get("max_batch") if dialect is STUDIO else None
        batch = self._concurrency or (reported if isinstance(reported, int) and reported > 0 else DEFAULT_CONCURRENCY)
        note = None if dialect.sampling else (f"The {dialect.name} server ignores temperature, top-k and top-p (its "
                                              f"deploy config sets sampling); the seed is still sent.")
        return EngineInfo(checkpoint=self.model, device=self.shown_url, precision=server.get("precision") or "remote",
                          backend="remote", demo=False, remote=self.shown_url, max_batch=batch,
                          remote_kind=dialect.name if facts["reached"] else "unreachable",
                          server_device=server.get("device"), server_backend=server.get("backend"), sampling_note=note)

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------- generation
    def speech_body(self, text: str, *, voice=None, style: str | None = None, temperature: float | None = None,
                    top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                    max_frames: int | None = None, repeat_guard: int | None = DEFAULT_REPEAT_GUARD,
                    response_format: str = "pcm", stream: bool = True) -> dict[str, Any]:
        """The JSON body for `POST /v1/audio/speech`, in the server's dialect. `style` (a tag prefix) leads
        the text; `voice` is a server-side voice name, or a `RemoteVoice` sent as `ref_audio` + `ref_text`."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("there is no text to speak; give a non-empty sentence")
        dialect = self.dialect
        style = (style or "").strip()
        body: dict[str, Any] = {"model": self.model, "input": f"{style}{text}" if style else text,
                                "response_format": response_format}
        if stream:
            body.update(dialect.stream)
        if isinstance(voice, RemoteVoice):
            body["ref_audio"] = voice.data_url()
            if voice.transcript:
                body["ref_text"] = voice.transcript
        elif isinstance(voice, str) and voice:
            body["voice"] = voice
        elif voice is not None:
            raise ValueError("a remote engine takes a server-side voice name or the RemoteVoice from encode_voice()")
        if "voice" not in body and dialect.zero_shot_voice:
            body["voice"] = dialect.zero_shot_voice  # required there; with ref_audio the clip wins
        sampling = (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if dialect.sampling else ()
        for name, value in (*sampling, ("seed", seed)):
            if value is not None:
                body[name] = value
        if max_frames is not None:
            body[dialect.length_field] = int(max_frames) + dialect.length_tail
        if dialect is STUDIO and repeat_guard != DEFAULT_REPEAT_GUARD:  # our extension
            body["repeat_guard"] = repeat_guard
        return body

    def generate_stream(self, text: str, *, voice=None, style: str | None = None,
                        cancel: threading.Event | None = None, params: SamplingParams | None = None,
                        **options) -> Iterator[Chunk]:
        """Yield `Chunk`s of float32 24 kHz audio as the server streams it; the last has `final=True`. TTFA and
        RTF are measured here (request sent → first audio received; wall / audio). Closing the generator or
        setting `cancel` closes the connection, which stops a streaming server.
        Sampling settings as for `Engine.generate_stream`: `params` and/or keyword options, the keywords
        winning (`SamplingParams.of`). Only the settings given are sent; the server's defaults hold the rest
        (a keyword given as None counts as not given, except `repeat_guard=None`, which disables it)."""
        options = {k: v for k, v in options.items() if v is not None or k == "repeat_guard"}
        sampling = SamplingParams.of(params, **options)
        sent = {k: v for k, v in sampling.as_dict().items() if params is not None or k in options}
        return self._stream(self.speech_body(text, voice=voice, style=style, **sent), sampling.seed, cancel)

    def generate(self, text: str, **options) -> np.ndarray:
        """The whole take (float32 mono 24 kHz); takes the options of `generate_stream`."""
        return np.concatenate([c.audio for c in self.generate_stream(text, **options)])

    def _named(self) -> str:
        """How error sentences name the server: its kind and its URL."""
        return f"{self.dialect.name} server at {self.shown_url}"

    def _open(self, body: dict) -> httpx.Response:
        request = self._http.build_request("POST", "/v1/audio/speech", json=body)
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise RemoteError(f"Could not reach the speech server at {self.shown_url}: {exc}") from None
        if response.status_code >= 400:
            response.read()
            response.close()
            raise RemoteError(f"The {self._named()} refused the take "
                              f"({response.status_code}): {error_message(response)}", response.status_code)
        return response

    def _check_format(self, response: httpx.Response) -> None:
        """Refuse, with a sentence, audio this client would otherwise play as noise."""
        ctype = response.headers.get("content-type", "")
        problem = None
        if "wav" in ctype:
            problem = "WAV where 16-bit PCM was asked for (response_format=pcm)"
        elif "json" in ctype:
            problem = "JSON where audio was asked for"
        for header, want in (("x-sample-rate", SAMPLE_RATE), ("x-channels", 1), ("x-bit-depth", 16)):
            got = response.headers.get(header)
            if got is not None and got.strip() != str(want):
                problem = f"{header} {got} where this studio plays {want} (24 kHz mono 16-bit)"
        if problem:
            response.close()
            raise RemoteError(f"The {self._named()} answered {problem}. Configure the "
                              f"server for 24 kHz mono 16-bit PCM.", 502)

    def _pieces(self, response: httpx.Response, end: dict) -> Iterator[bytes]:
        """The take's 16-bit PCM bytes as they arrive, from a raw body or from SSE audio events."""
        if "text/event-stream" not in response.headers.get("content-type", ""):
            yield from response.iter_bytes()
            return
        for event, payload in sse_events(response.iter_lines()):
            kind = payload.get("type") if isinstance(payload, dict) else None
            kind = kind or event
            if kind in ("speech.audio.error", "error"):
                err = payload.get("error") if isinstance(payload, dict) else None
                message = err.get("message") if isinstance(err, dict) else err or payload
                raise RemoteError(f"The {self._named()} stopped the take: {message}", 502)
            if kind in ("speech.audio.done", "[DONE]") or isinstance(payload, dict) and payload.get("finish_reason"):
                end["reason"] = payload.get("finish_reason") if isinstance(payload, dict) else None
                return
            yield self._event_pcm(payload)

    def _event_pcm(self, payload: Any) -> bytes:
        """One SSE audio event → its PCM bytes: OpenAI's `speech.audio.delta` (`audio` is base64, vLLM-Omni)
        or SGLang-Omni's older `audio.speech.chunk` (`audio.data`, with its format and rate)."""
        audio = payload.get("audio") if isinstance(payload, dict) else None
        fmt = payload.get("response_format", "pcm") if isinstance(payload, dict) else "pcm"
        if isinstance(audio, dict):
            fmt, rate = audio.get("format", "pcm"), audio.get("sample_rate", SAMPLE_RATE)
            audio = audio.get("data")
            if rate != SAMPLE_RATE:
                raise RemoteError(f"The {self._named()} streams {rate} Hz audio; the "
                                  f"studio plays {SAMPLE_RATE} Hz.", 502)
        try:
            data = base64.b64decode(audio, validate=True) if isinstance(audio, str) else None
        except (binascii.Error, ValueError):
            data = None
        if data is None or fmt not in ("pcm", "wav"):
            raise RemoteError(f"The {self._named()} sent a stream event this studio "
                              f"cannot read as 16-bit PCM: {str(payload)[:200]}", 502)
        return strip_wav_header(data) if fmt == "wav" else data

    def _stream(self, body: dict, seed: int | None, cancel: threading.Event | None) -> Iterator[Chunk]:
        started = time.perf_counter()
        response = self._open(body)
        self._check_format(response)
        server_seed = response.headers.get("x-seed")  # ours only: the seed our studio drew
        seed = int(server_seed) if server_seed and server_seed.isdigit() else seed
        state = {"samples": 0, "ttfa": None}
        precision = self.health().get("precision") or "remote"

        def metrics(reason=None) -> Metrics:
            elapsed = time.perf_counter() - started
            frames = state["samples"] // SAMPLES_PER_FRAME
            return Metrics(ttfa_ms=state["ttfa"], rtf=elapsed / max(state["samples"] / SAMPLE_RATE, 1e-9),
                           frames=frames, rows=0, ms_per_frame=1e3 * elapsed / max(frames, 1), prefill_ms=0.0,
                           prompt_tokens=0, reused_tokens=0, peak_mem_bytes=0, mem_kind="remote",
                           precision=precision, backend="remote",
                           device=self.shown_url, seed=seed, stop_reason=reason)

        pending = b""
        end: dict = {}
        reason = None
        try:
            for data in self._pieces(response, end):
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                pending += data
                usable = len(pending) // 2 * 2
                if usable // 2 < MIN_CHUNK_SAMPLES:
                    continue
                audio = from_pcm16(pending[:usable])
                pending = pending[usable:]
                state["samples"] += len(audio)
                if state["ttfa"] is None:
                    state["ttfa"] = 1e3 * (time.perf_counter() - started)
                yield Chunk(audio=audio, metrics=metrics(), final=False)
        except httpx.HTTPError as exc:
            raise RemoteError(f"The speech stream from the {self._named()} broke off: {exc}", 502) from None
        finally:
            response.close()
        tail = from_pcm16(pending[:len(pending) // 2 * 2])
        state["samples"] += len(tail)
        if state["ttfa"] is None and len(tail):
            state["ttfa"] = 1e3 * (time.perf_counter() - started)
        reason = reason or response.headers.get("x-stop-reason") or end.get("reason") or "end"
        yield Chunk(audio=tail, metrics=metrics(reason), final=True)

    # ---------------------------------------------------------------- voices
    def encode_voice(self, wav, sample_rate: int, transcript: str | None = None) -> RemoteVoice:
        """A clip → the `RemoteVoice` sent with each request (the server encodes it; nothing runs here)."""
        wav = np.asarray(wav)
        if wav.size == 0:
            raise ValueError("the reference clip is empty; upload or record it again")
        data = wav_bytes(wav, int(sample_rate))
        if len(data) > MAX_CLIP_BYTES * 3 // 4:
            raise ValueError("the reference clip is too long to send; use 3-15 s of speech")
        return RemoteVoice(wav_bytes=data, transcript=transcript or None)

    def list_voices(self) -> list[RemoteVoiceInfo]:
        """The server's voices, whichever of the four list shapes it answers with."""
        return parse_voices(self._json("GET", "/v1/audio/voices"))

    def add_voice(self, audio, *, name: str, consent: str, ref_text: str | None = None,
                  sample_rate: int | None = None, speaker_description: str | None = None) -> dict[str, Any]:
        """Upload a clip as a saved voice (`POST /v1/audio/voices`, multipart `audio_sample`, `name`,
        `consent`, `ref_text`: the fields vLLM-Omni, SGLang-Omni and this studio read) and return its record
        with an `id`: ours gives one; the Omni servers key voices by name, so there the name is the id. A name
        the server would refuse is a ValueError before anything is sent."""
        name = server_voice_name(self.dialect, name)
        data, filename = clip_bytes(audio, sample_rate)
        fields = {"name": name, "consent": consent}
        if ref_text:
            fields["ref_text"] = ref_text
        if speaker_description:
            fields["speaker_description"] = speaker_description
        answer = self._json("POST", "/v1/audio/voices", data=fields,
                            files={"audio_sample": (filename, data, "audio/wav")})
        record = answer.get("voice") if isinstance(answer, dict) and isinstance(answer.get("voice"), dict) else answer
        if not isinstance(record, dict):
            raise RemoteError(f"The {self._named()} answered the upload with "
                              f"{str(answer)[:200]}, not a voice record.", 502)
        return {**record, "id": str(record.get("id") or record.get("name") or name)}

    def delete_voice(self, voice_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/audio/voices/{quote(voice_id, safe='')}")

    def _json(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteError(f"Could not reach the speech server at {self.shown_url}: {exc}") from None
        if response.status_code >= 400:
            raise RemoteError(f"The {self._named()} answered {response.status_code} to "
                              f"{method} {path}: {error_message(response)}", response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(f"The {self._named()} answered {method} {path} with "
                              f"something other than JSON.", 502) from None
