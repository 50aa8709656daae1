"""`RemoteEngine`: the engine's streaming interface over HTTP, for a studio that drives a speech server
instead of a local checkpoint (another Higgs Studio, vLLM-Omni, SGLang-Omni, or any OpenAI-style server).

    engine = RemoteEngine("http://gpu-box:8000", api_key=None)
    for chunk in engine.generate_stream("Hello.", temperature=0, seed=7):   # engine.types.Chunk
        play(chunk.audio)                                                    # float32 mono 24 kHz
    chunk.metrics.ttfa_ms, chunk.metrics.rtf                                 # measured here, at the client
    engine.info["remote_kind"], engine.info["max_batch"]                     # "vLLM-Omni", takes sent at once

The servers accept different requests, so the client first learns which kind it talks to (`Dialect`, from
`GET /health`, `GET /v1/models`' `owned_by` and the voices listing) and then sends each what it takes:
* the voice: SGLang-Omni requires `voice` and reads `"default"` as zero-shot; vLLM-Omni refuses any `voice`
  that is not an uploaded one, so zero-shot and one-off clones send none; a clip travels as `ref_audio` (a
  base64 data URL) + `ref_text`, the fields all of them read;
* streaming: vLLM-Omni and SGLang-Omni answer `stream: true` with SSE unless `stream_format: "audio"` asks
  for raw PCM. Whatever a server sends, raw 16-bit PCM or SSE audio events, is read as what it is;
* length: vLLM-/SGLang-Omni count `max_new_tokens` in model steps, our frames + the 7-step delay tail;
* sampling: vLLM-Omni's request schema has no temperature / top-k / top-p (its deploy config sets them), so
  `info["sampling_note"]` says so and the studio shows those controls as not honoured;
* style: the Higgs paths of every server ignore `instructions`, so a style leads `input` as inline tags.
No studio imports: the studio's service drives this exactly as it drives a local `Engine`, with as many
takes at once as `info["max_batch"]` (`concurrency`, or what the server reports, or 16).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import numpy as np
import soundfile as sf

from .config import CODEBOOKS, SAMPLE_RATE, SAMPLES_PER_FRAME
from .types import DEFAULT_REPEAT_GUARD, Chunk, Metrics, SamplingParams

DEFAULT_MODEL = "bosonai/higgs-audio-v3-tts-4b"  # when the server lists no model (vLLM-Omni's default name)
DEFAULT_CONCURRENCY = 16  # takes sent at once when the server does not say how many it batches
# A server that did not answer is asked again at most this often, so a page load or a take does not wait on
# a dead host's timeouts each time it reads `info`.
RECONTACT_S = 30.0
# A take streams in pieces of at least this many samples (one codec frame, 40 ms): small enough to keep
# time-to-first-audio honest, large enough not to hand the player one network read at a time.
MIN_CHUNK_SAMPLES = SAMPLES_PER_FRAME
MAX_CLIP_BYTES = 10 * 1024 * 1024  # what the servers accept for a reference clip
# The delayed codebooks end CODEBOOKS - 1 steps after the last frame starts (engine/delay.py's StopRule.delay):
# a server counting model steps needs that many more than our frame budget.
DELAY_TAIL = CODEBOOKS - 1
SGLANG_VOICE_NAME = re.compile(r"^(?=.*[A-Za-z0-9])[A-Za-z0-9_.-]+$")


class RemoteError(RuntimeError):
    """The server could not be reached or refused the request; `status` is its HTTP status (None when it
    could not be reached) and the message names the server and says what it answered."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def client_status(self) -> int:
        """The status to answer our own caller with: the server refusing the request's content is the
        caller's 400; a server that is down, broken, busy or refuses our key is a gateway failure."""
        if self.status in (400, 404, 413, 422):
            return 400
        if self.status in (429, 503):
            return 503
        return 502


@dataclass(frozen=True)
class Dialect:
    """What one kind of server accepts. `zero_shot_voice`: the `voice` that means "no voice" (None: send no
    `voice`); `stream`: the fields that ask for raw PCM as it is made; `sampling`: whether temperature /
    top-k / top-p are in its request schema; `length_field` and `length_tail`: how a frame budget is
    spelled and what it adds (model steps = frames + the delay tail)."""

    key: str
    name: str
    zero_shot_voice: str | None
    stream: dict[str, Any]
    sampling: bool
    length_field: str
    length_tail: int


# Each kind's facts, read from the servers' code (tests/remote_fakes.py names the files and commits).
STUDIO = Dialect("higgs-studio", "Higgs Studio", None, {"stream": True}, True, "max_frames", 0)
VLLM_OMNI = Dialect("vllm-omni", "vLLM-Omni", None, {"stream": True, "stream_format": "audio"}, False,
                    "max_new_tokens", DELAY_TAIL)
SGLANG_OMNI = Dialect("sglang-omni", "SGLang-Omni", "default", {"stream": True, "stream_format": "audio"}, True,
                      "max_new_tokens", DELAY_TAIL)
OPENAI = Dialect("openai", "OpenAI-compatible", None, {"stream": True, "stream_format": "audio"}, True,
                 "max_new_tokens", DELAY_TAIL)
DIALECTS = {d.key: d for d in (STUDIO, VLLM_OMNI, SGLANG_OMNI, OPENAI)}


@dataclass(frozen=True)
class RemoteVoice:
    """A reference clip to send with each request (`ref_audio` + `ref_text`): what `encode_voice` returns in
    place of codec codes, since the server encodes the clip itself."""

    wav_bytes: bytes
    transcript: str | None = None

    def data_url(self) -> str:
        return "data:audio/wav;base64," + base64.b64encode(self.wav_bytes).decode()


@dataclass(frozen=True)
class RemoteVoiceInfo:
    """One voice as a server lists it. `kind` is "saved" (uploaded / cloned) or "builtin"."""

    id: str
    name: str
    kind: str = "saved"
    ref_text: str | None = None
    raw: Any = field(default=None, compare=False)


def parse_voices(payload: Any) -> list[RemoteVoiceInfo]:
    """Any of the four voices-list shapes → voices, built-ins first, one per name case-insensitively (the
    Omni servers key voices by lowercased name and list the lowercased key beside the uploaded record).

    ours / Kokoro / Open WebUI: `{"voices": [{"id", "name", ...}]}`;
    OpenAI / Boson:            `{"object": "list", "data": [{"id" | "voice", "name"?, ...}]}`;
    vLLM-Omni / SGLang-Omni:   `{"voices": ["default"?, "alice", ...], "uploaded_voices": [{"name", ...}]}`;
    Chatterbox-TTS-Server:     `{"status": "ok", "voices": ["file.wav", ...]}`.
    """
    if isinstance(payload, list):
        items = [("voices", v) for v in payload]
    elif isinstance(payload, dict):
        items = [("data", v) for v in payload.get("data") or []]
        items += [("voices", v) for v in payload.get("voices") or []]
        items += [("uploaded", v) for v in payload.get("uploaded_voices") or []]
    else:
        raise RemoteError(f"The server's voice list is not JSON object or list (got {type(payload).__name__}).")
    omni = isinstance(payload, dict) and "uploaded_voices" in payload  # their names, bar "default", are uploads
    out: dict[str, RemoteVoiceInfo] = {}
    for where, item in items:
        if isinstance(item, str):
            name = item.rsplit(".", 1)[0] if item.lower().endswith((".wav", ".mp3", ".flac", ".ogg")) else item
            kind = "saved" if where == "uploaded" or omni and item.lower() != "default" else "builtin"
            voice = RemoteVoiceInfo(id=item, name=name, kind=kind, raw=item)
        elif isinstance(item, dict):
            vid = item.get("id") or item.get("voice") or item.get("name") or item.get("voice_id")
            if not vid:
                continue
            kind = "builtin" if item.get("kind") == "builtin" or vid == "default" else "saved"
            voice = RemoteVoiceInfo(id=str(vid), name=str(item.get("name") or vid), kind=kind,
                                    ref_text=item.get("ref_text") or item.get("transcript"), raw=item)
        else:
            continue
        key = voice.id.casefold()
        if key not in out or where == "uploaded":
            out[key] = voice
    return sorted(out.values(), key=lambda v: v.kind != "builtin")


def _clip_bytes(audio, sample_rate: int | None) -> tuple[bytes, str]:
    """A clip in any of the forms the studio holds (path, encoded bytes, `(sr, ndarray)`, ndarray + rate)
    → encoded bytes and a filename to upload them as."""
    if isinstance(audio, (str, Path)):
        path = Path(audio)
        return path.read_bytes(), path.name
    if isinstance(audio, (bytes, bytearray, memoryview)):
        return bytes(audio), "clip.wav"
    if isinstance(audio, tuple) and len(audio) == 2:
        sample_rate, audio = audio
    if sample_rate is None:
        raise ValueError("a clip given as samples needs its sample_rate")
    return _wav_bytes(np.asarray(audio), int(sample_rate)), "clip.wav"


def _wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """Float WAV keeps the samples exactly as the studio holds them (the server then prepares the clip
    just as a local engine would); a clip too big for that goes as 16-bit."""
    samples = np.asarray(samples)
    if samples.dtype.kind in "iu":
        samples = samples.astype(np.float32) / float(np.iinfo(samples.dtype).max)
    samples = samples.astype(np.float32)
    subtype = "FLOAT" if samples.size * 4 + 1024 <= MAX_CLIP_BYTES * 3 // 4 else "PCM_16"
    buf = io.BytesIO()
    sf.write(buf, samples, sample_rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def redact_url(url: str) -> str:
    """`url` without its user name, password and query string, which may hold secrets."""
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else parts.hostname or ""
    return parts._replace(netloc=host + (f":{parts.port}" if parts.port else ""), query="", fragment="").geturl()


def detect_dialect(health: Any, models: Any, voices: Any) -> Dialect:
    """Which kind of server answered: our studio's `/health` has `engine_loaded` and `formats`; vLLM lists
    its models as `owned_by: "vllm"`, SGLang-Omni as `"sglang-omni"`; failing those, the Omni voices listing
    tells them apart (SGLang-Omni lists the preset `"default"`, vLLM-Omni only uploads)."""
    if isinstance(health, dict) and "engine_loaded" in health and "formats" in health:
        return STUDIO
    cards = models.get("data") if isinstance(models, dict) else None
    owners = {str(c.get("owned_by", "")).lower() for c in cards or [] if isinstance(c, dict)}
    if "vllm" in owners or "vllm-omni" in owners:
        return VLLM_OMNI
    if any(o.startswith("sglang") for o in owners):
        return SGLANG_OMNI
    if isinstance(voices, dict) and "uploaded_voices" in voices:
        return SGLANG_OMNI if "default" in (voices.get("voices") or []) else VLLM_OMNI
    return OPENAI


def server_voice_name(dialect: Dialect, name: str) -> str:
    """Our voice name → the name `dialect`'s server stores it under, or ValueError saying why it would refuse
    it. Our names may hold spaces; SGLang-Omni's may not, so spaces become underscores there."""
    name = (name or "").strip()
    if not name:
        raise ValueError("The voice needs a name.")
    if dialect is SGLANG_OMNI:
        mapped = re.sub(r"\s+", "_", name)
        if not SGLANG_VOICE_NAME.fullmatch(mapped):
            raise ValueError(f"The SGLang-Omni server takes voice names of letters, digits, '.', '_' and '-' only "
                             f"(spaces become '_'); {name!r} would be refused. Rename the voice.")
        if mapped.lower() == "default":
            raise ValueError("The SGLang-Omni server reserves the voice name 'default' for zero-shot; pick another.")
        return mapped
    if dialect is VLLM_OMNI and (name in (".", "..") or any(c in name for c in "/\\\x00")):
        raise ValueError(f"The vLLM-Omni server refuses voice names with '/', '\\' or NUL, and '.' or '..'; "
                         f"{name!r} would be refused. Rename the voice.")
    return name


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
    def info(self) -> dict[str, Any]:
        """What the studio's status panel shows. `max_batch`: how many takes the studio sends at once (the
        server batches them); `sampling_note`: set when the server ignores temperature / top-k / top-p."""
        facts = self._learn()
        dialect, server = facts["dialect"], facts["health"]
        reported = server.get("max_batch") if dialect is STUDIO else None
        batch = self._concurrency or (reported if isinstance(reported, int) and reported > 0 else DEFAULT_CONCURRENCY)
        info = {"checkpoint": self.model, "device": self.shown_url, "precision": server.get("precision") or "remote",
                "backend": "remote", "demo": False, "remote": self.shown_url, "max_batch": batch,
                "remote_kind": dialect.name if facts["reached"] else "unreachable",
                "server_device": server.get("device"), "server_backend": server.get("backend")}
        if not dialect.sampling:
            info["sampling_note"] = (f"The {dialect.name} server ignores temperature, top-k and top-p (its deploy "
                                     f"config sets sampling); the seed is still sent.")
        return info

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

    def generate_stream(self, text: str, *, voice=None, style: str | None = None, temperature: float | None = None,
                        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                        max_frames: int | None = None, repeat_guard: int | None = DEFAULT_REPEAT_GUARD,
                        cancel: threading.Event | None = None, params: SamplingParams | None = None
                        ) -> Iterator[Chunk]:
        """Yield `Chunk`s of float32 24 kHz audio as the server streams it; the last has `final=True`. TTFA and
        RTF are measured here (request sent → first audio received; wall / audio). Closing the generator or
        setting `cancel` closes the connection, which stops a streaming server.
        `params` (a `SamplingParams`) gives every sampling setting at once, in place of the keywords."""
        if params is not None:
            temperature, top_k, top_p = params.temperature, params.top_k, params.top_p
            seed, max_frames, repeat_guard = params.seed, params.max_frames, params.repeat_guard
        body = self.speech_body(text, voice=voice, style=style, temperature=temperature, top_k=top_k, top_p=top_p,
                                seed=seed, max_frames=max_frames, repeat_guard=repeat_guard)
        return self._stream(body, seed, cancel)

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
                              f"({response.status_code}): {_error_message(response)}", response.status_code)
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
        for event, payload in _sse_events(response.iter_lines()):
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
        return _strip_wav_header(data) if fmt == "wav" else data

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
                audio = _from_pcm16(pending[:usable])
                pending = pending[usable:]
                state["samples"] += len(audio)
                if state["ttfa"] is None:
                    state["ttfa"] = 1e3 * (time.perf_counter() - started)
                yield Chunk(audio=audio, metrics=metrics(), final=False)
        except httpx.HTTPError as exc:
            raise RemoteError(f"The speech stream from the {self._named()} broke off: {exc}", 502) from None
        finally:
            response.close()
        tail = _from_pcm16(pending[:len(pending) // 2 * 2])
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
        data = _wav_bytes(wav, int(sample_rate))
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
        data, filename = _clip_bytes(audio, sample_rate)
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
                              f"{method} {path}: {_error_message(response)}", response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(f"The {self._named()} answered {method} {path} with "
                              f"something other than JSON.", 502) from None


def _sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, Any]]:
    """Server-sent events → (event name, its data parsed as JSON, or the text for `[DONE]`)."""
    event, data = None, []
    for line in (*lines, ""):
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = text
                yield (text if text == "[DONE]" else event), payload
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def _from_pcm16(data: bytes) -> np.ndarray:
    """PCM16 little-endian → float32; /32767 undoes studio.formats.to_pcm16's ×32767 exactly."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0


def _strip_wav_header(data: bytes) -> bytes:
    """A WAV piece → its PCM: the first piece of a streamed WAV carries the header, later ones none."""
    if data[:4] != b"RIFF":
        return data
    at = data.find(b"data", 12)
    return data[at + 8:] if at >= 0 else b""


def _error_message(response: httpx.Response) -> str:
    """OpenAI's `{"error": {"message"}}`, FastAPI's `{"detail"}`, or the text itself."""
    try:
        data = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if data.get("detail"):
            return str(data["detail"])
        if data.get("message"):
            return str(data["message"])
    return str(data)[:500]
