"""`RemoteEngine`: the engine's streaming interface over HTTP, for a studio that drives a speech server
instead of a local checkpoint (another Higgs Studio, SGLang-Omni, vLLM-Omni, Boson's hosted API).

    engine = RemoteEngine("http://gpu-box:8000", api_key=None)
    for chunk in engine.generate_stream("Hello.", temperature=0, seed=7):   # engine.types.Chunk
        play(chunk.audio)                                                    # float32 mono 24 kHz
    chunk.metrics.ttfa_ms, chunk.metrics.rtf                                 # measured here, at the client

What differs between servers, and how this module absorbs it (PRODUCT §3, §5.2):
* Streaming: everyone streams raw 16-bit PCM for `response_format="pcm"` with `stream: true` (SGLang-Omni,
  Boson; ours streams pcm always). A server that cannot stream answers with one body, which reads the
  same way, only later; one that refuses `stream` outright is retried once without it.
* Style: the Higgs prompt has no instruction slot and the Higgs paths of SGLang-Omni and vLLM-Omni ignore
  `instructions`, so a style is sent the only way every server honours: as inline tags leading `input`.
* Cloning: a clip becomes `ref_audio` (a base64 data URL) + `ref_text`, the fields all of them read.
* Voice lists come in four shapes (ours, OpenAI/Boson, vLLM-/SGLang-Omni, Chatterbox); `list_voices`
  reads them all into `RemoteVoiceInfo`.
No studio imports: the studio's service drives this exactly as it drives a local `Engine`.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import soundfile as sf

from .config import SAMPLE_RATE, SAMPLES_PER_FRAME
from .types import DEFAULT_REPEAT_GUARD, Chunk, Metrics, SamplingParams

DEFAULT_MODEL = "higgs-audio-v3-tts"
# A take streams in pieces of at least this many samples (one codec frame, 40 ms): small enough to keep
# time-to-first-audio honest, large enough not to hand the player one network read at a time.
MIN_CHUNK_SAMPLES = SAMPLES_PER_FRAME
MAX_CLIP_BYTES = 10 * 1024 * 1024  # what the servers accept for a reference clip


class RemoteError(RuntimeError):
    """The server could not be reached or refused the request; `status` is its HTTP status (None when it
    could not be reached) and the message says what it answered."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


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
    """Any of the four voices-list shapes → voices, built-ins first, without duplicates.

    ours / Kokoro / Open WebUI: `{"voices": [{"id", "name", ...}]}`;
    OpenAI / Boson:            `{"object": "list", "data": [{"id" | "voice", "name"?, ...}]}`;
    vLLM-Omni / SGLang-Omni:   `{"voices": ["default", ...], "uploaded_voices": [{"name", ...}]}`;
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
    out: dict[str, RemoteVoiceInfo] = {}
    for where, item in items:
        if isinstance(item, str):
            name = item.rsplit(".", 1)[0] if item.lower().endswith((".wav", ".mp3", ".flac", ".ogg")) else item
            kind = "saved" if where == "uploaded" else "builtin"
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
        if voice.id not in out or where == "uploaded":
            out[voice.id] = voice
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


class RemoteEngine:
    """The `Engine` interface the studio uses (`generate_stream`, `generate`, `encode_voice`, `info`), plus
    the server's voice routes, over HTTP. Thread-safe: one `httpx.Client` with a connection pool."""

    is_remote = True  # no local codec: a saved voice travels as its clip (`encode_voice`), never as codes

    def __init__(self, base_url: str, api_key: str | None = None, model: str = DEFAULT_MODEL, *,
                 timeout: float = 600.0, connect_timeout: float = 10.0, transport: httpx.BaseTransport | None = None):
        base = base_url.strip().rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"remote server URL must start with http:// or https:// (got {redact_url(base_url)!r})")
        if base.endswith("/v1"):
            base = base[:-3]
        self.base_url = base
        self.shown_url = redact_url(base)  # what status panels, /health and error messages may show
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=connect_timeout))
        self._stream_ok = True  # cleared when the server refuses `stream` (then one body per take)
        self._server: dict | None = None
        self.last_headers: dict[str, str] = {}  # the latest speech response's headers (server-side metrics)

    # ---------------------------------------------------------------- facts
    @property
    def info(self) -> dict[str, Any]:
        """What the studio's status panel shows; filled from the server's `/health` when it has one.
        `max_batch` 1: the studio sends one request at a time (the server, not this client, would batch)."""
        server = self.health()
        return {"checkpoint": self.model, "device": self.shown_url, "precision": server.get("precision") or "remote",
                "backend": "remote", "demo": False, "remote": self.shown_url, "max_batch": 1,
                "server_device": server.get("device"), "server_backend": server.get("backend")}

    def health(self) -> dict[str, Any]:
        """The server's `/health` JSON, asked once ({} when it has none, answers something else, or is down)."""
        if self._server is None:
            try:
                r = self._http.get("/health", timeout=5.0)
                data = r.json() if r.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                data = {}
            self._server = data if isinstance(data, dict) else {}
        return self._server

    def close(self) -> None:
        self._http.close()

    # ---------------------------------------------------------------- generation
    def speech_body(self, text: str, *, voice=None, style: str | None = None, temperature: float | None = None,
                    top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                    max_frames: int | None = None, repeat_guard: int | None = DEFAULT_REPEAT_GUARD,
                    response_format: str = "pcm", stream: bool = True) -> dict[str, Any]:
        """The JSON body for `POST /v1/audio/speech`. `style` (a tag prefix) leads the text; `voice` is a
        server-side voice id or name, or a `RemoteVoice` sent as `ref_audio` + `ref_text`."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("there is no text to speak; give a non-empty sentence")
        style = (style or "").strip()
        body: dict[str, Any] = {"model": self.model, "input": f"{style}{text}" if style else text,
                                "response_format": response_format}
        if stream:
            body["stream"] = True
        if isinstance(voice, RemoteVoice):
            body["ref_audio"] = voice.data_url()
            if voice.transcript:
                body["ref_text"] = voice.transcript
        elif isinstance(voice, str) and voice:
            body["voice"] = voice
        elif voice is not None:
            raise ValueError("a remote engine takes a server-side voice name or the RemoteVoice from encode_voice()")
        for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seed", seed),
                            ("max_new_tokens", max_frames)):
            if value is not None:
                body[name] = value
        if repeat_guard != DEFAULT_REPEAT_GUARD:  # our extension; others never see it unless asked for
            body["repeat_guard"] = repeat_guard
        return body

    def generate_stream(self, text: str, *, voice=None, style: str | None = None, temperature: float | None = None,
                        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                        max_frames: int | None = None, repeat_guard: int | None = DEFAULT_REPEAT_GUARD,
                        cancel: threading.Event | None = None, params: SamplingParams | None = None
                        ) -> Iterator[Chunk]:
        """Yield `Chunk`s of float32 24 kHz audio as the server streams 16-bit PCM; the last has
        `final=True`. TTFA and RTF are measured here (request sent → first audio received; wall / audio).
        Closing the generator or setting `cancel` closes the connection, which stops a streaming server.
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

    def _open(self, body: dict) -> httpx.Response:
        if not self._stream_ok:
            body = {k: v for k, v in body.items() if k != "stream"}
        request = self._http.build_request("POST", "/v1/audio/speech", json=body)
        try:
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise RemoteError(f"Could not reach the speech server at {self.shown_url}: {exc}") from None
        if response.status_code >= 400:
            response.read()
            message = _error_message(response)
            response.close()
            refused_stream = response.status_code in (400, 422) and "stream" in message.lower()
            if self._stream_ok and "stream" in body and refused_stream:
                self._stream_ok = False  # this server cannot stream: ask for one body from now on
                return self._open(body)
            raise RemoteError(f"The speech server answered {response.status_code}: {message}", response.status_code)
        return response

    def _stream(self, body: dict, seed: int | None, cancel: threading.Event | None) -> Iterator[Chunk]:
        started = time.perf_counter()
        response = self._open(body)
        self.last_headers = dict(response.headers)
        rate = int(response.headers.get("x-sample-rate") or SAMPLE_RATE)
        if rate != SAMPLE_RATE:
            response.close()
            raise RemoteError(f"The server sends {rate} Hz audio; the studio plays {SAMPLE_RATE} Hz. "
                              f"Configure the server for 24 kHz output.")
        if "wav" in response.headers.get("content-type", ""):
            response.close()
            raise RemoteError("The server answered WAV where 16-bit PCM was asked for (response_format=pcm).")
        server_seed = response.headers.get("x-seed")
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
        reason = None
        try:
            for data in response.iter_bytes():
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                pending += data
                usable = len(pending) // 2 * 2
                if usable // 2 < MIN_CHUNK_SAMPLES:
                    continue
                audio = np.frombuffer(pending[:usable], dtype="<i2").astype(np.float32) / 32767.0
                pending = pending[usable:]
                state["samples"] += len(audio)
                if state["ttfa"] is None:
                    state["ttfa"] = 1e3 * (time.perf_counter() - started)
                yield Chunk(audio=audio, metrics=metrics(), final=False)
        except httpx.HTTPError as exc:
            raise RemoteError(f"The speech stream from {self.shown_url} broke off: {exc}") from None
        finally:
            response.close()
        tail = np.frombuffer(pending[:len(pending) // 2 * 2], dtype="<i2").astype(np.float32) / 32767.0
        state["samples"] += len(tail)
        if state["ttfa"] is None and len(tail):
            state["ttfa"] = 1e3 * (time.perf_counter() - started)
        reason = reason or response.headers.get("x-stop-reason") or "end"
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
        `consent`, `ref_text`: the fields OpenAI, vLLM-Omni, SGLang-Omni and this studio read)."""
        data, filename = _clip_bytes(audio, sample_rate)
        fields = {"name": name, "consent": consent}
        if ref_text:
            fields["ref_text"] = ref_text
        if speaker_description:
            fields["speaker_description"] = speaker_description
        return self._json("POST", "/v1/audio/voices", data=fields,
                          files={"audio_sample": (filename, data, "application/octet-stream")})

    def delete_voice(self, voice_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/audio/voices/{voice_id}")

    def _json(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteError(f"Could not reach the speech server at {self.shown_url}: {exc}") from None
        if response.status_code >= 400:
            raise RemoteError(f"The speech server answered {response.status_code} to {method} {path}: "
                              f"{_error_message(response)}", response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(f"The speech server answered {method} {path} with something other than JSON.") from None


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
