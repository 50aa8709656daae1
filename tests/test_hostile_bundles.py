"""Hostile voice bundles and a visitor's exports: a bundle is refused for its names, structure and counts before
any audio is inflated, each member is cut off at its kind's cap, and a visitor's exports are few, bounded and
short-lived. Rows 9 and 10 run against one studio started as a Space starts (an owner's key, a public page,
private voices), where an anonymous visitor imports and exports through the page's events."""

from __future__ import annotations

import io
import json
import os
import struct
import time
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.config import FULL_SIZE, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.voices import Consent, VoiceImportError
from studio.voices.model import stage_audio
from tests.probes import peak_growth_mb, server_pid

MiB = 2 ** 20


# ---------------------------------------------------------------------------------------------- fixtures

def deflated_zip(members: dict[str, bytes], declare: dict[str, int] | None = None) -> bytes:
    """A ZIP of `members`, each payload deflated once however many names share it: a bundle whose audio
    inflates to 800 MB is built in milliseconds, as `zipfile` would write it. `declare` gives a member a
    false inflated size in its headers (a member that lies about its size)."""
    packed: dict[int, tuple[bytes, int]] = {}
    out, central = io.BytesIO(), io.BytesIO()
    for name, data in members.items():
        if id(data) not in packed:
            z = zlib.compressobj(6, zlib.DEFLATED, -15)
            packed[id(data)] = (z.compress(data) + z.flush(), zlib.crc32(data))
        raw, crc = packed[id(data)]
        offset, encoded = out.tell(), name.encode()
        head = (20, 0, 8, 0, 0x21, crc, len(raw), (declare or {}).get(name, len(data)), len(encoded))
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, *head, 0) + encoded + raw)
        central.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *head, 0, 0, 0, 0, 0o100644 << 16,
                                  offset) + encoded)
    entries, size = len(members), central.tell()
    return out.getvalue() + central.getvalue() + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, entries, entries,
                                                             size, out.tell(), 0)


def zero_clips_bundle(folders: int, clip_bytes: int) -> bytes:
    """The hostile bundle: `folders` folders, each an `audio.wav` of `clip_bytes` zero bytes."""
    zeros = bytes(clip_bytes)
    return deflated_zip({f"voice{i:03d}/audio.wav": zeros for i in range(folders)})


def browser_entries(count: int) -> list[dict]:
    """`count` valid entries of a visitor's browser store (studio.voices.private), each a distinct 1 s voice."""
    from studio.voices.private import to_browser

    entries = []
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    for i in range(count):
        tone = (0.3 * np.sin(2 * np.pi * (150 + 20 * i) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)))
        staged = stage_audio((SAMPLE_RATE, tone.astype(np.float32)), name=f"Voice {i}", transcript="a line",
                             consent=Consent("Test Runner", "This is my own voice."))
        frames = len(staged.pcm) // SAMPLES_PER_FRAME
        staged.codes = np.random.default_rng(i).integers(0, FULL_SIZE.codebook_size,
                                                         (frames, FULL_SIZE.codebooks)).astype(np.int16)
        entries.append(to_browser(f"v_{staged.content_hash[:16]}", staged))
    return json.loads(json.dumps(entries))  # what the browser's localStorage gives back


@pytest.fixture(scope="module")
def space(space_studio):
    """(url, tmp): a studio started as a Space starts; every file it writes lands under `tmp`."""
    return space_studio.url, space_studio.root


def page_events(client: httpx.Client) -> dict[str, int]:
    config = client.get("/config").json()
    return {dep["api_name"]: i for i, dep in enumerate(config["dependencies"]) if dep.get("api_name")}


def run_event(client: httpx.Client, fn_index: int, data: list, session: str | None = None) -> dict:
    """One page event through Gradio's queue, as an anonymous visitor (from the page `session`, else a new
    one): its completion message, with the toasts it showed (`gr.Info`, `gr.Warning`) under "toasts"."""
    session = session or os.urandom(6).hex()
    r = client.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session})
    assert r.status_code == 200, r.text
    toasts = []
    with client.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}, timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "log":
                    toasts.append(message.get("log", ""))
                if message.get("msg") == "process_completed":
                    return {**message, "toasts": toasts}
    raise AssertionError(f"event {fn_index} never completed")


def warning(message: dict) -> str:
    """What the visitor was told: the toasts a handler showed (studio/views/toasts.py), or the event's error."""
    if message.get("success") is False:
        return message["output"]["error"]
    return " ".join(message["toasts"])


def upload(client: httpx.Client, name: str, data: bytes) -> dict:
    r = client.post("/gradio_api/upload", files={"files": (name, data)})
    assert r.status_code == 200, r.text
    return {"path": r.json()[0], "meta": {"_type": "gradio.FileData"}}


# ---------------------------------------------------------------------------------------------- row 9

def test_a_bundle_of_zero_clips_is_refused_before_its_audio_is_inflated():
    """200 folders × 4 MiB of zeros (under 1 MB zipped) used to be inflated whole before a check (+800 MB)."""
    from studio.voices.bundles import stage_zip

    data = zero_clips_bundle(200, 4 * MiB)
    assert len(data) < 1 * MiB
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(VoiceImportError) as refused:
            stage_zip(data)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"\nrefused in {elapsed:.2f} s, peak {peak / MiB:.1f} MiB: {refused.value}")
    assert peak < 16 * MiB and elapsed < 1.0
    assert "voice.json" in str(refused.value)


def test_each_member_stops_at_its_kinds_cap_and_the_refusal_names_it():
    """A clip's cap is one 30 s clip at 48 kHz, 16-bit mono (the row's 4 MiB clip was three 30 s clips), and
    the refusal says it; a member whose directory entry lies about its size is cut off at what it declared."""
    from studio.voices.bundles import ENTRY_LIMITS, stage_zip

    assert 30 * 48_000 * 2 + 44 <= ENTRY_LIMITS["audio.wav"] <= 3 * MiB
    record = json.dumps({"name": "Big", "created": "2026-12-01T00:00:00",
                         "consent": Consent("Test Runner", "This is my own voice.").to_json()}).encode()
    clip = bytes(4 * MiB)
    for declared, said in ((None, "the limit for a voice clip is 3 MB"), (1000, "larger than its directory says")):
        data = deflated_zip({"big/voice.json": record, "big/audio.wav": clip},
                            declare={"big/audio.wav": declared} if declared else None)
        tracemalloc.start()
        try:
            with pytest.raises(VoiceImportError) as refused:
                stage_zip(data)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        print(f"\npeak {peak / MiB:.1f} MiB: {refused.value}")
        assert peak < ENTRY_LIMITS["audio.wav"] + MiB  # the cap, a chunk, the archive
        assert said in str(refused.value) and "big/audio.wav" in str(refused.value)


def test_the_whole_bundle_has_an_inflated_cap(tmp_path, monkeypatch):
    """What a bundle inflates to, every member together, stops at its voices' worth: here two valid 3 s voices
    (288 KB of audio) against a cap made 100 KB a voice."""
    from studio.voices import VoiceLibrary, bundles

    library = VoiceLibrary(tmp_path / "lib")
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    for i, pitch in enumerate((150, 230)):
        tone = 0.3 * np.sin(2 * np.pi * pitch * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
        library.add((SAMPLE_RATE, tone.astype(np.float32)), name=f"Voice {i}", transcript="a line",
                    consent=Consent("Test Runner", "This is my own voice."))
    data = library.export_zip()
    assert len(bundles.stage_zip(data, max_voices=2)) == 2
    monkeypatch.setattr(bundles, "MAX_VOICE_INFLATED", 100 * 2 ** 10)
    with pytest.raises(VoiceImportError) as refused:
        bundles.stage_zip(data, max_voices=2)
    print(f"\n{refused.value}")
    assert "200 KB" in str(refused.value)


def test_a_bundle_file_is_no_larger_than_its_voices_inflate_to(tmp_path):
    """A visitor's bundle (12 voices at most) is refused by its size alone beyond 12 voices' worth, 18 MB, before
    it is read; it used to be read whole up to the library's 256 MB."""
    from studio.voices.bundles import MAX_IMPORT_BYTES, stage_zip
    from studio.voices.private import MAX_PRIVATE_VOICES

    for size, voices, limit in ((19 * MiB, MAX_PRIVATE_VOICES, 18), (MAX_IMPORT_BYTES + 1, None, 256)):
        sparse = tmp_path / f"{size}.zip"
        with open(sparse, "wb") as f:
            f.truncate(size)  # no disk, no memory: only its size is looked at
        tracemalloc.start()
        try:
            with pytest.raises(VoiceImportError, match=f"the limit is {limit} MB"):
                stage_zip(sparse, **({"max_voices": voices} if voices else {}))
            assert tracemalloc.get_traced_memory()[1] < MiB
        finally:
            tracemalloc.stop()


@pytest.mark.slow
def test_a_visitors_hostile_bundle_costs_the_server_nothing(space):
    """The visitor's import of the zero-clip bundle (under 1 MB zipped) used to take 4.3 s and +807 MB of the
    server's memory before a refusal; it is refused for its voice count before any audio is read."""
    url, _ = space
    client = httpx.Client(base_url=url, timeout=120)
    events = page_events(client)
    bundle = upload(client, "voices.zip", zero_clips_bundle(200, 4 * MiB))
    pid = server_pid(url)
    with peak_growth_mb(pid) as growth:
        started = time.perf_counter()
        message = run_event(client, events["_import"], [bundle, []])
        elapsed = time.perf_counter() - started
    text = warning(message)
    print(f"\nimport answered in {elapsed:.2f} s, server peak +{growth['mb']:.0f} MB: {text}")
    assert "at most 12 voices" in text
    assert growth["mb"] < 40 and elapsed < 2.0


def test_checking_a_visitors_bundle_holds_no_place_in_the_gpu_queue():
    """The import used to run in the page's GPU lane (one at a time, shared with saving voices and long takes),
    so checking a hostile bundle kept them waiting (3-7 s). It runs in a lane of its own; only an encode takes
    its turn with generation, through the service."""
    from types import SimpleNamespace

    import gradio as gr

    from studio.views import GPU_QUEUE
    from studio.views.private import PrivateVoicesView
    from studio.voices.private import PrivateVoices

    with gr.Blocks() as demo:
        page = SimpleNamespace(service=SimpleNamespace(voices=None), studio=SimpleNamespace(voice=gr.Dropdown()))
        view = PrivateVoicesView(page, PrivateVoices())
        view.state()
        view.tab()
    lanes = {fn.name: fn.concurrency_id for fn in demo.fns.values()}
    assert lanes["_import"] != GPU_QUEUE


# ---------------------------------------------------------------------------------------------- row 10

def zips_under(root) -> list:
    return [p for p in root.rglob("*.zip") if p.is_file()]


@pytest.mark.slow
def test_a_visitors_exports_are_bounded_and_honour_the_voice_limit(space):
    """Ten exports used to leave twenty zips for good (each written beside the page, then copied into Gradio's
    cache: 8 MiB here, 17 MiB in the report), and an export of any number of voices was written."""
    from studio.voices.exports import VISITOR_EXPORT_BYTES
    from studio.voices.private import MAX_PRIVATE_VOICES

    url, tmp = space
    client = httpx.Client(base_url=url, timeout=120)
    events = page_events(client)
    entries = browser_entries(MAX_PRIVATE_VOICES + 1)
    before = set(zips_under(tmp))
    page = os.urandom(6).hex()
    for _ in range(10):  # one page exports again and again: its latest export is the one kept
        message = run_event(client, events["_export"], [entries[:MAX_PRIVATE_VOICES]], session=page)
        assert message["success"] and not message["toasts"], message
    served = [p for p in zips_under(tmp) if p not in before]
    print(f"\nafter 10 exports from one page: {len(served)} zip(s), "
          f"{sum(p.stat().st_size for p in served) / MiB:.2f} MiB on disk")
    assert len(served) == 1
    path = message["output"]["data"][0]["path"]
    assert served == [Path(path)]  # served from where it was written, not copied
    with zipfile.ZipFile(path) as zf:
        assert len({n.split("/")[0] for n in zf.namelist()}) == MAX_PRIVATE_VOICES
    assert httpx.get(f"{url}/gradio_api/file={path}").status_code == 200

    for _ in range(10):  # ten pages of one visitor: within the visitor's budget together
        assert run_event(client, events["_export"], [entries[:MAX_PRIVATE_VOICES]])["success"]
    served = [p for p in zips_under(tmp) if p not in before]
    total = sum(p.stat().st_size for p in served)
    print(f"after 10 more from 10 pages: {len(served)} zip(s), {total / MiB:.2f} MiB on disk")
    assert total <= VISITOR_EXPORT_BYTES

    message = run_event(client, events["_export"], [entries])  # 13 voices: more than a browser keeps
    text = warning(message)
    assert f"at most {MAX_PRIVATE_VOICES} voices" in text, text
    assert [p for p in zips_under(tmp) if p not in before] == served


def test_an_export_is_removed_when_downloaded_closed_or_old(tmp_path):
    """The shelf of exports: each page's latest, each visitor within a budget, everyone within another; gone
    when downloaded, when the page closes, or after its time (here 2 s)."""
    from studio.voices.exports import ExportShelf

    shelf = ExportShelf(tmp_path, ttl_s=2.0, visitor_bytes=1000, total_bytes=2500)
    first = shelf.put("visitor:a", "page-1", "my-voices.zip", b"x" * 600)
    second = shelf.put("visitor:a", "page-1", "my-voices.zip", b"y" * 700)
    assert not os.path.exists(first) and open(second, "rb").read() == b"y" * 700  # the latest replaces it
    with pytest.raises(ValueError, match="1,000 bytes"):
        shelf.put("visitor:a", "page-1", "my-voices.zip", b"z" * 1001)
    third = shelf.put("visitor:a", "page-5", "my-voices.zip", b"t" * 400)  # another page of the same visitor
    assert not os.path.exists(second) and shelf.held_bytes("visitor:a") == 400  # the oldest made room
    other = shelf.put("visitor:b", "page-2", "my-voices.zip", b"w" * 900)
    fourth = shelf.put("visitor:c", "page-3", "my-voices.zip", b"v" * 1000)
    with pytest.raises(ValueError, match="try again"):
        shelf.put("visitor:d", "page-4", "my-voices.zip", b"u" * 300)  # 2,500 bytes for everyone at once
    assert os.path.exists(third)
    shelf.drop_page("page-2")  # the page that asked for it closed
    assert not os.path.exists(other)
    shelf.fetched("page-5", grace_s=0.0)  # downloaded: gone without waiting for its time
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(third):
        time.sleep(0.01)
    assert not os.path.exists(third) and os.path.exists(fourth)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(tmp_path.rglob("*.zip")):
        time.sleep(0.05)
    assert not list(tmp_path.rglob("*.zip")) and not [p for p in tmp_path.iterdir() if p.is_dir()]
