"""A project's audio out of the studio: one chapter or the whole book as WAV, FLAC or MP3, the book as an
M4B audiobook (AAC in MP4 with a chapter marker at each chapter's first sample, title, author and cover),
or a ZIP of chapter MP3s with a manifest of the recipes that made them; the ACX preset (`acx`: one 192 kbps CBR
MP3 at 44.1 kHz per chapter with room tone, levelled for Audible, studio/audio/acx.py) in a ZIP with each chapter's
ACX report; and, for any other format, each chapter levelled to a loudness target (`loudness=`,
studio/audio/loudness.py).

Every export is a generator of bytes, so the HTTP API and the page stream it without holding a book in
memory: chapters are read a block at a time from `ChapterAudio.blocks()` and fed to ffmpeg's stdin. MP3
and MP4 need to seek back into their output (the Xing header with the exact length; the MP4 index, moved
to the front so a player can start before the download ends), so ffmpeg writes a temporary file that is
then read back in chunks and removed, even when the reader stops early. WAV is written in-process (its
length is known up front); FLAC through soundfile into a temporary file, for the same reason as MP3.

Validation happens when an export is asked for, before the first byte, so the API can still answer 400.
A levelled chapter and an ACX chapter are the exceptions to streaming: loudness is measured over the whole
chapter, so that chapter (one at a time, never the book) is in memory while it is made.
"""
from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from urllib.parse import quote

import soundfile as sf

from engine.config import SAMPLE_RATE
from studio.audio import acx
from studio.audio.formats import MIME, FormatError, encoder_args, pcm_input_command, to_pcm16
from studio.audio.loudness import DEFAULT_CEILING, check_ceiling, normalize, resolve_target
from studio.projects.types import BookMeta, ChapterAudio

CHUNK = 256 * 1024  # bytes per piece of a streamed export
M4B_ARGS = ["-c:a", "aac", "-b:a", "64k"]  # mono speech at 24 kHz: 64k is transparent enough for a book
MEDIA_TYPES = {**{fmt: MIME[fmt] for fmt in ("wav", "flac", "mp3")}, "m4b": "audio/mp4", "zip": "application/zip",
               "acx": "application/zip"}
EXPORT_FORMATS = tuple(MEDIA_TYPES)
COVER_SUFFIX = {"image/jpeg": ".jpg", "image/png": ".png"}  # what MP4's cover atom can hold
WAV_MAX_SAMPLES = (2**32 - 1 - 36) // 2  # RIFF sizes are 32-bit: ~24.8 h of 16-bit mono at 24 kHz


class ExportError(ValueError):
    """An export that cannot be made: no chapters, a chapter without audio, an unknown format, ffmpeg failed."""


@dataclass(frozen=True)
class Export:
    """A download: its file name, media type and body (bytes, streamed)."""
    filename: str
    media_type: str
    body: Iterator[bytes]

    def headers(self) -> dict[str, str]:
        """The download's Content-Disposition: an ASCII name for old clients, the exact one in RFC 5987 form."""
        ascii_name = self.filename.encode("ascii", "replace").decode().replace("?", "_").replace('"', "")
        return {"Content-Disposition": f'attachment; filename="{ascii_name}"; '
                                       f"filename*=UTF-8''{quote(self.filename)}"}


def export(chapters: Sequence[ChapterAudio], meta: BookMeta, fmt: str, *, chapter: int | None = None,
           workdir: str | None = None, loudness=None, true_peak: float = DEFAULT_CEILING) -> Export:
    """The download for `fmt` (one of EXPORT_FORMATS). `chapter` (an index into `chapters`) picks one chapter
    for wav / flac / mp3 / acx; without it they hold the whole book in one file. m4b and zip are always the book.
    `loudness` (a target of studio/audio/loudness.py: a name, LUFS, or None / "off") levels each chapter to it under
    `true_peak` dBTP. Temporary files go to `workdir` (the system's temp folder by default)."""
    fmt = _format(fmt)
    check_chapters(chapters)
    chapters = levelled(chapters, fmt, loudness, true_peak)
    if chapter is not None:
        if fmt in ("m4b", "zip"):
            raise ExportError(f"A {fmt} holds the whole book; ask for wav, flac, mp3 or acx for one chapter.")
        if not 0 <= chapter < len(chapters):
            raise ExportError(f"There is no chapter {chapter}: the book has chapters 0 to {len(chapters) - 1}.")
        return chapter_export(chapters[chapter], meta, fmt, chapter, len(chapters), workdir=workdir)
    if fmt == "acx":
        return Export(f"{_safe_name(meta.title) or 'book'} (ACX).zip", MEDIA_TYPES[fmt], acx_zip(chapters, meta))
    name = f"{_safe_name(meta.title) or 'book'}.{fmt}"
    if fmt == "m4b":
        return Export(name, MEDIA_TYPES[fmt], m4b(chapters, meta, workdir=workdir))
    if fmt == "zip":
        return Export(name, MEDIA_TYPES[fmt], mp3_zip(chapters, meta, workdir=workdir))
    return Export(name, MEDIA_TYPES[fmt], _one_file(chapters, fmt, _chapter_tags(meta, meta.title, None, 0), workdir))


def chapter_export(audio: ChapterAudio, meta: BookMeta, fmt: str, index: int, count: int, *,
                   workdir: str | None = None) -> Export:
    """Chapter `index` (of `count`) alone as wav / flac / mp3 (or the ACX preset's MP3), named and tagged as that
    chapter of the book; for a caller that reads only the chapter it sends."""
    fmt = _format(fmt)
    if fmt not in ("wav", "flac", "mp3", "acx"):
        raise ExportError(f"One chapter is exported as wav, flac, mp3 or acx, not {fmt}.")
    check_chapters([audio])
    stem = f"{_safe_name(meta.title) or 'book'} - {index + 1:02d} {_safe_name(audio.title)}".rstrip()
    if fmt == "acx":
        return Export(f"{stem}.mp3", MEDIA_TYPES["mp3"], iter([acx_chapter(audio).data]))
    tags = _chapter_tags(meta, audio.title, index, count)
    return Export(f"{stem}.{fmt}", MEDIA_TYPES[fmt], _one_file([audio], fmt, tags, workdir))


def _format(fmt: str) -> str:
    fmt = (fmt or "").lower()
    if fmt not in MEDIA_TYPES:
        raise ExportError(f"Unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    return fmt


def _one_file(chapters: Sequence[ChapterAudio], fmt: str, tags: dict[str, str], workdir: str | None) -> Iterator[bytes]:
    if fmt == "wav":
        return wav(chapters)
    if fmt == "flac":
        return flac(chapters, workdir=workdir)
    return mp3(chapters, tags, workdir=workdir)


def levelled(chapters: Sequence[ChapterAudio], fmt: str, loudness, true_peak: float = DEFAULT_CEILING
             ) -> list[ChapterAudio]:
    """The chapters, each normalised to `loudness` (studio/audio/loudness.py `normalize`: the gain to the target, a
    limiter under `true_peak`) when their blocks are read; unchanged without a target. The ACX preset sets
    its own levels, so it takes none."""
    try:
        target, ceiling = resolve_target(loudness), check_ceiling(true_peak)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    if target is None:
        return list(chapters)
    if fmt == "acx":
        raise ExportError("The ACX preset levels each chapter to ACX's own range; leave `loudness` out.")

    def level(ch: ChapterAudio) -> ChapterAudio:
        def blocks() -> Iterator:  # loudness is a property of the whole chapter: it is read whole, once per read
            yield normalize(ch.whole(), SAMPLE_RATE, target, ceiling).audio
        return ChapterAudio(ch.title, ch.samples, blocks, {**ch.recipe, "loudness": {"target_lufs": target,
                                                                                    "true_peak_dbtp": ceiling}},
                            ch.spans)
    return [level(ch) for ch in chapters]


def check_chapters(chapters: Sequence[ChapterAudio]) -> None:
    """Refuse a book an export cannot be made of, with the sentence that says what to do."""
    if not chapters:
        raise ExportError("The book has no chapters to export; add text and render it first.")
    for i, ch in enumerate(chapters):
        if ch.samples <= 0:
            raise ExportError(f"Chapter {i + 1} ({ch.title!r}) has no audio yet; render it (or skip it) first.")


def chapter_offsets(chapters: Sequence[ChapterAudio]) -> list[int]:
    """Where each chapter starts in the book, in samples, and the book's length as the last entry."""
    offsets = [0]
    for ch in chapters:
        offsets.append(offsets[-1] + ch.samples)
    return offsets


# --- the formats ---

def wav(chapters: Sequence[ChapterAudio]) -> Iterator[bytes]:
    """16-bit mono WAV of the chapters one after another, header first (the length is known)."""
    check_chapters(chapters)
    total = chapter_offsets(chapters)[-1]
    if total > WAV_MAX_SAMPLES:
        raise ExportError(f"{total / SAMPLE_RATE / 3600:.1f} h is too long for one WAV file (at most "
                          f"{WAV_MAX_SAMPLES / SAMPLE_RATE / 3600:.1f} h); export FLAC, MP3 or M4B instead.")

    def body() -> Iterator[bytes]:
        yield _wav_header(total)
        yield from _pcm(chapters)
    return body()


def flac(chapters: Sequence[ChapterAudio], *, workdir: str | None = None) -> Iterator[bytes]:
    """16-bit FLAC of the chapters one after another (written to a temporary file, then read back)."""
    check_chapters(chapters)

    def body() -> Iterator[bytes]:
        with _temp_path(".flac", workdir) as path:
            with sf.SoundFile(path, "w", SAMPLE_RATE, 1, "PCM_16", format="FLAC") as f:
                for ch in chapters:
                    for block in _checked_blocks(ch):
                        f.write(block)
            yield from _read_back(path)
    return body()


def mp3(chapters: Sequence[ChapterAudio], tags: dict[str, str] | None = None, *,
        workdir: str | None = None) -> Iterator[bytes]:
    """MP3 (the studio's mp3 settings) of the chapters one after another, with a Xing header and ID3 `tags`."""
    check_chapters(chapters)
    args = [*_metadata_args(tags or {}), *encoder_args("mp3")]

    def body() -> Iterator[bytes]:
        with _ffmpeg_file(chapters, args, ".mp3", workdir) as path:
            yield from _read_back(path)
    return body()


def m4b(chapters: Sequence[ChapterAudio], meta: BookMeta, *, workdir: str | None = None) -> Iterator[bytes]:
    """The book as an M4B: AAC in MP4 at 24 kHz, a chapter marker at each chapter's first sample (FFMETADATA
    chapters in a 1/24000 timebase, so no offset is rounded before ffmpeg writes it), tags, and the cover as
    an attached picture. ffmpeg's index is moved to the front of the file (`+faststart`)."""
    check_chapters(chapters)
    cover_suffix = None
    if meta.cover:
        cover_suffix = COVER_SUFFIX.get(meta.cover_type)
        if cover_suffix is None:
            raise ExportError(f"An M4B cover must be JPEG or PNG, not {meta.cover_type!r}.")

    def body() -> Iterator[bytes]:
        with ExitStack() as temps:
            meta_path = temps.enter_context(_temp_path(".ffmeta", workdir))
            with open(meta_path, "w", encoding="utf-8") as f:
                f.write(ffmetadata(chapters, meta))
            inputs = ["-i", meta_path]
            maps = ["-map", "0:a", "-map_metadata", "1", "-map_chapters", "1"]
            if cover_suffix:
                cover_path = temps.enter_context(_temp_path(cover_suffix, workdir))
                with open(cover_path, "wb") as f:
                    f.write(meta.cover)
                inputs += ["-i", cover_path]
                maps += ["-map", "2:v", "-c:v", "copy", "-disposition:v:0", "attached_pic"]
            args = [*inputs, *maps, *M4B_ARGS, "-movflags", "+faststart", "-f", "ipod"]
            path = temps.enter_context(_ffmpeg_file(chapters, args, ".m4b", workdir))
            yield from _read_back(path)
    return body()


def mp3_zip(chapters: Sequence[ChapterAudio], meta: BookMeta, *, workdir: str | None = None) -> Iterator[bytes]:
    """A ZIP of one MP3 per chapter and `manifest.json` (the book's tags, and per chapter its file, length
    and recipe). The ZIP is written to a stream that cannot seek (each entry with a data descriptor), so
    its pieces leave as soon as they are written; the MP3s are stored, not deflated (they do not shrink)."""
    check_chapters(chapters)
    names = [f"{i + 1:02d} {_safe_name(ch.title)}".rstrip() + ".mp3" for i, ch in enumerate(chapters)]

    def body() -> Iterator[bytes]:
        sink = _Sink()
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zf:
            for i, (ch, name) in enumerate(zip(chapters, names)):
                tags = _chapter_tags(meta, ch.title, i, len(chapters))
                with zf.open(name, "w") as entry:
                    for piece in mp3([ch], tags, workdir=workdir):
                        entry.write(piece)
                        yield sink.take()
            zf.writestr("manifest.json", json.dumps(manifest(chapters, meta, names), indent=2, ensure_ascii=False),
                        compress_type=zipfile.ZIP_DEFLATED)
        yield sink.take()
    return body()


def acx_chapter(ch: ChapterAudio) -> acx.Export:
    """One chapter through the ACX preset (studio/audio/acx.py): room tone at the head and tail, levelled, 192 kbps
    CBR MP3 at 44.1 kHz, and the ACX report of what was encoded."""
    try:
        return acx.export(ch.whole(), SAMPLE_RATE, "acx")
    except FormatError as exc:
        raise ExportError(str(exc)) from None
    except ValueError as exc:  # a silent chapter
        raise ExportError(f"Chapter {ch.title!r}: {exc}") from None


def acx_zip(chapters: Sequence[ChapterAudio], meta: BookMeta) -> Iterator[bytes]:
    """ACX's delivery: one MP3 per chapter (the preset's), stored in a ZIP written as it goes, and
    `manifest.json` with each chapter's recipe and the ACX report of its file."""
    check_chapters(chapters)
    names = [f"{i + 1:02d} {_safe_name(ch.title)}".rstrip() + ".mp3" for i, ch in enumerate(chapters)]

    def body() -> Iterator[bytes]:
        sink, reports = _Sink(), []
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as zf:
            for ch, name in zip(chapters, names):
                made = acx_chapter(ch)  # trimmed, with room tone: its file's length is not the chapter's
                reports.append({**made.report.as_dict(), "file_seconds": round(made.audio.size / SAMPLE_RATE, 3)})
                zf.writestr(name, made.data)
                yield sink.take()
            listing = manifest(chapters, meta, names)
            listing["preset"] = "acx"
            for entry, report in zip(listing["chapters"], reports):
                entry["acx"] = report
            zf.writestr("manifest.json", json.dumps(listing, indent=2, ensure_ascii=False),
                        compress_type=zipfile.ZIP_DEFLATED)
        yield sink.take()
    return body()


def manifest(chapters: Sequence[ChapterAudio], meta: BookMeta, files: Sequence[str]) -> dict:
    """What the ZIP says about itself: enough to know which text, voice, settings and seeds made each file."""
    offsets = chapter_offsets(chapters)
    return {
        "title": meta.title, "author": meta.author, "language": meta.language, **meta.extra,
        "sample_rate": SAMPLE_RATE,
        "chapters": [{"index": i, "title": ch.title, "file": files[i], "start_sample": offsets[i],
                      "samples": ch.samples, "seconds": round(ch.samples / SAMPLE_RATE, 3), "recipe": ch.recipe}
                     for i, ch in enumerate(chapters)],
    }


def ffmetadata(chapters: Sequence[ChapterAudio], meta: BookMeta) -> str:
    """ffmpeg's metadata file for the M4B: book tags, then one [CHAPTER] per chapter in samples."""
    lines = [";FFMETADATA1"]
    lines += [f"{key}={_escape(value)}" for key, value in _book_tags(meta).items()]
    offsets = chapter_offsets(chapters)
    for i, ch in enumerate(chapters):
        lines += ["[CHAPTER]", f"TIMEBASE=1/{SAMPLE_RATE}", f"START={offsets[i]}", f"END={offsets[i + 1]}",
                  f"title={_escape(ch.title or f'Chapter {i + 1}')}"]
    return "\n".join(lines) + "\n"


# --- tags ---

# BookMeta.extra keys that MP4 / ID3 have a tag for (the audiobook convention: the narrator as composer).
_EXTRA_TAGS = {"narrator": "composer", "year": "date", "publisher": "copyright", "description": "description"}


def _book_tags(meta: BookMeta) -> dict[str, str]:
    tags = {"title": meta.title, "album": meta.title, "artist": meta.author, "album_artist": meta.author,
            "genre": "Audiobook"}
    for key, tag in _EXTRA_TAGS.items():
        if meta.extra.get(key):
            tags[tag] = str(meta.extra[key])
    if meta.extra.get("isbn"):
        tags["comment"] = f"ISBN {meta.extra['isbn']}"
    return {k: v for k, v in tags.items() if v}


def _chapter_tags(meta: BookMeta, title: str, index: int | None, count: int) -> dict[str, str]:
    tags = _book_tags(meta) | {"title": title or meta.title}
    if index is not None:
        tags["track"] = f"{index + 1}/{count}"
    return tags


def _metadata_args(tags: dict[str, str]) -> list[str]:
    return [arg for key, value in tags.items() for arg in ("-metadata", f"{key}={value}")]


def _escape(value: str) -> str:
    """FFMETADATA's escaping: '=', ';', '#', '\\' and newlines take a backslash."""
    return re.sub(r"([=;#\\\n])", r"\\\1", str(value))


def _safe_name(title: str) -> str:
    """A file name piece from a title: letters, digits, spaces, '-', '_' and '.', at most 60 characters."""
    return re.sub(r"[^\w .-]+", "", title or "", flags=re.UNICODE).strip(" .")[:60].strip()


# --- streaming machinery ---

def _checked_blocks(ch: ChapterAudio) -> Iterator:
    """The chapter's blocks as int16, checked to add up to `samples` (the chapter markers depend on it)."""
    n = 0
    for block in ch.blocks():
        pcm = to_pcm16(block)
        n += len(pcm)
        yield pcm
    if n != ch.samples:
        raise ExportError(f"Chapter {ch.title!r} should have {ch.samples} samples but its audio has {n}; "
                          f"render it again.")


def _pcm(chapters: Sequence[ChapterAudio]) -> Iterator[bytes]:
    for ch in chapters:
        for pcm in _checked_blocks(ch):
            yield pcm.tobytes()


def _wav_header(samples: int) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
    data = samples * 2
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + data) + b"WAVE" + b"fmt " + struct.pack("<I", len(fmt))
            + fmt + b"data" + struct.pack("<I", data))


@contextmanager
def _temp_path(suffix: str, workdir: str | None) -> Iterator[str]:
    fd, path = tempfile.mkstemp(prefix="higgs-export-", suffix=suffix, dir=workdir)
    os.close(fd)
    try:
        yield path
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@contextmanager
def _ffmpeg_file(chapters: Sequence[ChapterAudio], args: list[str], suffix: str,
                 workdir: str | None) -> Iterator[str]:
    """Run ffmpeg with the chapters' PCM on stdin and `args` (further inputs, then output options) into a
    temporary file; give its path while the caller reads it; remove it afterwards, whatever happened."""
    with _temp_path(suffix, workdir) as path, tempfile.TemporaryFile() as err:
        try:
            cmd = [*pcm_input_command(SAMPLE_RATE, suffix.lstrip(".")), *args, "-y", path]
        except FormatError as e:
            raise ExportError(str(e)) from None
        # stderr goes to a file, not a pipe: nobody reads it while we write stdin, and a full pipe would stall ffmpeg.
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err)
        try:
            for pcm in _pcm(chapters):
                proc.stdin.write(pcm)
            proc.stdin.close()
            proc.wait()
        except BrokenPipeError:  # ffmpeg stopped early: its message says why
            proc.wait()
        finally:
            if proc.poll() is None:  # the feed raised (a short chapter) or the reader went away
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            message = err.read().decode(errors="replace").strip()
            raise ExportError(f"ffmpeg could not write the {suffix.lstrip('.')} (exit {proc.returncode})"
                              + (f": {message}" if message else "."))
        yield path


def _read_back(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while piece := f.read(CHUNK):
            yield piece


class _Sink(io.RawIOBase):
    """An output stream that cannot seek and keeps what was written until `take()`: what lets zipfile
    write a ZIP in pieces."""

    def __init__(self):
        super().__init__()
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data
