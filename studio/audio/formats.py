"""Encode a float32 mono waveform into the response formats of the OpenAI speech API.

wav / pcm / flac are written in-process (soundfile, numpy); mp3 / opus / aac go through an `ffmpeg`
subprocess, because no pure-Python encoder for them is dependable. `StreamEncoder` encodes a take that is
still being generated (mp3 / opus / aac through one long-lived ffmpeg per response), so a streaming
client hears the first words before the last are generated. `pcm` is raw 16-bit little-endian
mono with no header: callers that stream it must send the sample rate beside it (PRODUCT §6: a
headerless stream saved as `.wav` is the most common "the output is broken" report).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import threading

import numpy as np
import soundfile as sf

MIME = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
FORMATS = tuple(MIME)
FFMPEG_FORMATS = ("mp3", "opus", "aac")

# ffmpeg output options per format: codec, container, bitrate. Opus runs at 24 kHz natively (one of its
# five legal rates), so no resampling happens; the ADTS container makes raw AAC playable and streamable.
_FFMPEG_ARGS = {
    "mp3": ["-c:a", "libmp3lame", "-b:a", "128k", "-f", "mp3"],
    "opus": ["-c:a", "libopus", "-b:a", "48k", "-f", "ogg"],
    "aac": ["-c:a", "aac", "-b:a", "96k", "-f", "adts"],
}


# What the streaming encoder adds to those. `-flush_packets 1` makes ffmpeg write each packet as soon as it
# is muxed (by default it holds output in a 32 KiB I/O buffer: ~2 s of 128k mp3). mp3 without a Xing/LAME
# header: ffmpeg writes that header first and seeks back at the end to fill it in, which a pipe cannot do.
# Ogg's muxer holds up to a second of packets per page unless told otherwise; 20 ms pages = one Opus packet.
# flac is not streamed: a FLAC written to a pipe cannot go back to fill in its length, and libsndfile
# (soundfile) then refuses to read it at all ("Internal psf_fseek() failed"), so flac stays a whole body.
_STREAM_ARGS = {
    "mp3": ["-write_xing", "0"],
    "opus": ["-page_duration", "20000"],
    "aac": [],
}
STREAM_FORMATS = tuple(_STREAM_ARGS)


class FormatError(ValueError):
    """An unknown format, or one that needs ffmpeg where ffmpeg is missing."""


def ffmpeg_path() -> str | None:
    return shutil.which("ffmpeg")


def available_formats() -> tuple[str, ...]:
    """The formats this machine can encode right now (ffmpeg ones only when ffmpeg is on PATH)."""
    have_ffmpeg = ffmpeg_path() is not None
    return tuple(f for f in FORMATS if have_ffmpeg or f not in FFMPEG_FORMATS)


def to_pcm16(wav: np.ndarray) -> np.ndarray:
    """Clip to [-1, 1] and quantise to int16 (round to nearest, so silence stays exactly zero)."""
    wav = np.asarray(wav, dtype=np.float32).reshape(-1)
    return np.round(np.clip(wav, -1.0, 1.0) * 32767.0).astype("<i2")


def encode_audio(wav: np.ndarray, sample_rate: int, fmt: str = "wav") -> tuple[bytes, str]:
    """Return `(data, mime_type)` for `wav` (float32 mono, any length including zero) in `fmt`."""
    fmt = (fmt or "wav").lower()
    if fmt not in MIME:
        raise FormatError(f"Unknown audio format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    pcm = to_pcm16(wav)
    if fmt == "pcm":
        return pcm.tobytes(), MIME[fmt]
    if fmt in ("wav", "flac"):
        buf = io.BytesIO()
        sf.write(buf, pcm, sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buf.getvalue(), MIME[fmt]
    return _ffmpeg_encode(pcm, sample_rate, fmt), MIME[fmt]


def pcm_input_command(sample_rate: int, fmt: str = "audio") -> list[str]:
    """An ffmpeg command line up to its first input: 16-bit mono PCM at `sample_rate` on stdin. Callers add
    any further inputs, then the output options. `fmt` names what is being encoded in the error."""
    exe = ffmpeg_path()
    if exe is None:
        raise FormatError(
            f"Encoding {fmt} needs ffmpeg, which is not on PATH. Install it (e.g. `apt-get install ffmpeg`) "
            f"or ask for wav, flac or pcm."
        )
    # The input is raw PCM of a known layout: nothing to probe. With ffmpeg's default probing, PCM fed as fast as
    # it would take it gave the first encoded bytes only after ~50 frames of input; with these, after ~20.
    return [exe, "-hide_banner", "-loglevel", "error", "-probesize", "32", "-analyzeduration", "0",
            "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0"]


def encoder_args(fmt: str) -> list[str]:
    """ffmpeg's output options (codec, bitrate, container) for one of FFMPEG_FORMATS."""
    return list(_FFMPEG_ARGS[fmt])


def _ffmpeg_command(fmt: str, sample_rate: int, extra: list[str]) -> list[str]:
    return [*pcm_input_command(sample_rate, fmt), *_FFMPEG_ARGS[fmt], *extra, "pipe:1"]


def _ffmpeg_encode(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    cmd = _ffmpeg_command(fmt, sample_rate, [])
    proc = subprocess.run(cmd, input=pcm.tobytes(), capture_output=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise FormatError(f"ffmpeg could not encode {fmt}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


class StreamEncoder:
    """One ffmpeg process that encodes a growing 16-bit mono PCM stream into `fmt` (mp3, opus, aac).

    `feed(pcm16)` writes samples and returns the encoded bytes ffmpeg has produced so far (often b"" for the
    first calls: the encoders hold a few frames of lookahead); `close()` ends the input and returns the rest;
    `kill()` stops and reaps the process, and is safe to call at any time and more than once. Calls
    block (pipe writes, the final drain), so async code runs them in a worker thread. A reader thread
    drains stdout while `feed` writes stdin: without it, ffmpeg would stall on a full stdout pipe while we
    stall on a full stdin pipe. An ffmpeg that fails raises `FormatError` from `feed` or `close`.

    The streams need no seeking. Decoded with ffmpeg, n samples come back as (measured, 1 to 400 frames of
    960 samples): opus exactly n (Ogg's pre-skip and end granule trim the codec's padding); mp3 n + 1152 to
    1536 (without a Xing/LAME header the decoder cannot drop the encoder delay and padding); aac n + 1024 to
    1984 (ADTS carries no priming info either).
    """

    def __init__(self, fmt: str, sample_rate: int):
        if fmt not in _STREAM_ARGS:
            raise FormatError(f"{fmt!r} is not a streamed format; choose one of {', '.join(STREAM_FORMATS)}.")
        self.fmt = fmt
        cmd = _ffmpeg_command(fmt, sample_rate, ["-flush_packets", "1", *_STREAM_ARGS[fmt]])
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._lock = threading.Lock()
        self._out = bytearray()
        self._err = bytearray()
        self._readers = [threading.Thread(target=self._drain, args=(pipe, buf), daemon=True)
                         for pipe, buf in ((self._proc.stdout, self._out), (self._proc.stderr, self._err))]
        for t in self._readers:
            t.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _drain(self, pipe, buf: bytearray) -> None:
        while data := pipe.read1(65536):
            with self._lock:
                buf.extend(data)

    def _take(self) -> bytes:
        with self._lock:
            data = bytes(self._out)
            self._out.clear()
        return data

    def _failed(self) -> FormatError:
        self.kill()
        with self._lock:
            err = self._err.decode(errors="replace").strip()
        return FormatError(f"ffmpeg stopped while encoding {self.fmt} (exit {self._proc.returncode})"
                           + (f": {err}" if err else "."))

    def feed(self, pcm16: bytes) -> bytes:
        try:
            self._proc.stdin.write(pcm16)
            self._proc.stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError: ffmpeg is gone; ValueError: stdin closed by kill()
            raise self._failed() from None
        return self._take()

    def close(self, timeout: float = 60.0) -> bytes:
        try:
            self._proc.stdin.close()
        except OSError:  # ffmpeg already gone: wait() below reports how
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise self._failed() from None
        for t in self._readers:
            t.join()
        if self._proc.returncode != 0:
            raise self._failed()
        return self._take()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()  # reaped: no zombie
        for t in self._readers:  # they see end-of-file now that the process is gone
            t.join()
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass


def write_audio(path, wav: np.ndarray, sample_rate: int) -> str:
    """Write `wav` to `path`, the format taken from the suffix; returns the path as a string."""
    path = str(path)
    data, _ = encode_audio(wav, sample_rate, path.rsplit(".", 1)[-1])
    with open(path, "wb") as f:
        f.write(data)
    return path
