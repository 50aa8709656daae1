"""Voice library: content-addressed voices with consent, atomic storage, hostile-zip-proof import."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import studio.voices.bundles as bundles_mod
import studio.voices.store as store_mod
from engine.audio import ReferenceAudioError
from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.voices import (
    ENTRY_LIMITS,
    Consent,
    VoiceError,
    VoiceImportError,
    VoiceLibrary,
    VoiceNotFound,
    default_voices_dir,
)
from tests.helpers import CONSENT, fake_encode, speech_clip

REPO = Path(__file__).resolve().parents[1]
def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (except the lock file) with its sha256: 'the library unchanged'."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != ".lock":
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def lib(tmp_path) -> VoiceLibrary:
    return VoiceLibrary(tmp_path / "voices")


# ---- basics ---------------------------------------------------------------------------------------

def test_add_list_get_rename_delete(lib):
    calls: list[int] = []
    alice = lib.add(speech_clip(), name="Alice", transcript="Hello there, friend.", description="warm alto",
                    style="<|emotion:affection|>", seed=42, consent=CONSENT, encode=fake_encode(calls))
    assert alice.id.startswith("v_") and len(alice.id) == 18
    assert alice.path == lib.root / alice.id
    assert sorted(p.name for p in alice.path.iterdir()) == ["audio.wav", "codes.npy", "voice.json"]
    assert alice.transcript == "Hello there, friend." and alice.seed == 42 and alice.style == "<|emotion:affection|>"
    assert alice.consent.asserted_by == "Test Runner" and alice.consent.statement == "This is my own voice."
    assert alice.consent.at and alice.created

    wav = alice.wav()
    assert wav.dtype == np.float32 and len(wav) == alice.frames * SAMPLES_PER_FRAME
    info = sf.info(alice.audio_path)
    assert (info.samplerate, info.channels, info.subtype) == (SAMPLE_RATE, 1, "PCM_16")
    assert 1.9 <= alice.seconds <= 2.2
    codes = alice.codes()
    assert codes.shape == (alice.frames, 8) and codes.dtype == np.int64
    np.testing.assert_array_equal(codes, fake_encode()(wav))  # the codes of exactly the stored samples
    assert calls == [len(wav)]

    bob = lib.add(speech_clip(pitch=220, seed=1), name="Bob", consent=CONSENT)
    assert not bob.has_codes and bob.codes() is None
    assert [v.name for v in lib.list()] == ["Alice", "Bob"]
    assert lib.get(alice.id) == alice
    assert lib.get("  ALICE ") == alice

    renamed = lib.rename("alice", "Alice Smith")
    assert renamed.id == alice.id and lib.get("alice smith").id == alice.id
    with pytest.raises(VoiceNotFound):
        lib.get("Alice")

    lib.delete("Bob")
    assert [v.name for v in lib.list()] == ["Alice Smith"]
    assert not (lib.root / bob.id).exists()
    with pytest.raises(VoiceNotFound) as info:
        lib.get(bob.id)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "No saved voice" in str(info.value)
    with pytest.raises(VoiceNotFound):
        lib.delete("Bob")


def test_library_is_shared_through_the_disk(lib):
    voice = lib.add(speech_clip(), name="Shared", consent=CONSENT)
    other = VoiceLibrary(lib.root)
    assert other.get("shared") == voice


def test_same_content_dedupes(lib):
    rate, samples = speech_clip()
    first = lib.add((rate, samples), name="One", transcript="Same words.", consent=CONSENT)
    # The same recording from a file, under another name: the same prepared audio + transcript.
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    again = lib.add(buf.getvalue(), name="Two", transcript="  Same   words. ", consent=CONSENT)
    assert again == first and len(lib.list()) == 1
    # Same audio, different transcript: different content, so a different voice.
    other = lib.add((rate, samples), name="Two", transcript="Other words.", consent=CONSENT)
    assert other.id != first.id and len(lib.list()) == 2
    # Dedupe still fills in codes when the caller can encode.
    assert lib.add((rate, samples), name="x", transcript="Same words.", consent=CONSENT,
                   encode=fake_encode()).has_codes


def test_consent_is_required(lib):
    before = snapshot(lib.root)
    with pytest.raises(VoiceError, match="consent"):
        lib.add(speech_clip(), name="NoConsent", consent=None)
    with pytest.raises(VoiceError, match="consent"):
        lib.add(speech_clip(), name="Blank", consent=Consent("   ", "I agree"))
    with pytest.raises(VoiceError, match="consent"):
        lib.add(speech_clip(), name="Blank", consent=Consent("me", ""))
    assert snapshot(lib.root) == before and lib.list() == []


@pytest.mark.parametrize("bad, error", [
    ((16000, np.zeros(16000 * 3, np.int16)), "silent"),
    (speech_clip(0.2), "only 0.2 s"),
    (b"definitely not a recording" * 40, "could not be read as audio"),
], ids=["silence", "too-short", "not-audio"])
def test_bad_audio_stores_nothing(lib, bad, error):
    before = snapshot(lib.root)
    with pytest.raises(ReferenceAudioError, match=error):
        lib.add(bad, name="Bad", consent=CONSENT, encode=fake_encode())
    assert snapshot(lib.root) == before
    assert sorted(p.name for p in lib.root.iterdir()) == [".lock"]


def test_names_are_validated_and_unique(lib):
    alice = lib.add(speech_clip(), name="Alice", consent=CONSENT)
    with pytest.raises(VoiceError, match="already called 'Alice'"):
        lib.add(speech_clip(pitch=200, seed=3), name="alice", consent=CONSENT)
    bob = lib.add(speech_clip(pitch=200, seed=3), name="Bob", consent=CONSENT)
    with pytest.raises(VoiceError, match="already called"):
        lib.rename(bob.id, "ALICE")
    assert lib.rename(alice.id, "alice").name == "alice"  # changing only the case of its own name is fine
    for bad, match in [("", "empty"), ("   \t", "empty"), ("x" * 65, "limit is 64"),
                       ("v_0123456789abcdef", "looks like a voice id"), (None, "empty"), (5, "must be text")]:
        with pytest.raises(VoiceError, match=match):
            lib.add(speech_clip(pitch=300, seed=9), name=bad, consent=CONSENT)
    cleaned = lib.add(speech_clip(pitch=300, seed=9), name="  Tab\tand\x00nul\x1b[31m ", consent=CONSENT)
    assert cleaned.name == "Tab and nul [31m"


def test_hostile_names_never_touch_the_file_system(lib, tmp_path):
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    evil = lib.add(speech_clip(), name="../../etc/passwd", consent=CONSENT)
    also = lib.add(speech_clip(pitch=250, seed=4), name="/tmp/x\\..\\y", consent=CONSENT)
    assert lib.get("../../etc/passwd") == evil and lib.get("/tmp/x\\..\\y") == also
    assert {p.name for p in lib.root.iterdir()} == {".lock", evil.id, also.id}
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before
    lib.delete("../../etc/passwd")
    assert [v.name for v in lib.list()] == ["/tmp/x\\..\\y"]


def test_metadata_validation(lib):
    with pytest.raises(VoiceError, match="not a known control tag"):
        lib.add(speech_clip(), name="A", style="<|emotion:happy|>", consent=CONSENT)
    with pytest.raises(VoiceError, match="seed"):
        lib.add(speech_clip(), name="A", seed=-1, consent=CONSENT)
    with pytest.raises(VoiceError, match="seed"):
        lib.add(speech_clip(), name="A", seed=2 ** 63, consent=CONSENT)
    voice = lib.add(speech_clip(), name="A", style=" <|style:whispering|> ", seed=0, consent=CONSENT)
    assert voice.style == "<|style:whispering|>" and voice.seed == 0
    updated = lib.update("a", description="new", style="", seed=None)
    assert (updated.description, updated.style, updated.seed) == ("new", "", None)
    with pytest.raises(VoiceError):
        lib.update("a", seed="7")


def test_transcript_edit_keeps_id_and_codes(lib):
    rate, samples = speech_clip()
    voice = lib.add((rate, samples), name="V", transcript="First take.", consent=CONSENT, encode=fake_encode())
    codes = voice.codes()
    edited = lib.update(voice.id, transcript="First take, corrected.")
    assert edited.id == voice.id and edited.content_hash != voice.content_hash
    np.testing.assert_array_equal(edited.codes(), codes)
    # Re-adding the edited content dedupes to it; the original content is now a different voice, whose
    # short id is taken by the edited one, so it gets a longer prefix of its own hash.
    assert lib.add((rate, samples), name="W", transcript="First take, corrected.", consent=CONSENT) == edited
    original = lib.add((rate, samples), name="W", transcript="First take.", consent=CONSENT)
    assert original.id != voice.id and original.id.startswith(voice.id) and len(original.id) == len(voice.id) + 4
    with pytest.raises(VoiceError, match="already has this audio and transcript"):
        lib.update("W", transcript="First take, corrected.")


def test_codes_are_computed_lazily_once(lib):
    voice = lib.add(speech_clip(), name="Lazy", consent=CONSENT)
    calls: list[int] = []
    codes = lib.ensure_codes("lazy", fake_encode(calls))
    assert calls == [len(voice.wav())] and codes.shape == (voice.frames, 8)
    again = lib.ensure_codes(voice.id, fake_encode(calls))
    assert len(calls) == 1
    np.testing.assert_array_equal(again, codes)
    assert lib.get("lazy").has_codes


@pytest.mark.parametrize("bad_codes, match", [
    (lambda w: np.zeros((len(w) // SAMPLES_PER_FRAME + 1, 8), np.int64), "shape"),
    (lambda w: np.zeros((len(w) // SAMPLES_PER_FRAME, 7), np.int64), "shape"),
    (lambda w: np.full((len(w) // SAMPLES_PER_FRAME, 8), 1024), r"\[0, 1024\)"),
    (lambda w: np.zeros((len(w) // SAMPLES_PER_FRAME, 8), np.float32), "integers"),
], ids=["frames", "codebooks", "range", "dtype"])
def test_bad_encoder_output_stores_nothing(lib, bad_codes, match):
    with pytest.raises(VoiceError, match=match):
        lib.add(speech_clip(), name="Enc", consent=CONSENT, encode=bad_codes)
    assert lib.list() == []
    voice = lib.add(speech_clip(), name="Enc", consent=CONSENT)
    with pytest.raises(VoiceError, match=match):
        lib.ensure_codes(voice.id, bad_codes)
    assert not lib.get(voice.id).has_codes


def test_encoder_that_prepares_again_sees_the_stored_samples(lib):
    """A stored clip sent to another server (`app.py --remote`) is prepared again there; on library audio
    that must be a no-op, or the codes would describe different samples (or a different frame count)
    than audio.wav. (The local engine encodes stored clips with `encode_codes`, no second pass.)"""
    from engine.audio import prepare_reference

    seen = []

    def encode(wav):
        again = prepare_reference((SAMPLE_RATE, wav)).wav
        seen.append(np.array_equal(again, wav))
        return fake_encode()(again)

    voice = lib.add((44100, speech_clip(rate=44100)[1]), name="Twice", consent=CONSENT, encode=encode)
    lazy = lib.add(speech_clip(pitch=230, seed=12), name="Later", consent=CONSENT)
    lib.ensure_codes(lazy.id, encode)
    assert seen == [True, True]
    np.testing.assert_array_equal(voice.codes(), fake_encode()(voice.wav()))


def test_voice_ref_for_the_engine(lib):
    pytest.importorskip("torch")
    prompt = pytest.importorskip("engine.prompt")
    voice = lib.add(speech_clip(), name="Ref", transcript="Hi there.", consent=CONSENT, encode=fake_encode())
    ref = lib.voice_ref("ref", encode=fake_encode())
    assert isinstance(ref, prompt.VoiceRef) and ref.transcript == "Hi there."
    np.testing.assert_array_equal(ref.codes.numpy(), voice.codes())


# ---- export / import ------------------------------------------------------------------------------

def test_export_import_round_trip(lib, tmp_path):
    a = lib.add(speech_clip(), name="Alice", transcript="Hello.", style="<|emotion:relief|>", seed=3, consent=CONSENT,
                encode=fake_encode())
    b = lib.add(speech_clip(pitch=210, seed=2), name="Bob", consent=CONSENT)
    data = lib.export_zip()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == sorted([f"{a.id}/voice.json", f"{a.id}/audio.wav", f"{a.id}/codes.npy",
                                                f"{b.id}/voice.json", f"{b.id}/audio.wav"])
    other = VoiceLibrary(tmp_path / "other")
    imported = other.import_zip(data)
    assert [v.id for v in imported] == sorted([a.id, b.id])
    for original in (a, b):
        copy = other.get(original.id)
        assert copy.name == original.name and copy.transcript == original.transcript
        assert (copy.style, copy.seed, copy.consent, copy.created, copy.content_hash) == \
            (original.style, original.seed, original.consent, original.created, original.content_hash)
        np.testing.assert_array_equal(copy.wav(), original.wav())
    np.testing.assert_array_equal(other.get("alice").codes(), a.codes())
    assert not other.get("bob").has_codes

    # Importing again changes nothing and returns the voices already there.
    before = snapshot(other.root)
    assert {v.id for v in other.import_zip(data)} == {a.id, b.id}
    assert snapshot(other.root) == before
    # Export of a selection, by name or id.
    with zipfile.ZipFile(io.BytesIO(lib.export_zip(["bob"]))) as zf:
        assert sorted(zf.namelist()) == [f"{b.id}/audio.wav", f"{b.id}/voice.json"]


def _bundle(lib: VoiceLibrary) -> dict[str, bytes]:
    """The files of one exported voice, to build hostile variants from."""
    with zipfile.ZipFile(io.BytesIO(lib.export_zip())) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def _zip(entries: dict[str, bytes], *, symlinks: tuple[str, ...] = ()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, blob in entries.items():
            info = zipfile.ZipInfo(name)
            if name in symlinks:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, blob)
    return buf.getvalue()


@pytest.fixture
def source(tmp_path) -> VoiceLibrary:
    src = VoiceLibrary(tmp_path / "source")
    src.add(speech_clip(), name="Alice", transcript="Hello.", consent=CONSENT, encode=fake_encode())
    return src


def _hostile_cases(files: dict[str, bytes]) -> dict[str, tuple[bytes, str]]:
    json_name = next(n for n in files if n.endswith("voice.json"))
    folder = json_name.split("/")[0]
    meta = json.loads(files[json_name])

    def with_meta(**changes):
        edited = {k: v for k, v in {**meta, **changes}.items() if v is not None}
        return _zip({**files, json_name: json.dumps(edited).encode()})

    big_wav = io.BytesIO()
    sf.write(big_wav, np.zeros(ENTRY_LIMITS["audio.wav"] // 2 + SAMPLES_PER_FRAME, np.int16), SAMPLE_RATE,
             format="WAV", subtype="PCM_16")
    return {
        "path traversal": (_zip({**files, "../../evil/voice.json": files[json_name]}), "unsafe path"),
        "traversal inside": (_zip({**files, f"{folder}/../../x.json": b"{}"}), "unsafe path"),
        "absolute path": (_zip({**files, "/etc/cron.d/voice.json": b"{}"}), "unsafe path"),
        "windows path": (_zip({**files, "C:/x/voice.json": b"{}"}), "unsafe path"),
        "backslash path": (_zip({**files, "..\\..\\voice.json": b"{}"}), "unsafe path"),
        "symlink": (_zip({**files, f"{folder}/codes.npy": b"/etc/passwd"}, symlinks=(f"{folder}/codes.npy",)),
                    "symbolic link"),
        "wrong file type": (_zip({**files, f"{folder}/payload.py": b"import os"}), "not part of a voice bundle"),
        "nested folder": (_zip({**files, f"{folder}/sub/voice.json": b"{}"}), "not part of a voice bundle"),
        "oversized file": (_zip({**files, f"{folder}/audio.wav": big_wav.getvalue()}), "limit"),
        "corrupt json": (_zip({**files, json_name: b"{\"name\": \"Alice\", "}), "not valid JSON"),
        "json not an object": (_zip({**files, json_name: b"[1, 2]"}), "JSON object"),
        "no consent": (with_meta(consent=None), "consent"),
        "bad style": (with_meta(style="<|emotion:happy|>"), "not a known control tag"),
        "tampered transcript": (with_meta(transcript="Something else."), "content hash"),
        "audio not audio": (_zip({**files, f"{folder}/audio.wav": b"RIFF nonsense"}), "not readable audio"),
        "codes not numpy": (_zip({**files, f"{folder}/codes.npy": b"\x93NUMPY garbage"}), "codes.npy"),
        "missing audio": (_zip({json_name: files[json_name]}), "lacks voice.json or audio.wav"),
        "not a zip": (b"PK\x03\x04 but not really a zip", "not a zip"),
        "empty zip": (_zip({}), "no voices"),
    }


def test_hostile_zips_are_rejected_and_change_nothing(tmp_path, source):
    target = VoiceLibrary(tmp_path / "target")
    keep = target.add(speech_clip(pitch=260, seed=5), name="Keep", consent=CONSENT)
    before = snapshot(target.root)
    files = _bundle(source)
    for label, (data, match) in _hostile_cases(files).items():
        with pytest.raises(VoiceImportError, match=match):
            target.import_zip(data)
        assert snapshot(target.root) == before, label
        assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()
    assert [v.id for v in target.list()] == [keep.id]


def test_import_is_all_or_nothing(tmp_path, source):
    target = VoiceLibrary(tmp_path / "target")
    good = _bundle(source)
    second = VoiceLibrary(tmp_path / "second")
    second.add(speech_clip(pitch=190, seed=6), name="Carol", consent=CONSENT)
    carol = _bundle(second)
    carol_json = next(n for n in carol if n.endswith("voice.json"))
    broken_carol = {**carol, carol_json: b"not json"}
    with pytest.raises(VoiceImportError, match="not valid JSON"):
        target.import_zip(_zip({**good, **broken_carol}))
    assert target.list() == []
    # A name clash with a different voice already in the library rejects the whole bundle too.
    target.add(speech_clip(pitch=330, seed=7), name="carol", consent=CONSENT)
    before = snapshot(target.root)
    with pytest.raises(VoiceImportError, match="already called 'carol'"):
        target.import_zip(_zip({**good, **carol}))
    assert snapshot(target.root) == before


def test_oversized_bundle_and_too_many_entries(tmp_path, source, monkeypatch):
    target = VoiceLibrary(tmp_path / "target")
    monkeypatch.setattr(bundles_mod, "MAX_IMPORT_BYTES", 1000)
    with pytest.raises(VoiceImportError, match=r"MB; the limit is 0 MB"):
        target.import_zip(source.export_zip())
    bundle = tmp_path / "big.zip"
    bundle.write_bytes(b"\0" * 1001)  # not even a zip: the size is refused before the file is read
    with pytest.raises(VoiceImportError, match="the limit is"):
        target.import_zip(bundle)
    monkeypatch.undo()
    many = {f"f{i}/voice.json": b"{}" for i in range(bundles_mod.MAX_IMPORT_VOICES * 4 + 1)}
    with pytest.raises(VoiceImportError, match="files"):
        target.import_zip(_zip(many))
    # One entry over its own limit (64 KiB for voice.json), though the bundle is small and well formed.
    with pytest.raises(VoiceImportError, match="limit"):
        target.import_zip(_zip({"a/voice.json": b" " * (ENTRY_LIMITS["voice.json"] + 1), "a/audio.wav": b"RIFF"}))
    assert target.list() == []


# ---- durability and concurrency -------------------------------------------------------------------

def test_crash_while_adding_loses_nothing(lib, monkeypatch):
    keep = lib.add(speech_clip(), name="Keep", consent=CONSENT, encode=fake_encode())
    before = snapshot(lib.root)
    real_rename = os.rename

    def crash(src, dst, *args, **kwargs):
        if Path(src).parent.name.startswith(".stage-"):
            raise OSError("power cut")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError, match="power cut"):
        lib.add(speech_clip(pitch=240, seed=8), name="New", consent=CONSENT, encode=fake_encode())
    monkeypatch.undo()
    assert [v.id for v in lib.list()] == [keep.id]
    assert snapshot(lib.root) == before  # the temp directory was cleaned up as well


def test_leftovers_of_a_real_crash_are_invisible_and_swept(lib):
    keep = lib.add(speech_clip(), name="Keep", consent=CONSENT)
    # What a process killed mid-write leaves: a full temp voice, a half-deleted voice, a temp json.
    half = lib.root / ".tmp-0123"
    shutil.copytree(keep.path, half)
    shutil.copytree(keep.path, lib.root / ".stage-0123" / "v_0123456789abcdef")  # staged, never committed
    shutil.copytree(keep.path, lib.root / ".trash-4567")
    (keep.path / ".voice-89ab.tmp").write_text("{")
    assert [v.id for v in lib.list()] == [keep.id]
    reopened = VoiceLibrary(lib.root)
    assert sorted(p.name for p in reopened.root.iterdir()) == [".lock", keep.id]
    assert sorted(p.name for p in keep.path.iterdir()) == ["audio.wav", "voice.json"]
    assert reopened.get("keep") == keep


def test_a_committed_write_interrupted_by_a_crash_is_completed_on_open(lib, tmp_path):
    keep = lib.add(speech_clip(), name="Keep", consent=CONSENT)
    other = VoiceLibrary(tmp_path / "other").add(speech_clip(pitch=280, seed=11), name="Second", consent=CONSENT)
    # A crash after the commit mark, with one voice renamed into place and one still staged.
    stage = lib.root / ".stage-89ab"
    stage.mkdir()
    shutil.move(keep.path, stage / keep.id)
    shutil.copytree(other.path, stage / other.id)
    (stage / "COMMIT").write_text(f"{keep.id}\n{other.id}")
    shutil.move(stage / keep.id, keep.path)
    reopened = VoiceLibrary(lib.root)
    assert sorted(v.name for v in reopened.list()) == ["Keep", "Second"]
    assert sorted(p.name for p in reopened.root.iterdir()) == sorted([".lock", keep.id, other.id])


def test_crash_while_updating_or_deleting_keeps_the_voice(lib, monkeypatch):
    voice = lib.add(speech_clip(), name="Stay", transcript="Words.", consent=CONSENT)
    before = snapshot(lib.root)

    def crash(*args, **kwargs):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        lib.update("stay", name="Gone", transcript="Other words.")
    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError):
        lib.delete("stay")
    monkeypatch.undo()
    assert snapshot(lib.root) == before
    assert lib.get("stay") == voice


def test_crash_during_a_multi_voice_import_rolls_back(tmp_path, source, monkeypatch):
    source.add(speech_clip(pitch=280, seed=11), name="Second", consent=CONSENT)
    data = source.export_zip()
    target = VoiceLibrary(tmp_path / "target")
    real_rename = os.rename
    renamed = []

    def crash_second(src, dst, *args, **kwargs):
        if Path(src).parent.name.startswith(".stage-"):
            if renamed:
                raise OSError("power cut")
            renamed.append(dst)
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", crash_second)
    with pytest.raises(OSError):
        target.import_zip(data)
    monkeypatch.undo()
    assert renamed and target.list() == []
    assert sorted(p.name for p in target.root.iterdir()) == [".lock"]


def _race(n: int, work) -> list:
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return results


def test_threads_adding_at_once_all_land(lib):
    libs = [VoiceLibrary(lib.root) for _ in range(4)]
    made = _race(4, lambda i: libs[i].add(speech_clip(pitch=120 + 40 * i, seed=i), name=f"V{i}", consent=CONSENT,
                                          encode=fake_encode()))
    assert sorted(v.name for v in lib.list()) == ["V0", "V1", "V2", "V3"]
    assert len({v.id for v in made}) == 4


def test_threads_adding_the_same_voice_get_one(lib):
    made = _race(4, lambda i: lib.add(speech_clip(), name="Same", transcript="Hi.", consent=CONSENT))
    assert len(lib.list()) == 1 and len({v.id for v in made}) == 1


def test_the_same_voice_saved_by_another_thread_meanwhile_is_no_name_clash(lib, monkeypatch):
    # The interleaving the race above can hit: this add looked for its content before the other thread
    # saved it, and checks the name after.
    first = lib.add(speech_clip(), name="Same", transcript="Hi.", consent=CONSENT)
    monkeypatch.setattr(lib, "_by_content", lambda content_hash: None)
    assert lib.add(speech_clip(), name="Same", transcript="Hi.", consent=CONSENT).id == first.id
    assert len(lib.list()) == 1
    with pytest.raises(VoiceError, match="already called"):  # different content under that name still clashes
        lib.add(speech_clip(pitch=300), name="Same", transcript="Hi.", consent=CONSENT)


def test_processes_adding_at_once_all_land(lib, tmp_path):
    # Each process gets ready, waits for the same go signal, then both add the same voice and three of
    # their own: only the fcntl lock orders them (the thread lock is per process).
    go = tmp_path / "go"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from studio.voices import VoiceLibrary, Consent\n"
        "from tests.helpers import speech_clip\n"
        "lib = VoiceLibrary(sys.argv[1]); k = int(sys.argv[2])\n"
        "clips = [speech_clip(pitch=100 + 30 * (3 * k + j), seed=10 * k + j) for j in range(3)]\n"
        "same = speech_clip()\n"
        "print('ready', flush=True)\n"
        "while not Path(sys.argv[3]).exists():\n"
        "    time.sleep(0.005)\n"
        "lib.add(same, name='Same', consent=Consent('me'))\n"
        "for j, c in enumerate(clips):\n"
        "    lib.add(c, name=f'P{k}-{j}', consent=Consent('me'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(lib.root), str(k), str(go)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == b"ready", p.stderr.read().decode()[-2000:]
        go.touch()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err.decode()[-2000:]
    finally:
        for p in procs:
            p.kill()
    names = sorted(v.name for v in lib.list())
    assert names == ["P0-0", "P0-1", "P0-2", "P1-0", "P1-1", "P1-2", "Same"]


# ---- Higgs preset folders and storage location ----------------------------------------------------

def _write_preset_dir(folder: Path, entries: dict[str, tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    config = {}
    for i, (name, (audio_file, transcript)) in enumerate(entries.items()):
        rate, samples = speech_clip(pitch=130 + 50 * i, seed=20 + i)
        target = folder / audio_file
        if target.parent == folder or target.parent.exists():
            sf.write(target, samples, rate)
        config[name] = {"transcript": transcript, "audio_file": audio_file}
    (folder / "config.json").write_text(json.dumps(config))


def test_import_higgs_preset_dir(lib, tmp_path):
    folder = tmp_path / "voice_examples"
    _write_preset_dir(folder, {"belinda": ("belinda.wav", "Twas the night before my birthday."),
                               "broom_salesman": ("broom_salesman.wav", "I would imagine so.")})
    calls: list[int] = []
    made = lib.import_higgs_preset_dir(folder, consent=CONSENT, encode=fake_encode(calls))
    assert [v.name for v in made] == ["belinda", "broom_salesman"]
    assert lib.get("belinda").transcript == "Twas the night before my birthday."
    assert all(v.has_codes for v in made) and len(calls) == 2
    assert lib.import_higgs_preset_dir(folder, consent=CONSENT) == [lib.get("belinda"), lib.get("broom_salesman")]


def test_bad_higgs_preset_dirs_change_nothing(lib, tmp_path):
    (tmp_path / "secret.wav").write_bytes(b"x")
    before = snapshot(lib.root)
    escape = tmp_path / "escape"
    _write_preset_dir(escape, {"ok": ("ok.wav", "Fine."), "evil": ("../secret.wav", "Nope.")})
    with pytest.raises(VoiceImportError, match="not a file inside"):
        lib.import_higgs_preset_dir(escape, consent=CONSENT)
    silent = tmp_path / "silent"
    _write_preset_dir(silent, {"ok": ("ok.wav", "Fine.")})
    sf.write(silent / "quiet.wav", np.zeros(48000, np.int16), 16000)
    config = json.loads((silent / "config.json").read_text())
    config["quiet"] = {"transcript": "…", "audio_file": "quiet.wav"}
    (silent / "config.json").write_text(json.dumps(config))
    with pytest.raises(VoiceImportError, match="'quiet'.*silent"):
        lib.import_higgs_preset_dir(silent, consent=CONSENT)
    with pytest.raises(VoiceImportError, match="consent"):
        lib.import_higgs_preset_dir(silent, consent=None)
    with pytest.raises(VoiceImportError, match="No config.json"):
        lib.import_higgs_preset_dir(tmp_path / "nowhere", consent=CONSENT)
    assert snapshot(lib.root) == before


def test_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("HIGGS_VOICES_DIR", str(tmp_path / "env"))
    assert default_voices_dir() == tmp_path / "env"
    monkeypatch.delenv("HIGGS_VOICES_DIR")
    monkeypatch.setattr(store_mod, "SPACES_DATA", tmp_path)
    assert default_voices_dir() == tmp_path / "higgs-studio" / "voices"
    monkeypatch.setattr(store_mod, "SPACES_DATA", tmp_path / "absent")
    import platformdirs
    assert default_voices_dir() == Path(platformdirs.user_data_dir("higgs-studio")) / "voices"


def test_preset_cache_root_follows_the_same_rule_in_the_cache_directory(monkeypatch, tmp_path):
    from studio.voices.presets import default_cache_root

    monkeypatch.setenv("HIGGS_PRESETS_CACHE", str(tmp_path / "env"))
    assert default_cache_root() == tmp_path / "env"
    monkeypatch.delenv("HIGGS_PRESETS_CACHE")
    monkeypatch.setattr(store_mod, "SPACES_DATA", tmp_path)
    assert default_cache_root() == tmp_path / "higgs-studio" / "preset-voices"
    monkeypatch.setattr(store_mod, "SPACES_DATA", tmp_path / "absent")
    import platformdirs
    assert default_cache_root() == Path(platformdirs.user_cache_dir("higgs-studio")) / "preset-voices"


# ---- a zipped Higgs preset folder, and importing a voice the library has -----------------------------------

def _preset_zip(tmp_path: Path, entries: dict[str, tuple[str, str]], *, inside: str = "voice_examples/") -> bytes:
    folder = tmp_path / "zipped-preset"
    _write_preset_dir(folder, entries)
    return _zip({inside + path.name: path.read_bytes() for path in sorted(folder.iterdir())})


@pytest.mark.parametrize("inside", ["voice_examples/", ""])
def test_a_zipped_higgs_preset_folder_is_imported(lib, tmp_path, inside):
    data = _preset_zip(tmp_path, {"belinda": ("belinda.wav", "Twas the night before my birthday."),
                                  "broom_salesman": ("broom_salesman.wav", "I would imagine so.")}, inside=inside)
    made = lib.import_zip(data)
    assert [v.name for v in made] == ["belinda", "broom_salesman"]
    assert lib.get("belinda").transcript == "Twas the night before my birthday."
    assert "preset folder" in lib.get("belinda").consent.statement
    assert lib.import_zip(data) == made  # the same content again: the voices saved, left as they are


def test_a_zipped_preset_folder_that_names_a_missing_clip_changes_nothing(lib, tmp_path):
    folder = tmp_path / "p"
    _write_preset_dir(folder, {"ok": ("ok.wav", "Fine.")})
    config = {"ok": {"transcript": "Fine.", "audio_file": "ok.wav"}, "gone": {"audio_file": "gone.wav"}}
    before = snapshot(lib.root)
    with pytest.raises(VoiceImportError, match="'gone'.*not in the zip"):
        lib.import_zip(_zip({"config.json": json.dumps(config).encode(), "ok.wav": (folder / "ok.wav").read_bytes()}))
    assert snapshot(lib.root) == before


def test_a_visitors_import_names_a_preset_folder_for_the_owner():
    from studio.voices.bundles import stage_zip

    with pytest.raises(VoiceImportError, match="owner can import it"):
        stage_zip(_zip({"config.json": b"{}", "a.wav": b"RIFF"}))


def test_importing_a_voice_of_a_taken_name_keeps_both_and_overwrites_nothing(tmp_path, source):
    target = VoiceLibrary(tmp_path / "target")
    mine = target.add(speech_clip(pitch=330, seed=7), name="alice", consent=CONSENT)
    before = snapshot(target.root)
    with pytest.raises(VoiceImportError, match="already called 'alice'"):  # the library's default: refused
        target.import_zip(source.export_zip())
    assert snapshot(target.root) == before
    (theirs,) = target.import_zip(source.export_zip(), keep_both=True)
    assert theirs.name == "Alice (2)" and theirs.id != mine.id
    assert target.get(mine.id).name == "alice" and target.get(mine.id).content_hash == mine.content_hash
    # A voice edited here since it was exported keeps its id; the old export comes in beside it.
    target.update(theirs.id, transcript="Edited here.")
    (old,) = target.import_zip(source.export_zip(), keep_both=True)
    assert old.name == "Alice (3)" and old.id != theirs.id and target.get(theirs.id).transcript == "Edited here."
