"""What travels between the remote client and a speech server: reference clips and voice listings, raw
16-bit PCM and server-sent events, error bodies, and URLs safe to show."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
import soundfile as sf

MAX_CLIP_BYTES = 10 * 1024 * 1024  # what the servers accept for a reference clip


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


def clip_bytes(audio, sample_rate: int | None) -> tuple[bytes, str]:
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
    return wav_bytes(np.asarray(audio), int(sample_rate)), "clip.wav"


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
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



def sse_events(lines: Iterator[str]) -> Iterator[tuple[str | None, Any]]:
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


def from_pcm16(data: bytes) -> np.ndarray:
    """PCM16 little-endian → float32; /32767 undoes studio.audio.formats.to_pcm16's ×32767 exactly."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767.0


def strip_wav_header(data: bytes) -> bytes:
    """A WAV piece → its PCM: the first piece of a streamed WAV carries the header, later ones none."""
    if data[:4] != b"RIFF":
        return data
    at = data.find(b"data", 12)
    return data[at + 8:] if at >= 0 else b""


def error_message(response: httpx.Response) -> str:
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
