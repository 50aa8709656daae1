"""studio.projects.export: the M4B read back with ffprobe has a chapter at each chapter's first sample (within
one AAC frame), the book's tags and its cover; the ZIP holds one MP3 per chapter and a manifest of recipes;
WAV / FLAC are the samples exactly; bad input is refused before the first byte; no temporary file stays."""
from __future__ import annotations

import io
import json
import os
import subprocess
import zipfile

import numpy as np
import pytest
import soundfile as sf

from studio.audio.formats import ffmpeg_path, to_pcm16
from studio.projects.export import ExportError, chapter_offsets, export, ffmetadata
from studio.projects.types import BookMeta, ChapterAudio

SR = 24_000
AAC_FRAME = 1024 / SR
LENGTHS = [SR * 7 // 10 + 123, SR + 77, SR * 4 // 10]  # not multiples of any codec frame

pytestmark = pytest.mark.skipif(ffmpeg_path() is None, reason="ffmpeg not on PATH")


def tone_chapter(title: str, samples: int, freq: float, block: int = 5000, recipe: dict | None = None) -> ChapterAudio:
    wave = (0.4 * np.sin(2 * np.pi * freq * np.arange(samples) / SR)).astype(np.float32)
    return ChapterAudio(title, samples, lambda: (wave[i:i + block] for i in range(0, samples, block)),
                        recipe or {"segments": [{"text": f"{title} text", "seed": 7}]})


def book() -> list[ChapterAudio]:
    return [tone_chapter(f"Chapter {i + 1}: Part={i}", n, 220 * (i + 1)) for i, n in enumerate(LENGTHS)]


def cover_jpeg(tmp_path) -> bytes:
    path = tmp_path / "cover.jpg"
    subprocess.run([ffmpeg_path(), "-loglevel", "error", "-f", "lavfi", "-i", "color=red:s=32x32",
                    "-frames:v", "1", str(path)], check=True, timeout=30)
    data = path.read_bytes()
    path.unlink()
    return data


def ffprobe(path) -> dict:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_chapters", "-show_format", "-show_streams",
                          "-of", "json", str(path)], capture_output=True, check=True, timeout=30).stdout
    return json.loads(out)


def decode(path) -> np.ndarray:
    out = subprocess.run([ffmpeg_path(), "-loglevel", "error", "-i", str(path), "-map", "0:a", "-f", "s16le",
                          "-ac", "1", "-ar", str(SR), "pipe:1"], capture_output=True, check=True, timeout=30).stdout
    return np.frombuffer(out, "<i2")


def save(exp, path) -> list[bytes]:
    pieces = list(exp.body)
    path.write_bytes(b"".join(pieces))
    return pieces


def test_m4b_has_chapters_at_sample_offsets_tags_and_cover(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    meta = BookMeta("A Test; Book", author="Ann Author", cover=cover_jpeg(tmp_path), extra={"narrator": "Nia"})
    exp = export(book(), meta, "m4b", workdir=str(work))
    assert (exp.filename, exp.media_type) == ("A Test Book.m4b", "audio/mp4")
    save(exp, tmp_path / "book.m4b")
    assert list(work.iterdir()) == []  # the temporary MP4, metadata and cover are gone
    # The same samples give the same file, byte for byte: equal renders export equal books.
    assert b"".join(export(book(), meta, "m4b").body) == (tmp_path / "book.m4b").read_bytes()

    info = ffprobe(tmp_path / "book.m4b")
    chapters = info["chapters"]
    assert len(chapters) == 3
    offsets = chapter_offsets(book())
    for i, ch in enumerate(chapters):
        assert abs(float(ch["start_time"]) - offsets[i] / SR) <= AAC_FRAME, (i, ch["start_time"], offsets[i])
        assert abs(float(ch["end_time"]) - offsets[i + 1] / SR) <= AAC_FRAME
        assert ch["tags"]["title"] == f"Chapter {i + 1}: Part={i}"
    tags = info["format"]["tags"]
    assert (tags["title"], tags["artist"], tags["album"], tags["composer"]) == \
        ("A Test; Book", "Ann Author", "A Test; Book", "Nia")
    audio = [s for s in info["streams"] if s["codec_type"] == "audio"]
    assert [(s["codec_name"], s["sample_rate"], s["channels"]) for s in audio] == [("aac", str(SR), 1)]
    covers = [s for s in info["streams"] if s["codec_type"] == "video"]
    assert len(covers) == 1 and covers[0]["disposition"]["attached_pic"] == 1 and covers[0]["codec_name"] == "mjpeg"

    # The audio is the book: its length within codec padding, each chapter's tone where that chapter is.
    back = decode(tmp_path / "book.m4b").astype(np.float32) / 32768
    assert abs(len(back) - offsets[-1]) <= 2048
    for i in range(3):
        mid = back[offsets[i] + 2000:offsets[i + 1] - 2000]
        spectrum = np.abs(np.fft.rfft(mid))
        assert abs(np.argmax(spectrum) * SR / len(mid) - 220 * (i + 1)) < 10


def test_zip_holds_one_mp3_per_chapter_and_the_manifest(tmp_path):
    chapters = book()
    exp = export(chapters, BookMeta("Zip Book", author="Z"), "zip", workdir=str(tmp_path))
    assert exp.media_type == "application/zip"
    data = b"".join(exp.body)
    assert list(tmp_path.iterdir()) == []
    zf = zipfile.ZipFile(io.BytesIO(data))
    assert zf.testzip() is None
    names = zf.namelist()
    mp3s = [n for n in names if n.endswith(".mp3")]
    assert mp3s == ["01 Chapter 1 Part0.mp3", "02 Chapter 2 Part1.mp3", "03 Chapter 3 Part2.mp3"]
    assert set(names) == {*mp3s, "manifest.json"}
    manifest = json.loads(zf.read("manifest.json"))
    assert (manifest["title"], manifest["author"], manifest["sample_rate"]) == ("Zip Book", "Z", SR)
    assert [c["file"] for c in manifest["chapters"]] == mp3s
    assert [c["samples"] for c in manifest["chapters"]] == LENGTHS
    assert [c["start_sample"] for c in manifest["chapters"]] == chapter_offsets(chapters)[:-1]
    assert manifest["chapters"][1]["recipe"] == chapters[1].recipe
    for name, chapter in zip(mp3s, chapters):
        (tmp_path / "x.mp3").write_bytes(zf.read(name))
        form = ffprobe(tmp_path / "x.mp3")["format"]  # the length from the Xing header: the encoder's padding
        assert abs(float(form["duration"]) - chapter.samples / SR) <= 2 * 1152 / SR, name
        assert (form["tags"]["title"], form["tags"]["album"]) == (chapter.title, "Zip Book")
    (tmp_path / "x.mp3").unlink()


def test_wav_and_flac_are_the_samples_exactly(tmp_path):
    chapters = book()
    whole = np.concatenate([to_pcm16(np.concatenate(list(c.blocks()))) for c in chapters])
    exp = export(chapters, BookMeta("B"), "wav", chapter=1)
    assert exp.filename == "B - 02 Chapter 2 Part1.wav"
    back, sr = sf.read(io.BytesIO(b"".join(exp.body)), dtype="int16")
    assert sr == SR and np.array_equal(back, whole[LENGTHS[0]:LENGTHS[0] + LENGTHS[1]])
    exp = export(chapters, BookMeta("B"), "flac", workdir=str(tmp_path))
    back, _ = sf.read(io.BytesIO(b"".join(exp.body)), dtype="int16")
    assert np.array_equal(back, whole)
    assert list(tmp_path.iterdir()) == []


def test_chapter_mp3_has_its_tags(tmp_path):
    exp = export(book(), BookMeta("Tagged", author="Ann"), "mp3", chapter=2)
    save(exp, tmp_path / "c.mp3")
    tags = ffprobe(tmp_path / "c.mp3")["format"]["tags"]
    assert (tags["title"], tags["artist"], tags["album"], tags["track"]) == \
        ("Chapter 3: Part=2", "Ann", "Tagged", "3/3")


def test_bad_input_is_refused_before_the_first_byte():
    meta = BookMeta("B")
    with pytest.raises(ExportError, match="no chapters"):
        export([], meta, "m4b")
    with pytest.raises(ExportError, match=r"Chapter 2 \('Empty'\) has no audio yet"):
        export([book()[0], ChapterAudio("Empty", 0, lambda: iter(()))], meta, "zip")
    with pytest.raises(ExportError, match="Unknown export format 'ogg'"):
        export(book(), meta, "ogg")
    with pytest.raises(ExportError, match="no chapter 5"):
        export(book(), meta, "wav", chapter=5)
    with pytest.raises(ExportError, match="whole book"):
        export(book(), meta, "m4b", chapter=0)
    with pytest.raises(ExportError, match="JPEG or PNG"):
        export(book(), BookMeta("B", cover=b"GIF89a", cover_type="image/gif"), "m4b")


def test_audio_shorter_than_its_length_fails_and_cleans_up(tmp_path):
    short = ChapterAudio("Short", 5000, lambda: iter([np.zeros(3000, np.float32)]))
    for fmt in ("m4b", "mp3", "flac"):
        exp = export([short], BookMeta("B"), fmt, workdir=str(tmp_path))
        with pytest.raises(ExportError, match="should have 5000 samples but its audio has 3000"):
            b"".join(exp.body)
        assert list(tmp_path.iterdir()) == [], fmt


def test_a_reader_that_stops_early_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setattr("studio.projects.export.CHUNK", 1024)
    body = export(book(), BookMeta("B"), "m4b", workdir=str(tmp_path)).body
    first = next(body)
    assert first[4:8] == b"ftyp" and len(first) == 1024
    assert len(os.listdir(tmp_path)) == 2  # the MP4 being read, the metadata file
    body.close()
    assert list(tmp_path.iterdir()) == []


def test_ffmetadata_escapes_and_counts_in_samples():
    text = ffmetadata(book()[:2], BookMeta("T=1;#x", author="A\\B"))
    assert "title=T\\=1\\;\\#x" in text and "artist=A\\\\B" in text
    assert f"TIMEBASE=1/{SR}\nSTART={LENGTHS[0]}\nEND={LENGTHS[0] + LENGTHS[1]}" in text


def test_the_download_name_is_safe_and_exact():
    exp = export(book()[:1], BookMeta('Café "Book"/../x'), "wav")
    assert exp.filename == "Café Book..x.wav"
    assert exp.headers() == {"Content-Disposition": "attachment; filename=\"Caf_ Book..x.wav\"; "
                                                    "filename*=UTF-8''Caf%C3%A9%20Book..x.wav"}
